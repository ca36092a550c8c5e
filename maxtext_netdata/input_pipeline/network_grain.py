"""The `network_grain` dataset: the Grain graph that turns a prepared split into host batches.

    MapDataset.range(num_steps)[step:]   global step index s, from the data position on
      .map(BuildBatch)                   host rows of global batch s: the three inputs arrays
                                         (in-process: all six, ShiftData fused in the pass)
      .to_iter_dataset(ReadOptions)      in-process read threads and prefetch
      .mp_prefetch(MultiprocessingOptions)   only when grain_worker_count > 0
      .map(ShiftData)                    with workers: the targets, shifted left (docs/spec.md §4)

In-process with no read threads, `SynchronousIterator` calls the same BuildBatch per step
itself: the same batches without Grain's per-element bookkeeping.

A Grain element is a whole host batch: Grain's per-element cost (~5-7 us) is then paid once
per batch, and each batch is built by one vectorized call. The graph holds only small
parameters and the store's path (workers are spawned and get it cloudpickled); plans and
store arrays are opened lazily in each process. With workers, ShiftData runs after them: the
three targets arrays derive from the inputs in the main process faster than twice the bytes
cross between processes (benchmarks/bench_pipeline.py measures both placements).

A batch is a pure function of the global step, so `HostBatchIterator`'s state is the data
position (`POSITION_FORMAT`: the next global step and what identifies the data), not Grain's
internal state, whose shape depends on the worker count: a position saved with any worker,
thread or process count resumes under any other, and `set_state` rebuilds the Grain graph at
that step.
"""

from __future__ import annotations

import functools
import math
import multiprocessing
import os
import re
import signal
import sys
import threading
from multiprocessing import resource_tracker

import grain
import grain.multiprocessing as grain_multiprocessing
import numpy as np
from absl import flags

from maxtext_netdata.errors import UserError
from maxtext_netdata.input_pipeline import plan_order, worker_blocks
from maxtext_netdata.input_pipeline.sequences import INPUT_KEYS, BatchBuilder
from maxtext_netdata.input_pipeline.transforms import ShiftData

# Memory a worker process holds besides its batches: Python, numpy, numba, Grain. Measured USS
# (= its anonymous memory) 128 MiB with stores of 1M and 4M rows (benchmarks/bench_prepare.py):
# probe statistics and epoch plans are mapped from files beside the store, page cache shared
# by all workers, so nothing here grows with the store.
_WORKER_BASE_MB = 160

POSITION_FORMAT = "netdata-position-1"
# Signals a worker process starts with blocked, until `ignore_interrupt` (`first_next`).
STARTUP_BLOCKED = frozenset({signal.SIGINT, signal.SIGTERM})
# The longest `release_shared_memory` waits for Grain's unlinks (each takes microseconds).
RELEASE_WAIT_S = 5.0

# Grain 0.2.18's error when a worker process ends without handing over its result.
_GRAIN_WORKER_DIED = re.compile(
  r"Worker process was terminated unexpectedly with exit code (-?\d+)"
)


class BuildBatch(grain.transforms.Map):
  """Global step index -> the `inputs*` arrays of rows [lo, hi) of that global batch, or
  with `shifted` all six arrays (ShiftData included)."""

  def __init__(self, builder: BatchBuilder, lo: int, hi: int, shifted: bool = False):
    self.builder = builder
    self.lo = lo
    self.hi = hi
    self.shifted = shifted

  def map(self, step: int) -> dict[str, np.ndarray]:
    rows = self.builder.gather(int(step), self.lo, self.hi)
    return self.builder.build_shifted(rows) if self.shifted else self.builder.build(rows)


def host_batch_bytes(rows: int, seq_len: int) -> int:
  """Bytes of one host batch as workers send it (the INPUT_KEYS arrays, int32)."""
  return len(INPUT_KEYS) * 4 * rows * seq_len


def usable_cores() -> int:
  """Cores this process may use: its CPU affinity, capped by a cgroup CPU quota if one is set.

  `os.cpu_count()` counts the machine's cores, which overstates what a container or a
  `taskset`-pinned job gets (the auto worker count and bench both need the usable number).
  """
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  quota = _cgroup_cpu_quota()
  if quota is not None:
    cores = min(cores, max(1, math.ceil(quota)))
  return max(1, cores or 1)


def _cgroup_cpu_quota() -> float | None:
  """CPUs' worth of time the cgroup allows (v2 `cpu.max`, else v1 CFS quota), None if no limit."""
  try:
    with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as f:
      quota, period = f.read().split()[:2]
    return None if quota == "max" else int(quota) / int(period)
  except (OSError, ValueError):
    pass
  try:
    with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", encoding="ascii") as f:
      quota = int(f.read())
    with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us", encoding="ascii") as f:
      period = int(f.read())
  except (OSError, ValueError):
    return None
  return None if quota <= 0 or period <= 0 else quota / period


def worker_count(config, host_batch_bytes: int) -> int:
  """`grain_worker_count`, with -1 resolved from the usable cores and `grain_ram_budget_mb`.

  A worker holds `grain_per_worker_buffer_size` finished batches plus
  `grain_prefetch_buffer_size` in its read threads; auto uses every core the budget pays for.
  """
  if config.grain_worker_count >= 0:
    return config.grain_worker_count
  buffered = config.grain_per_worker_buffer_size + config.grain_prefetch_buffer_size
  per_worker_mb = _WORKER_BASE_MB + buffered * host_batch_bytes / 2**20
  affordable = int(config.grain_ram_budget_mb // per_worker_mb)
  return max(1, min(usable_cores(), affordable))


def make_dataset(
  builder: BatchBuilder, lo: int, hi: int, num_steps: int | None, *, shifted: bool = False
):
  """The MapDataset of the inputs of host batches (rows [lo, hi) of each global batch); of the
  whole batches, ShiftData included, with `shifted`."""
  length = sys.maxsize if num_steps is None else num_steps
  return grain.MapDataset.range(length).map(BuildBatch(builder, lo, hi, shifted))


def _workers(config, builder: BatchBuilder, lo: int, hi: int, in_process: bool) -> int:
  """The worker processes `make_iterator` starts for host rows [lo, hi)."""
  return 0 if in_process else worker_count(config, host_batch_bytes(hi - lo, builder.seq_len))


def make_iterator(
  config,
  builder: BatchBuilder,
  lo: int,
  hi: int,
  num_steps: int | None,
  *,
  start: int = 0,
  in_process: bool = False,
  block_prefix: str | None = None,
) -> grain.DatasetIterator | SynchronousIterator:
  """The Grain iterator of host batches from global step `start`, with the worker processes
  of `grain_worker_count` unless `in_process` (they start at its first `next` or
  `start_prefetch`), which name their /dev/shm blocks with `block_prefix` (by default a new
  one: `worker_blocks`). In-process without read threads, a `SynchronousIterator` of the same
  batches."""
  workers = _workers(config, builder, lo, hi, in_process)
  if workers == 0 and config.grain_num_threads == 0:
    return SynchronousIterator(BuildBatch(builder, lo, hi, shifted=True), start, num_steps)
  dataset = make_dataset(builder, lo, hi, num_steps, shifted=workers == 0)
  if start:
    dataset = dataset[start:]
  dataset = dataset.to_iter_dataset(
    grain.ReadOptions(
      num_threads=config.grain_num_threads,
      prefetch_buffer_size=config.grain_prefetch_buffer_size,
    )
  )
  if workers > 0:
    if not flags.FLAGS.is_parsed():
      # Grain reads its absl flags when it starts a worker; only an entry point may parse them.
      raise UserError(
        f"grain_worker_count={workers} needs absl flags parsed: run under absl.app.run or call"
        " absl.flags.FLAGS.mark_as_parsed() first (maxtext-netdata's commands do), or set"
        " grain_worker_count=0"
      )
    dataset = dataset.mp_prefetch(
      grain.MultiprocessingOptions(
        num_workers=workers, per_worker_buffer_size=config.grain_per_worker_buffer_size
      ),
      worker_init_fn=functools.partial(start_worker, block_prefix or worker_blocks.new_prefix()),
    )
  return iter(dataset.map(ShiftData()) if workers > 0 else dataset)


def release_shared_memory() -> None:
  """Returns once Grain has unlinked the /dev/shm blocks of every batch already dropped.

  Grain 0.2.18 unlinks a worker's block when the array over it is garbage, on a one-thread
  pool of its own (`SharedMemoryArray.enable_async_del(1)`); a process that exits right after
  leaves the last ones to Python's resource tracker, which unlinks them with a "leaked
  shared_memory objects" warning. A task queued behind them on that pool returns when they
  are done. The pool is Grain's private attribute: without it there is nothing to wait for.
  The wait is bounded (`RELEASE_WAIT_S`): a pool whose thread is gone must not hang the caller.
  While the interpreter tears itself down the pool's thread no longer runs, so there is no
  wait at all (the resource tracker unlinks what is left).
  """
  pool = getattr(grain_multiprocessing.SharedMemoryArray, "_del_thread_pool", None)
  if pool is None or sys.is_finalizing():
    return
  try:
    pool.apply_async(tuple).get(timeout=RELEASE_WAIT_S)
  except (multiprocessing.TimeoutError, ValueError):  # ValueError: the pool is closed
    pass


def ignore_interrupt(worker_index: int, worker_count: int) -> None:
  """Grain worker start-up: SIGINT ignored, so that Ctrl-C ends the main process only.

  Ctrl-C in a terminal reaches the whole process group. A worker ended by it may die between
  copying a batch into a /dev/shm block and queueing it (Grain catches `Exception`, not
  `KeyboardInterrupt`), which leaves that block behind, and the main process would see a dead
  worker instead of the interrupt. Ignoring it, the worker is ended the way Grain ends it: the
  main process closes the iterator (our trainer and CLI in `finally`; otherwise Grain's exit
  finalizer), the worker stops at its next batch and unlinks what it did not hand over.
  """
  del worker_index, worker_count
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  # Blocked by `first_next`: a SIGTERM pending since then ends the worker now, its pipeline
  # read whole, before it makes a block.
  signal.pthread_sigmask(signal.SIG_UNBLOCK, STARTUP_BLOCKED)


def first_next(iterator):
  """`next(iterator)` in a thread of its own with SIGINT and SIGTERM blocked, the caller
  waiting: the first `next` of a Grain iterator with workers, which starts them.

  A worker spends seconds importing before Grain calls `ignore_interrupt`; a Ctrl-C (or a
  SIGTERM, as Slurm sends it) to the process group then ended it, and the Grain thread
  spawning it waited for ever to write the rest of the pickled pipeline into the pipe of the
  dead child (CPython's spawn keeps the pipe's read end open until the write is done): the run
  hung until the 60 s grace ended it (`signals.CLEANUP_GRACE_S`), leaking semaphores. Grain
  spawns its workers from threads it makes in this first `next`; made from a thread that
  blocks both signals, they block them too, and so do the workers they spawn, from their first
  instruction until `ignore_interrupt`. The caller's wait is interruptible: Ctrl-C raises
  there at once (the thread, a daemon, is left to the iterator's `close`). Python's resource
  tracker is started first, here: starting it unblocks both signals in the thread that does
  (`multiprocessing.resource_tracker.ensure_running`), which would be one of those threads.
  """
  resource_tracker.ensure_running()
  outcome: list = []

  def run() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, STARTUP_BLOCKED)
    try:
      outcome.append((True, next(iterator)))
    except BaseException as e:  # raised again in the caller
      outcome.append((False, e))

  thread = threading.Thread(target=run, name="grain-first-next", daemon=True)
  thread.start()
  while thread.is_alive():
    thread.join(0.1)
  ok, value = outcome[0]
  if not ok:
    raise value
  return value


def start_worker(block_prefix: str, worker_index: int, worker_count: int) -> None:
  """Grain worker start-up: `ignore_interrupt`, and the worker's /dev/shm blocks named with
  `block_prefix` (`worker_blocks.name_blocks`)."""
  ignore_interrupt(worker_index, worker_count)
  worker_blocks.name_blocks(block_prefix)


class SynchronousIterator:
  """`BuildBatch` of steps start, start + 1, ... (up to `num_steps`) in the calling thread.

  What Grain's iterator does with no read threads and no workers, without its per-element
  bookkeeping (locks, timers, stats, filter checks: measured 25-45 us a batch, a third of an
  8 x 1024 batch's whole cost). Has the methods `HostBatchIterator` uses.
  """

  def __init__(self, build: BuildBatch, start: int, num_steps: int | None):
    self._build = build
    self._step = start
    self._end = sys.maxsize if num_steps is None else num_steps

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    if self._step >= self._end:
      raise StopIteration
    batch = self._build.map(self._step)
    self._step += 1
    return batch

  def start_prefetch(self) -> None:
    """Nothing to start: batches are built when asked for."""

  def close(self) -> None:
    self._step = self._end


class WorkerError(UserError):
  """A Grain worker process ended while training ran: one line naming the exit cause."""


class PositionError(UserError):
  """A saved data position that does not belong to this data or batch geometry."""


def _worker_death(error: BaseException) -> str | None:
  """The cause of a worker's end in Grain's error (`exit code N`), else None."""
  found = _GRAIN_WORKER_DIED.search(str(error))
  if found is None:
    return None
  code = int(found[1])
  if code < 0:
    try:
      return f"killed by {signal.Signals(-code).name}"
    except ValueError:
      return f"killed by signal {-code}"
  return f"exit code {code}"


class HostBatchIterator:
  """This process's host batches from a data position on (global step `start`, by default 0);
  its state is that position.

  `get_state()` is `{"format": POSITION_FORMAT, "step": next global step, ...identity,
  ...settings}`, the same on every process; `set_state()` checks the identity and the settings
  that shape the batches (packing, field order, mode weights, shuffling), a one-line
  `PositionError` naming what differs, and rebuilds the Grain graph at that step, so workers,
  threads and processes may differ from the run that saved it. Nothing is read before
  `start_prefetch()` or the first `next` (Grain 0.2.18 starts worker processes at the first
  `next`), so a restore throws no prefetched batch away. A worker that dies surfaces as a
  `WorkerError` (Grain notices a dead worker within a second), once the other workers are
  ended and the /dev/shm blocks the dead one left are unlinked (`worker_blocks`); `close()`
  ends the workers and may be called more than once.
  """

  def __init__(
    self,
    config,
    builder: BatchBuilder,
    lo: int,
    hi: int,
    num_steps: int | None,
    *,
    split: str = "train",
    in_process: bool = False,
    start: int = 0,
  ):
    self._args = (config, builder, lo, hi, num_steps)
    self._in_process = in_process
    self.step = start
    self.identity = {
      "fingerprint": builder.store.meta.get("fingerprint", builder.store.path),
      "data_shuffle_seed": builder.seed,
      "global_batch_size": builder.global_batch_size,
      "max_target_length": builder.seq_len,
      "split": split,
    }
    # The other settings that change the batches. Positions saved before they were recorded
    # lack them and are checked on the identity alone.
    self.settings = {
      "packing": config.packing,
      "network_field_order": config.network_field_order,
      "network_mode_weights": [float(w) for w in config.network_mode_weights],
      "enable_data_shuffling": config.enable_data_shuffling,
      "stream_order": plan_order.NAME if config.enable_data_shuffling else "store",
    }
    self._iterator = None
    self._spawns = _workers(config, builder, lo, hi, in_process) > 0  # worker processes
    self._started = False  # the Grain iterator's first `next` done (`first_next`)
    self._blocks = worker_blocks.new_prefix()

  def __iter__(self):
    return self

  def start_prefetch(self) -> None:
    """Builds the Grain iterator at the current position and starts its read-ahead."""
    if self._iterator is None:
      self._iterator = make_iterator(
        *self._args, start=self.step, in_process=self._in_process, block_prefix=self._blocks
      )
    self._iterator.start_prefetch()

  def __next__(self) -> dict[str, np.ndarray]:
    if self._iterator is None:
      self.start_prefetch()
    try:
      if self._started or not self._spawns:
        batch = next(self._iterator)
      else:  # the first `next` of an iterator with workers starts them
        batch = first_next(self._iterator)
      self._started = True
    except StopIteration:
      raise
    except RuntimeError as e:
      cause = _worker_death(e)
      if cause is None:
        raise
      self.close()
      # What the dead worker created and never handed over has no one else to unlink it.
      worker_blocks.unlink_left(self._blocks)
      raise WorkerError(
        f"input pipeline: a Grain worker process ended ({cause}) before global step"
        f" {self.step} was delivered; the run stops"
      ) from None
    self.step += 1
    return batch

  def get_state(self) -> dict:
    return {"format": POSITION_FORMAT, "step": self.step, **self.identity, **self.settings}

  def set_state(self, state: dict) -> None:
    if not isinstance(state, dict) or state.get("format") != POSITION_FORMAT:
      found = state.get("format") if isinstance(state, dict) else type(state).__name__
      raise PositionError(
        f"iterator state is not a {POSITION_FORMAT} data position (found {found!r}): it was"
        " saved by another version of the pipeline"
      )
    checked = {**self.identity, **{k: v for k, v in self.settings.items() if k in state}}
    differs = [
      f"{key} {state.get(key)!r} saved, {value!r} now"
      for key, value in checked.items()
      if state.get(key) != value
    ]
    if differs:
      raise PositionError(
        "the checkpoint's data position belongs to other data: " + "; ".join(differs)
      )
    if "stream_order" not in state and self.settings["enable_data_shuffling"]:
      print(
        f"network_grain: the data position (step {state['step']}) was saved when epochs were"
        " shuffled by an argsort of their rows; they are now shuffled by a keyed permutation"
        f" ({plan_order.NAME}): from this step the rest of its epoch comes in another order"
        " (some sequences twice, some not), later epochs as a new run's",
        file=sys.stderr,
        flush=True,
      )
    self.close()
    self.step = int(state["step"])

  def close(self) -> None:
    if self._iterator is not None:
      self._iterator.close()
      self._iterator, self._started = None, False
      release_shared_memory()
      # A block a worker made and never handed over, whatever stopped it: its registration
      # with the resource tracker would otherwise end the process with a "leaked
      # shared_memory objects" warning (seen in 1 of ~40 SIGTERMs to a MaxText run beside
      # busy cores). Blocks under arrays still alive here are Grain's to unlink.
      worker_blocks.unlink_left(self._blocks, keep_mapped=True)
