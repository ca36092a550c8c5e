"""Reading a store larger than memory ahead of its batches (data/store/read_ahead.py and
`BatchBuilder.read_ahead`): the rows asked for are every row a batch reads, and asking brings
their pages into page cache."""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import time

import numpy as np
import pytest

from maxtext_netdata.data.store import read_ahead
from maxtext_netdata.data.store.store import PreparedStore
from maxtext_netdata.input_pipeline.sequences import (
  FILLERS,
  INPUT_KEYS,
  READ_AHEAD_STEPS,
)
from tests.helpers import pipeline

ROW_NAMES = ("dst_index", "seconds", "rtt_bytes")


builder = pipeline.builder


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
  path = tmp_path_factory.mktemp("read_ahead") / "train"
  pipeline.write_store(str(path), probes=300)
  return path


def test_page_runs_are_the_pages_of_the_rows_merged():
  array = np.zeros((5000, 16), np.uint8)  # 80,000 bytes over ~20 pages
  starts = np.array([4000, 10, 0, 300, 2000, 2001])
  stops = np.array([4001, 20, 5, 700, 2003, 2002])
  runs = read_ahead.page_runs(array, starts, stops)
  page = mmap.PAGESIZE
  want = set()
  for start, stop in zip(starts, stops, strict=True):
    first = (array.ctypes.data + start * 16) // page
    last = (array.ctypes.data + stop * 16 - 1) // page
    want.update(range(first, last + 1))
  got = [set(range(a // page, -(-(a + n) // page))) for a, n in runs.tolist()]
  assert set().union(*got) == want
  assert sum(len(g) for g in got) == len(want)  # no page asked for twice
  assert all(a % page == 0 for a, _ in runs.tolist())
  assert len(runs) < len(starts)  # rows 0-5, 10-20 and 300-700 share pages: merged
  assert read_ahead.page_runs(array, starts[:0], stops[:0]).shape == (0, 2)


@pytest.mark.parametrize("packing", [True, False])
def test_a_batch_reads_no_store_row_outside_those_context_rows_names(store_path, tmp_path, packing):
  original = PreparedStore(store_path)
  b = builder(original, packing=packing)
  step = 2
  rows = b.gather(step, 0, 8)
  want = {key: array.copy() for key, array in b.build(rows).items()}
  asked = np.zeros(original.num_rows, bool)
  for start, stop in zip(*(a.tolist() for a in b.context_rows(rows, FILLERS)), strict=True):
    asked[start:stop] = True
  assert 0 < asked.mean() < 0.5
  # read ahead: all of them but the fillers after the first (rows seldom take those)
  first = np.zeros_like(asked)
  for start, stop in zip(*(a.tolist() for a in b.context_rows(rows)), strict=True):
    first[start:stop] = True
  assert (asked >= first).all() and (packing or (asked == first).all())

  # A copy whose rows outside those asked for are all changed: the same batch, bit for bit,
  # only if the batch reads none of them. The probes' counts are kept, so is the plan.
  copy = tmp_path / "train"
  shutil.copytree(store_path, copy, ignore=shutil.ignore_patterns("plans"))
  for name, counts in zip(
    ("probe_failed", "probe_long_gaps"), original.probe_counts(), strict=True
  ):
    np.save(copy / f"{name}.npy", np.asarray(counts, np.int64))
  other = ~asked
  for name in ROW_NAMES:
    array = np.load(copy / f"{name}.npy", mmap_mode="r+")
    if name == "dst_index":  # another destination of the table
      array[other] = (array[other] + 7) % len(original.dst_table)
    else:
      array[other] = array[other] + 7
    array.flush()
    del array
  changed = builder(PreparedStore(copy), packing=packing)
  got = changed.build(changed.gather(step, 0, 8))
  for key in INPUT_KEYS:
    assert (got[key] == want[key]).all(), key
  # and the batches around it, which read the changed rows, differ
  assert any(
    (changed.build(changed.gather(s, 0, 8))["inputs"] != b.build(b.gather(s, 0, 8))["inputs"]).any()
    for s in (step - 1, step + 1)
  )


_LIBC = ctypes.CDLL(None, use_errno=True)


def resident_share(array: np.ndarray, starts, stops) -> float:
  """Share of the pages of rows [starts, stops) of `array` in page cache (mincore)."""
  page = mmap.PAGESIZE
  pages = resident = 0
  for address, size in read_ahead.page_runs(array, starts, stops).tolist():
    vector = (ctypes.c_ubyte * (-(-size // page)))()
    assert _LIBC.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vector) == 0
    pages += len(vector)
    resident += sum(v & 1 for v in vector)
  return resident / pages


def drop_from_page_cache(folder) -> None:
  for name in os.listdir(folder):
    if name.endswith(".npy"):
      fd = os.open(os.path.join(folder, name), os.O_RDONLY)
      try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
      finally:
        os.close(fd)


def test_a_store_read_at_random_has_the_next_batches_rows_read_ahead(store_path):
  store = PreparedStore(store_path, "random")
  b = builder(store)
  batches = [b._rows(s, 0, 8) for s in range(1, READ_AHEAD_STEPS + 1)]
  ranges = [b.context_rows(rows) for rows in batches]
  starts, stops = (np.concatenate(parts) for parts in zip(*ranges, strict=True))
  arrays = [getattr(store, name) for name in ROW_NAMES]
  drop_from_page_cache(store_path)
  before = min(resident_share(a, starts, stops) for a in arrays)
  if before == 1.0:
    pytest.skip("this file system keeps the store's pages in memory (tmpfs?)")

  b.gather(0, 0, 8)  # asks for batches 1 .. READ_AHEAD_STEPS on the read-ahead thread
  deadline = time.monotonic() + 30
  while time.monotonic() < deadline:
    if b._reader.done and min(resident_share(a, starts, stops) for a in arrays) == 1.0:
      break
    time.sleep(0.05)
  assert b._reader.done == 1 and b._reader.error is None
  assert [resident_share(a, starts, stops) for a in arrays] == [1.0] * len(arrays)
  # nothing is asked for twice: the next batch asks for one more batch's rows only
  assert b._read_ahead_next(1, 0, 8) == [READ_AHEAD_STEPS + 1]


def test_a_worker_reads_ahead_the_batches_it_builds(store_path):
  # Grain's worker 1 of 3 builds batches 1, 4, 7, ...: it asks for those, each once.
  b = builder(PreparedStore(store_path, "random"))
  assert b._read_ahead_next(1, 0, 8) == [2, 3, 4, 5]  # no gap seen yet: the next ones
  assert b._read_ahead_next(4, 0, 8) == [7, 10, 13, 16]
  assert b._read_ahead_next(7, 0, 8) == [19]
  assert b._read_ahead_next(10, 0, 8) == [22]
  # a new iterator from an earlier step starts again (its gap to step 1 makes the stride 1)
  assert b._read_ahead_next(0, 0, 8) == [1, 2, 3, 4]
  # and the last batch of the run is the last asked for
  last = b.num_steps - 1
  assert b._read_ahead_next(last - 2, 0, 8) == [last - 1, last]


def test_read_ahead_changes_no_batch(store_path):
  normal, randomly = (builder(PreparedStore(store_path, access)) for access in ("normal", "random"))
  for step in range(6):
    want, got = (b.build_shifted(b.gather(step, 2, 7)) for b in (normal, randomly))
    assert all((got[key] == want[key]).all() for key in want)
  assert randomly._reader.error is None and randomly._asked[(2, 7)] == 5 + READ_AHEAD_STEPS


def test_a_store_read_normally_is_not_read_ahead(store_path):
  b = builder(PreparedStore(store_path, "normal"))
  b.gather(0, 0, 8)
  assert b._reader is None and not b._asked


def wait_for(condition, seconds: float = 10.0) -> bool:
  deadline = time.monotonic() + seconds
  while not condition() and time.monotonic() < deadline:
    time.sleep(0.01)
  return condition()


def test_the_read_ahead_thread_ends_when_idle_and_survives_a_failing_job(caplog):
  reader = read_ahead.ReadAhead(idle_s=0.2)
  ran = []
  reader.submit(lambda: 1 / 0)
  reader.submit(lambda: ran.append(1))
  assert wait_for(lambda: reader.done == 2) and ran == [1]
  assert isinstance(reader.error, ZeroDivisionError)
  assert "reading the store ahead of its batches failed" in caplog.text
  thread = reader._thread
  assert wait_for(lambda: not reader.running)  # idle: the thread is gone
  thread.join(5)
  assert not thread.is_alive()
  reader.submit(lambda: ran.append(2))  # and a new job starts another
  assert wait_for(lambda: reader.done == 3) and ran == [1, 2]
