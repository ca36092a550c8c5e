"""How a folder of raw parquet is laid out by the two commands that write one, `generate` and
`ingest` (docs/spec.md §1): file names, the completion marker, row groups and the failed-RTT
value.

A local writer writes `pings-00000-of-0000N.parquet` ... in a folder of its own inside the
output folder (`staged`), then puts them in place of an earlier run's outputs and writes the
`.complete` marker last (`publish`): a run that fails leaves the earlier run's files as they
were, and a folder without the marker is an interrupted run, never a dataset.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator

from maxtext_netdata.data import file_lock
from maxtext_netdata.errors import UserError, WritesTo

COMPLETE_MARKER = ".complete"
FILE_PATTERN = "pings-{:05d}-of-{:05d}.parquet"
ROW_GROUP_SIZE = 32_768  # rows per row group of `ingest`'s files
FAILED_RTT = -1.0  # the `rtt` of a measurement that got no reply


def clear_outputs(out_dir: str) -> None:
  """Remove the marker, then the shard files, of an earlier run in `out_dir`."""
  marker = os.path.join(out_dir, COMPLETE_MARKER)
  if os.path.exists(marker):
    os.remove(marker)
  for name in os.listdir(out_dir):
    if name.startswith("pings-") and name.endswith((".parquet", ".json")):
      os.remove(os.path.join(out_dir, name))


def write_complete_marker(out_dir: str, content: dict) -> None:
  """The `.complete` marker of `out_dir`, JSON `content`, written whole or not at all (a
  rename): the last write of a run, after which the folder is a dataset."""
  marker = os.path.join(out_dir, COMPLETE_MARKER)
  try:
    with WritesTo(marker), open(marker + ".tmp", "w", encoding="utf-8") as f:
      json.dump(content, f)
    os.replace(marker + ".tmp", marker)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(marker + ".tmp")
    raise


STAGING_PREFIX = ".staging-"  # a run's own folder inside the output folder (`staged`)
WRITING_LOCK = ".writing"  # held by the run writing the output folder (`staged`)


@contextlib.contextmanager
def staged(out_dir: str) -> Iterator[str]:
  """A new folder inside `out_dir` (created if need be) for a run's files until `publish`
  puts them in place: an earlier run's files stay whole while it runs. The folder is removed
  when the block ends, however it ends.

  One run at a time writes `out_dir`: it holds `out_dir/.writing` (`data.file_lock`) and
  another is refused. Holding it, the run removes the staging folders a killed run left
  (SIGKILL, a lost machine): no live run has one. Where the filesystem has no locks, the run
  goes on without one and removes no other folder.

  Raises:
    UserError: `out_dir` cannot be made a folder, or another run is writing it.
  """
  make_folder(out_dir)

  def busy() -> None:
    raise UserError(
      f"{out_dir}: another run is writing this folder; wait for it to end or write elsewhere"
    )

  with contextlib.ExitStack() as stack:
    try:
      stack.enter_context(file_lock.held(os.path.join(out_dir, WRITING_LOCK), busy))
      locked = True
    except OSError as e:  # a filesystem without locks (NFSv3 without lockd): no lock, no cleanup
      if e.errno not in file_lock.NO_LOCKS:
        raise
      locked = False
    for name in os.listdir(out_dir) if locked else []:
      if name.startswith(STAGING_PREFIX):
        shutil.rmtree(os.path.join(out_dir, name), ignore_errors=True)
    staging = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out_dir)
    try:
      yield staging
    finally:
      shutil.rmtree(staging, ignore_errors=True)


def make_folder(path: str) -> None:
  """Folder `path`, made with its parents where missing; a UserError in one line naming it
  where it cannot be one (a file, no permission, an empty path)."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise UserError(f"{path}: not a folder; the output needs a folder")
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    cause = e.strerror or str(e)
    raise UserError(
      f"{path or repr(path)}: cannot make the output folder: {cause[:1].lower()}{cause[1:]}"
    ) from None


def publish(staging: str, out_dir: str, names: list[str], content: dict) -> list[str]:
  """The files `names` written in `staging` (`staged`) moved into `out_dir` in place of an
  earlier run's outputs, then the marker of JSON `content`: their paths; `staging` is removed
  either way. From the earlier marker's removal to the new one's write `out_dir` holds no
  dataset; a failure there (a full disk at the marker) removes the outputs: no dataset rather
  than a mix of two runs."""
  try:
    clear_outputs(out_dir)
    paths = []
    for name in names:
      paths.append(os.path.join(out_dir, name))
      os.replace(os.path.join(staging, name), paths[-1])
    write_complete_marker(out_dir, content)
  except BaseException:
    with contextlib.suppress(OSError):
      clear_outputs(out_dir)
    raise
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return paths
