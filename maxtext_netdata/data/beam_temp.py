"""What both Beam runners (`prepare --runner beam`, `ingest --runner beam`) need of the
process around a pipeline: its temporary files kept in a folder of their own."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile


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
