"""What `bench --maxtext`'s fork server imports before it forks MaxText training runs.

MaxText's trainer takes ~10 s to import on a 2-core VM (its model zoo, transformers,
tokamax): more than a tiny model's whole run. bench runs two trainings (synthetic data, then
the configured data) besides its own loading measurement, each in a fresh process; forked from
a server that imported the trainer once, each starts at once. The import's chatter (stub
notices, transformers' warnings) stays off the terminal, where bench's own import has printed
it already; an import that fails here is left for the run itself, which imports again and
says why in its log.
"""

from __future__ import annotations

import contextlib
import os
import sys


@contextlib.contextmanager
def _quiet():
  """stdout and stderr (the file descriptors, so C code's writes too) to /dev/null within."""
  sys.stdout.flush()
  sys.stderr.flush()
  saved = [os.dup(1), os.dup(2)]
  null = os.open(os.devnull, os.O_WRONLY)
  try:
    os.dup2(null, 1)
    os.dup2(null, 2)
    yield
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    for fd in (*saved, null):
      os.close(fd)


with _quiet(), contextlib.suppress(Exception):
  import maxtext.trainers.pre_train.train  # noqa: F401
