"""The `network_grain` dataset: the Grain graph that turns a prepared split into host batches.

    MapDataset.range(num_steps)          global step index s
      .map(BuildBatch)                   host rows of global batch s: the three inputs arrays
      .to_iter_dataset(ReadOptions)      in-process read threads and prefetch
      .mp_prefetch(MultiprocessingOptions)   only when grain_worker_count > 0
      .map(ShiftData)                    the targets, shifted left (SPEC §4)

A Grain element is a whole host batch: Grain's per-element cost (~5-7 us) is then paid once
per batch, and each batch is built by one vectorized call. The graph holds only small
parameters and the store's path (workers are spawned and get it cloudpickled); plans and
store arrays are opened lazily in each process. Because a batch is a pure function of the step
index, the iterator's Grain state (`get_state`/`set_state`) resumes exactly, and the batches do
not depend on the worker or thread count. ShiftData runs after the workers: the three targets
arrays derive from the inputs in ~0.3 ms, cheaper than moving them between processes.
"""

from __future__ import annotations

import os
import sys

import grain
import numpy as np
from absl import flags

from maxtext_netdata.input_pipeline.sequences import INPUT_KEYS, BatchBuilder
from maxtext_netdata.input_pipeline.transforms import ShiftData

# Memory of one worker process besides its batches: Python, numpy, Grain and an epoch plan.
_WORKER_BASE_MB = 300


class BuildBatch(grain.transforms.Map):
  """Global step index -> the `inputs*` arrays of rows [lo, hi) of that global batch."""

  def __init__(self, builder: BatchBuilder, lo: int, hi: int):
    self.builder = builder
    self.lo = lo
    self.hi = hi

  def map(self, step: int) -> dict[str, np.ndarray]:
    return self.builder.build(self.builder.gather(int(step), self.lo, self.hi))


def host_batch_bytes(rows: int, seq_len: int) -> int:
  """Bytes of one host batch as workers send it (the INPUT_KEYS arrays, int32)."""
  return len(INPUT_KEYS) * 4 * rows * seq_len


def worker_count(config, host_batch_bytes: int) -> int:
  """`grain_worker_count`, with -1 resolved from the cores and `grain_ram_budget_mb`.

  A worker holds `grain_per_worker_buffer_size` finished batches plus
  `grain_prefetch_buffer_size` in its read threads; auto uses every core the budget pays for.
  """
  if config.grain_worker_count >= 0:
    return config.grain_worker_count
  buffered = config.grain_per_worker_buffer_size + config.grain_prefetch_buffer_size
  per_worker_mb = _WORKER_BASE_MB + buffered * host_batch_bytes / 2**20
  affordable = int(config.grain_ram_budget_mb // per_worker_mb)
  return max(1, min(os.cpu_count() or 1, affordable))


def make_dataset(builder: BatchBuilder, lo: int, hi: int, num_steps: int | None):
  """The MapDataset of the inputs of host batches (rows [lo, hi) of each global batch)."""
  length = sys.maxsize if num_steps is None else num_steps
  return grain.MapDataset.range(length).map(BuildBatch(builder, lo, hi))


def make_iterator(
  config,
  builder: BatchBuilder,
  lo: int,
  hi: int,
  num_steps: int | None,
  *,
  start: int = 0,
  in_process: bool = False,
) -> grain.DatasetIterator:
  """The Grain iterator of host batches from global step `start`, with the worker processes
  of `grain_worker_count` unless `in_process`."""
  dataset = make_dataset(builder, lo, hi, num_steps)
  if start:
    dataset = dataset[start:]
  dataset = dataset.to_iter_dataset(
    grain.ReadOptions(
      num_threads=config.grain_num_threads,
      prefetch_buffer_size=config.grain_prefetch_buffer_size,
    )
  )
  batch_bytes = host_batch_bytes(hi - lo, builder.seq_len)
  workers = 0 if in_process else worker_count(config, batch_bytes)
  if workers > 0:
    # Grain's worker start reads absl flags, which only an absl `app.run` entry point parses;
    # ours take their settings from the config, so the flags keep their defaults.
    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()
    dataset = dataset.mp_prefetch(
      grain.MultiprocessingOptions(
        num_workers=workers, per_worker_buffer_size=config.grain_per_worker_buffer_size
      )
    )
  return iter(dataset.map(ShiftData()))
