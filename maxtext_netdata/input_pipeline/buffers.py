"""Output buffers of host batches, reused once nothing refers to them any more.

Fresh memory for every batch costs a page fault and the kernel's zeroing per 4 KiB page (the
six arrays of a 256 x 1024 batch are 1,536 pages: measured 2.4 ms against 1.6 ms a batch
with reused buffers). Reuse must be safe: on CPU, XLA uses a 64-byte-aligned host array in
place instead of copying it (`batch_kernel.OUTPUT_ALIGNMENT`), so a `jax.Array` made from a
batch may read its buffer for as long as it lives, and so may any numpy view a consumer kept.

Every array handed out is a view of its block, and a view, an XLA buffer using it in place or
an in-flight host-to-device copy all hold a Python reference to that block (numpy views keep
their base; JAX keeps the array it was given until it is done with it). So a block whose
reference count is the pool's own is referenced by nobody and is reused; any other block is
left alone. Why our own: no library offers reuse conditioned on the consumer's release.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

from maxtext_netdata.input_pipeline.batch_kernel import OUTPUT_ALIGNMENT

# Blocks a pool keeps: in-process, Grain's prefetch buffer (4) and read threads (2) plus the
# batch the consumer holds and the one being built; a pool never keeps more than MAX_BYTES.
CAPACITY = 8
MAX_BYTES = 256 * 2**20
# References to a kept block when nobody else holds it: the pool's entry, the loop's variable
# and sys.getrefcount's argument.
_UNREFERENCED = 3


class OutputPool:
  """Blocks of `count` int32 arrays of one shape, each array starting on OUTPUT_ALIGNMENT.

  `take(shape, count)` returns `count` uninitialized arrays from a block nobody refers to
  (allocating and keeping a new block while the pool has room, else a fresh unkept one).
  Thread-safe; pickles empty (each process keeps its own blocks).
  """

  def __init__(self):
    self._blocks: list[tuple[np.ndarray, int]] = []  # each block, its first aligned byte
    self._key: tuple | None = None
    self._lock = threading.Lock()

  def __getstate__(self):
    return {}

  def __setstate__(self, state):
    self.__init__()

  def take(self, shape: tuple[int, int], count: int) -> list[np.ndarray]:
    nbytes = shape[0] * shape[1] * 4
    stride = -(-nbytes // OUTPUT_ALIGNMENT) * OUTPUT_ALIGNMENT
    size = stride * count + OUTPUT_ALIGNMENT
    with self._lock:
      if self._key != (shape, count):  # another geometry: the old blocks are of no use
        self._blocks, self._key = [], (shape, count)
      for kept, kept_start in self._blocks:
        if sys.getrefcount(kept) == _UNREFERENCED:
          block, start = kept, kept_start
          break
      else:
        block = np.empty(size, dtype=np.uint8)
        start = -block.ctypes.data % OUTPUT_ALIGNMENT
        if len(self._blocks) < min(CAPACITY, max(2, MAX_BYTES // size)):
          self._blocks.append((block, start))
      # One strided view, split: each array's base is the block itself (numpy points a view
      # of a view at the owner), in a third of the time of making each view on its own.
      arrays = np.ndarray((count, *shape), np.int32, block, start, (stride, shape[1] * 4, 4))
      return list(arrays)
