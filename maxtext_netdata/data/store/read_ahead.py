"""Reading a store larger than memory ahead of the batches that need it.

From a store whose rows do not fit in memory (`network_store_access` random), each batch
faults in the pages of its contexts' rows one at a time as the batch kernel reads them: one
disk read's latency after another, ~90 batches of 32 x 1024 a second on the development VM.
The epoch plan says which rows the next batches read, so `ReadAhead` asks the kernel for them
(`madvise(MADV_WILLNEED)`, which starts the reads and returns) while earlier batches are built:
the reads go out together and have arrived when the kernel needs them. Measured with
`benchmarks/bench_store_access.py --memory-limit` (docs/prepare.md, "A store larger than
memory").

Our own code, not a library's: nothing we use asks for pages of a mapped file ahead of a
computed access pattern (numpy, pyarrow and Grain read what they are asked for, when asked).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import queue
import threading
from collections.abc import Callable, Sequence

import numpy as np

_log = logging.getLogger(__name__)
_PAGE = mmap.PAGESIZE
_WILLNEED = getattr(mmap, "MADV_WILLNEED", None)
IDLE_S = 5.0  # a read-ahead thread with no job for this long ends


def _libc_madvise():
  """libc's `madvise`, called through ctypes, which lets go of the GIL for the call (the
  `mmap` module's `madvise` keeps it): the loader's threads run meanwhile."""
  call = ctypes.CDLL(None, use_errno=True).madvise
  call.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
  call.restype = ctypes.c_int
  return call


_madvise = _libc_madvise() if _WILLNEED is not None else None


def page_runs(array: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
  """[n, 2] (address, bytes) of the page-aligned memory runs that hold rows
  [starts[i], stops[i]) of `array` (rows along its first axis), runs that meet merged."""
  row = array.strides[0]
  lo = (array.ctypes.data + starts.astype(np.int64) * row) // _PAGE * _PAGE
  hi = array.ctypes.data + stops.astype(np.int64) * row
  order = np.argsort(lo, kind="stable")
  lo, hi = lo[order], np.maximum.accumulate(hi[order])
  first = np.flatnonzero(np.r_[True, lo[1:] > hi[:-1]]) if len(lo) else np.zeros(0, np.int64)
  last = np.r_[first[1:] - 1, len(lo) - 1] if len(lo) else first
  runs = np.stack([lo[first], hi[last] - lo[first]], axis=1)
  return runs[runs[:, 1] > 0]


def will_need(arrays: Sequence[np.ndarray], starts: np.ndarray, stops: np.ndarray) -> int:
  """Asks the kernel to start reading rows [starts[i], stops[i]) of each memory-mapped
  array in `arrays` into page cache, and returns the page runs asked for (0 where the
  platform has no MADV_WILLNEED). Advice only: a run the kernel refuses is not an error."""
  if _madvise is None:
    return 0
  count = 0
  for array in arrays:
    for address, size in page_runs(array, starts, stops).tolist():
      _madvise(address, size, _WILLNEED)
      count += 1
  return count


class ReadAhead:
  """A daemon thread that runs the read-ahead jobs handed to it (`submit`), off the loader's
  path: a batch of 32 x 1024 asks for ~200 page runs, ~10 us each, as long as the batch
  kernel takes over the batch from a store larger than memory.

  Jobs are advice: one that raises is dropped, with a warning for the first (the batch it was
  for raises the same error when it is built, or is built without being read ahead; `error`
  keeps it). The thread starts with a job, in the process that submits it, and ends after
  `idle_s` seconds without one (a builder whose iterator is closed leaves no thread behind);
  it holds no resource to release, and a process forked from it starts its own.
  """

  def __init__(self, idle_s: float = IDLE_S):
    self._jobs: queue.SimpleQueue = queue.SimpleQueue()
    self._thread: threading.Thread | None = None
    self._pid = os.getpid()
    self._lock = threading.Lock()
    self._idle_s = idle_s
    self.done = 0  # jobs run, for tests and benchmarks
    self.error: BaseException | None = None  # the first a job raised

  def submit(self, job: Callable[[], object]) -> None:
    with self._lock:
      if self._pid != os.getpid():  # a forked child: no thread, and the queue is the parent's
        self._jobs, self._thread, self._pid = queue.SimpleQueue(), None, os.getpid()
      if self._thread is None:
        self._thread = threading.Thread(target=self._run, name="store-read-ahead", daemon=True)
        self._thread.start()
      self._jobs.put(job)  # under the lock: the thread cannot end between the check and this

  @property
  def running(self) -> bool:
    with self._lock:
      return self._thread is not None

  def _run(self) -> None:
    while True:
      try:
        job = self._jobs.get(timeout=self._idle_s)
      except queue.Empty:
        with self._lock:
          if self._jobs.empty():
            self._thread = None
            return
        continue
      try:
        job()
      except Exception as e:  # advice only; see the class docstring
        if self.error is None:
          self.error = e
          _log.warning("reading the store ahead of its batches failed (%r); reading on", e)
      self.done += 1
