"""Stores of the format before this one, converted instead of built again from the raw files.

Store format 4 differs from format 3 in one file: a split's `seconds.npy` holds uint32
instead of int64 (docs/prepare.md, "Seconds in four bytes"); every other array is the same
bytes, since the rows, their order and the destination table are the same. RIPE's month is
~35 billion rows: building it again reads ~1 TB of raw files and sorts them, where a
conversion reads the seconds (8 bytes a row) and writes them again (4). So when `prepare`
finds no store of the current fingerprint, a format-3 store of the same content (the same
content key but for the format) is converted first:

- the one of exactly the current files and time bounds becomes the store asked for;
- otherwise the one `append.find_base` would take as a base is converted into the format-4
  store of its own files, which the update then starts from (a day appended to last
  month's store keeps working across the format change).

Each other file is hard-linked (copied where the filesystem cannot link: `merge.link_file`),
so the conversion adds 4 bytes a row of disk and the old store stays readable by the code
that wrote it. A base is converted under the lock a build of its store would hold. A store
with a time outside 1970 ... 2106-02-07 06:28:15 UTC (format 3 took them; format 4 does not)
is not converted: the build reads the files, whose such rows are bad rows now.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import time
import uuid

import numpy as np
import tqdm

from maxtext_netdata.data import remote
from maxtext_netdata.data.prepare import append, merge, naming
from maxtext_netdata.data.store import store
from maxtext_netdata.errors import WritesTo

FORMER = 3  # the format this code converts
_CHUNK_ROWS = 1 << 24  # seconds converted at a time: 192 MiB of buffers


def upgrade(
  prepared_dir: str,
  out: str,
  content: dict,
  train_files: list[remote.FileEntry],
  bounds: tuple,
  *,
  progress: bool,
) -> dict | None:
  """The format-3 store in `prepared_dir` of the current content (`content`: the
  description `naming.description` gives, of format 4), files and time `bounds`, converted
  into the folder `out`: its summary (`out` holds all but the summary's file). Failing
  such a store, the one `append.find_base` would take is converted into the format-4 store
  of its own files, beside it; None. None too for a store holding a time that format 4 does
  not keep (said on stderr).
  """
  former_key = naming.digest({**content, "format_version": FORMER})
  current = {tuple(e) for e in append.entries(train_files)}
  for root, held, summary in append.stores(prepared_dir, former_key, FORMER):
    if held == current and append.bounds_of(summary) == tuple(bounds):
      return _converted(root, summary, out, content, progress)
  base = append.find_base(prepared_dir, former_key, train_files, bounds, version=FORMER)
  if not base:
    return None
  entries, base_bounds = base.summary["train_file_entries"], append.bounds_of(base.summary)
  fp = naming.fingerprint_of(content, entries, base_bounds)
  target = os.path.join(prepared_dir, fp)
  with naming.builder_lock(prepared_dir, fp, progress):  # as a build of that store would
    if os.path.exists(os.path.join(target, store.META_FILE)):
      return None  # converted already (by the process this one waited for)
    for stale in glob.glob(os.path.join(glob.escape(prepared_dir), f".tmp-{fp}-*")):
      shutil.rmtree(stale, ignore_errors=True)  # a killed conversion's or build's
    tmp = os.path.join(prepared_dir, f".tmp-{fp}-{uuid.uuid4().hex[:8]}")
    try:
      summary = _converted(base.root, base.summary, tmp, content, progress)
      if summary is not None:
        store.write_json(os.path.join(tmp, store.META_FILE), summary)
        if os.path.isdir(target):
          shutil.rmtree(target)  # the remains of an interrupted build: no summary
        os.rename(tmp, target)
    finally:
      shutil.rmtree(tmp, ignore_errors=True)
  return None


def _converted(root: str, summary: dict, out: str, content: dict, progress: bool) -> dict | None:
  """The format-3 store `root` (of `summary`) converted into `out`, all but the summary's
  file; the summary, or None (said on stderr) if it holds a time format 4 does not keep."""
  fp = naming.fingerprint_of(content, summary["train_file_entries"], append.bounds_of(summary))
  began = time.perf_counter()
  if not _convert(root, out, fp, progress):
    if progress:
      print(
        f"prepare: {root} (store format {FORMER}) holds a time before 1970 or after"
        " 2106-02-07 06:28:15 UTC, which format 4 does not keep: building in full",
        file=sys.stderr,
      )
    return None
  return {
    **summary,
    "format_version": store.FORMAT_VERSION,
    "fingerprint": fp,
    "content_key": naming.digest(content),
    "converted_from": {
      "path": root,
      "format_version": FORMER,
      "seconds": round(time.perf_counter() - began, 3),
    },
  }


def _convert(root: str, out: str, fp: str, progress: bool) -> bool:
  """The format-3 store `root` as a format-4 store in `out` (all but its summary); False,
  and `out` removed, if a second is outside what uint32 keeps. Every split's seconds are
  converted before any file is linked: a folder left with links in it would be written
  through them by the build that follows, into the old store's files."""
  splits = sorted(
    name for name in os.listdir(root) if os.path.isfile(os.path.join(root, name, store.META_FILE))
  )
  rows = sum(_meta(os.path.join(root, name))["num_rows"] for name in splits)
  bar = tqdm.tqdm(
    total=rows,
    desc=f"prepare: converting store format {FORMER}",
    unit="row",
    unit_scale=True,
    disable=not progress,
  )
  with bar:
    for name in splits:
      os.makedirs(os.path.join(out, name), exist_ok=True)
      if not _seconds(*(os.path.join(at, name, "seconds.npy") for at in (root, out)), bar):
        shutil.rmtree(out, ignore_errors=True)
        return False
  for name in splits:
    source, split = os.path.join(root, name), os.path.join(out, name)
    for entry in sorted(os.listdir(source)):
      path = os.path.join(source, entry)
      if entry in ("seconds.npy", store.META_FILE) or not os.path.isfile(path):
        continue  # plans/ too: a plan is made again by the first run that needs it
      merge.link_file(path, os.path.join(split, entry))
    store.write_json(
      os.path.join(split, store.META_FILE),
      {**_meta(source), "format_version": store.FORMAT_VERSION, "fingerprint": fp},
    )
  return True


def _seconds(source: str, target: str, bar) -> bool:
  """The int64 `source` written as uint32 to `target`, a chunk at a time; False (and
  nothing more written) at the first second outside 0 ... SECONDS_MAX."""
  seconds = np.load(source, mmap_mode="r")
  assert seconds.dtype == np.int64 and seconds.ndim == 1, (source, seconds.dtype)
  header = {"descr": "<u4", "fortran_order": False, "shape": seconds.shape}
  with WritesTo(target), open(target, "wb") as f:
    np.lib.format.write_array_header_1_0(f, header)
    for lo in range(0, len(seconds), _CHUNK_ROWS):
      try:
        chunk = store.seconds_for_file(seconds[lo : lo + _CHUNK_ROWS])
      except ValueError:  # outside 0 ... SECONDS_MAX
        return False
      f.write(chunk.view(np.uint8))
      bar.update(len(chunk))
  return True


def _meta(split: str) -> dict:
  """A split folder's `meta.json` (read as is: `PreparedStore` opens this format only)."""
  with open(os.path.join(split, store.META_FILE), encoding="utf-8") as f:
    return json.load(f)
