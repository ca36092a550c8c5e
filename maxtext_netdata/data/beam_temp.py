"""What both Beam runners (`prepare --runner beam`, `ingest --runner beam`) need of the
process around a pipeline: its temporary files kept in a folder of their own
(`temporary_files_in`), Beam's notices that say nothing to our users dropped (`quiet_notices`,
before Beam is imported) and an interrupt in a step raised as itself (`interrupts_as_such`)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile


class _Notices(logging.Filter):
  """Drops, of Beam's log records: the warning its import logs where BigQuery's client is not
  installed (we use none), and the traceback it logs for an interrupt raised in a step before
  re-raising it (`interrupts_as_such`)."""

  def filter(self, record: logging.LogRecord) -> bool:
    if record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt):
      return False
    return not str(record.msg).startswith("apitools not found")


_NOTICES = _Notices()


def quiet_notices() -> None:
  """`_Notices` on the loggers Beam logs them to (the root logger's own records only: another
  logger's records that reach the root's handlers are not filtered there)."""
  for name in ("", "apache_beam.runners.common"):
    logger = logging.getLogger(name)
    if _NOTICES not in logger.filters:
      logger.addFilter(_NOTICES)


@contextlib.contextmanager
def interrupts_as_such():
  """An interrupt (Ctrl-C; SIGTERM, as `signals.Terminated`) in a step the DirectRunner runs in
  this process leaves the block as itself. Beam raises it again as a RuntimeError
  ("KeyboardInterrupt [while running 'step']"), which the command line would show with two
  tracebacks and exit status 1; as itself it ends the command in one line (status 130 or
  143)."""
  try:
    yield
  except Exception as error:
    cause: BaseException | None = error
    for _ in range(8):  # Beam's chain: RuntimeError, then the interrupt it was handling
      cause = cause.__cause__ or cause.__context__
      if cause is None or isinstance(cause, KeyboardInterrupt):
        break
    if isinstance(cause, KeyboardInterrupt):
      raise cause from None
    raise


@contextlib.contextmanager
def temporary_files_in(folder: str):
  """Python's temporary files and folders made in `folder` while the pipeline runs, and
  removed with it.

  Beam's DirectRunner first tries to start Prism, making a folder in the system's temporary
  directory, which it leaves behind when Prism cannot start (no network to download it
  from): one `beam-temp*` folder a run. `tempfile` is the process's, so this holds only while
  nothing else in the process makes temporary files it means to keep (the `prepare` and
  `ingest` commands).
  """
  os.makedirs(folder, exist_ok=True)
  saved, tempfile.tempdir = tempfile.tempdir, folder
  try:
    yield
  finally:
    tempfile.tempdir = saved
    shutil.rmtree(folder, ignore_errors=True)
