"""`create_data_iterator(config, mesh)`: the built-in dataset types, dispatched by `registry`.

Each dataset type returns (train iterator, eval iterator or None). The iterators yield dicts
of global `jax.Array`s, int32 [global_batch, max_target_length], whose batch dimension is
sharded over the mesh axes of `config.data_sharding`; each process loads only the rows its
devices hold under that sharding (`host_slice`) and `jax.make_array_from_process_local_data`
joins them.
"""

from __future__ import annotations

import collections
import math
import queue
import threading
from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh

from maxtext_netdata.config import Config
from maxtext_netdata.distributed import mesh as mesh_lib
from maxtext_netdata.distributed import multihost
from maxtext_netdata.errors import ConfigError
from maxtext_netdata.input_pipeline import placement, registry, synthetic


def to_global(
  host_batch: dict[str, np.ndarray], sharding: jax.sharding.Sharding, global_rows: int
) -> dict[str, jax.Array]:
  """This process's rows of every key → one global array per key with `sharding`.

  The same arrays as `jax.make_array_from_process_local_data(sharding, host_batch, shapes)`
  (any process count, any mesh order), placed by `placement.place`: the per-device slices are
  worked out once per batch geometry, so a batch costs one device put per key (measured on
  CPU: 0.03 ms against 0.25 ms per batch of six arrays, most of a small host batch's cost).
  """
  shapes = {key: (global_rows, *value.shape[1:]) for key, value in host_batch.items()}
  placed = placement.place(host_batch, sharding, shapes)
  if placed is not None:
    return placed
  shardings = {key: sharding for key in host_batch}
  return jax.make_array_from_process_local_data(shardings, host_batch, shapes)


class _Failed(NamedTuple):
  """What the placing thread raised, re-raised by the caller's `next`."""

  error: BaseException


_END = object()  # the local iterator is exhausted


class DataIterator:
  """Global batches from a `network_grain.HostBatchIterator` of this process's rows.

  `get_state`/`set_state` are the data position (see `network_grain`): the same on every
  process and valid for any worker, thread or process count. Worker processes start at
  `start_prefetch()` (call it after restoring a position, while the model compiles) or at the
  first batch; `close` ends them.

  `ahead` (`device_prefetch`) global batches are on the devices before the step that takes
  them: a batch's host-to-device copy then has `ahead` steps of time to finish, so the step
  never waits for it and the host may queue the next step while this one runs. The position
  is that after the last batch handed out, not after the last one placed, so a checkpoint
  resumes exactly; `set_state` and `close` drop what was placed past it.

  Where the batches go to an accelerator (`thread`; default: any backend but the CPU), a
  placing thread loads and places them, keeping up to `ahead` placed batches queued and one
  more in hand, and the training loop's `next` only takes a placed batch from the queue. Why
  a thread: on an H200 placing a batch's six arrays took 0.5-1.0 ms of the loop's host time
  (1.1-1.4% of a 74 ms step) when `next` did it (docs/performance.md); the thread does it
  while the loop waits for the device. Errors of loading or placing are raised by the `next`
  that would have returned the batch, as they were raised. On the CPU backend the step's own
  threads fill the cores: there a placing thread only contends with them for the cores and
  with the loop for the GIL (measured on 2 cores: 0.5-0.7% of the step waited, against 0.03%
  in `next`), so `next` loads and places, each batch right after the step `ahead` earlier was
  handed its batch (the pattern of flax's `prefetch_to_device`, without its thread).
  """

  # How long `close`/`set_state` wait for the placing thread to finish the batch in hand.
  JOIN_TIMEOUT_S = 60.0

  def __init__(
    self,
    local_iterator,
    sharding: jax.sharding.Sharding,
    global_rows: int,
    ahead: int = 0,
    thread: bool | None = None,
  ):
    self.local_iterator = local_iterator
    self._sharding = sharding
    self._global_rows = global_rows
    self._ahead = ahead
    if thread is None:
      thread = jax.default_backend() != "cpu"
    self._threaded = bool(ahead) and thread
    self._placed: collections.deque = collections.deque()  # (batch, position after it)
    self._position = None  # after the last batch handed out; None: the local iterator's
    self._queue: queue.Queue | None = None
    self._thread: threading.Thread | None = None
    self._stop = threading.Event()
    self._ended = False

  def __iter__(self):
    return self

  def _place_next(self) -> dict[str, jax.Array]:
    return to_global(next(self.local_iterator), self._sharding, self._global_rows)

  def __next__(self) -> dict[str, jax.Array]:
    if self._ended:
      raise StopIteration
    if not self._threaded:
      return self._next_in_line()
    if self._thread is None:
      self._start_thread()
    item = self._queue.get()
    if item is _END:
      self._ended = True
      raise StopIteration
    if isinstance(item, _Failed):
      self._ended = True
      raise item.error
    batch, self._position = item
    return batch

  def _next_in_line(self) -> dict[str, jax.Array]:
    """Loads and places batches until `ahead` are placed past the one handed out."""
    while len(self._placed) <= self._ahead:
      try:
        batch = self._place_next()
      except StopIteration:
        break
      self._placed.append((batch, self.local_iterator.get_state() if self._ahead else None))
    if not self._placed:
      self._ended = True
      raise StopIteration
    batch, self._position = self._placed.popleft()
    return batch

  def _start_thread(self) -> None:
    if self._position is None:  # the thread moves the local iterator on from here
      self._position = self.local_iterator.get_state()
    self._stop = threading.Event()
    self._queue = queue.Queue(maxsize=self._ahead)
    self._thread = threading.Thread(
      target=self._fill, args=(self._queue, self._stop), name="device-prefetch", daemon=True
    )
    self._thread.start()

  def _fill(self, out: queue.Queue, stop: threading.Event) -> None:
    """The placing thread: placed batches with the position after each, then `_END` or the
    error, into `out` until `stop` is set."""
    while not stop.is_set():
      try:
        item = (self._place_next(), self.local_iterator.get_state())
      except StopIteration:
        item = _END
      except BaseException as e:  # raised again by the caller's next()
        item = _Failed(e)
      while not stop.is_set():
        try:
          out.put(item, timeout=0.05)
          break
        except queue.Full:
          continue
      if not isinstance(item, tuple):
        return

  def _stop_thread(self, close_local: bool = False) -> None:
    """Stops the placing thread once it has put down the batch in hand, and drops what it
    placed; `close_local`: closes the local iterator too, and after a short wait for the
    thread, so a thread waiting on a slow worker is woken by the close."""
    thread, self._thread = self._thread, None
    try:
      if thread is not None:
        self._stop.set()
        thread.join(1.0 if close_local else self.JOIN_TIMEOUT_S)
    finally:
      if close_local:
        self.local_iterator.close()
    if thread is not None:
      thread.join(self.JOIN_TIMEOUT_S)
      if thread.is_alive():
        raise RuntimeError(
          f"the device-prefetch thread did not stop within {self.JOIN_TIMEOUT_S:g} s"
        )
    self._queue = None

  def start_prefetch(self) -> None:
    """Starts the local iterator's read-ahead, and the placing thread (`ahead` > 0)."""
    self.local_iterator.start_prefetch()
    if self._threaded and self._thread is None and not self._ended:
      self._start_thread()

  def get_state(self) -> dict:
    return self._position if self._position is not None else self.local_iterator.get_state()

  def set_state(self, state: dict) -> None:
    self._stop_thread()
    self._placed.clear()
    self.local_iterator.set_state(state)
    self._position = None
    self._ended = False

  def close(self) -> None:
    self._ended = True
    self._placed.clear()
    self._stop_thread(close_local=True)


def global_batch_size(config: Config, mesh: Mesh) -> int:
  """Sequences per step over all processes, checked to divide over processes and shards."""
  size = config.global_batch_size(jax.device_count())
  shards = math.prod(mesh.shape[axis] for axis in config.data_sharding)
  if size % shards:
    raise ConfigError(
      f"global batch of {size} sequences does not divide over the {shards} devices of"
      f" data_sharding={config.data_sharding!r}"
    )
  if size % jax.process_count():
    raise ConfigError(
      f"global batch of {size} sequences does not divide over {jax.process_count()} processes"
    )
  return size


class HostSlice(NamedTuple):
  """What one process loads of each global batch: rows [lo, hi) of `global_rows`."""

  global_rows: int
  sharding: jax.sharding.Sharding
  lo: int
  hi: int


def host_slice(config: Config, mesh: Mesh) -> HostSlice:
  """The global batch size, its sharding on `mesh`, and this process's rows of it.

  The rows come from the sharding itself (`multihost.sharded_row_range`), so they are right
  for any device order of the mesh, and a mesh that interleaves processes along the batch is
  an error instead of silently misplaced rows.
  """
  size = global_batch_size(config, mesh)
  sharding = mesh_lib.batch_sharding(config, mesh)
  lo, hi = multihost.sharded_row_range(sharding, (size, config.max_target_length))
  return HostSlice(size, sharding, lo, hi)


def _network_grain(config: Config, mesh: Mesh):
  from maxtext_netdata.input_pipeline import network_splits  # noqa: PLC0415 (only this dataset type needs it)

  size, sharding, lo, hi = host_slice(config, mesh)
  train, evaluation = network_splits.network_splits(
    config, train_rows=size, eval_rows=size, eval_steps=config.eval_steps, eval_required=False
  )

  def global_batches(split: network_splits.SplitBatches) -> DataIterator:
    return DataIterator(split.host_batches(lo, hi), sharding, size, config.device_prefetch)

  return global_batches(train), None if evaluation is None else global_batches(evaluation)


def synthetic_host_rows(config: Config, mesh: Mesh) -> tuple[dict[str, np.ndarray], HostSlice]:
  """This process's rows of the synthetic batch, and where they go."""
  where = host_slice(config, mesh)
  host = synthetic.host_batch(where.global_rows, config.max_target_length, config.data_shuffle_seed)
  return {
    key: np.ascontiguousarray(value[where.lo : where.hi]) for key, value in host.items()
  }, where


def _synthetic(config: Config, mesh: Mesh):
  local, where = synthetic_host_rows(config, mesh)
  return synthetic.SyntheticIterator(to_global(local, where.sharding, where.global_rows)), None


def create_data_iterator(config: Config, mesh: Mesh):
  """(train iterator, eval iterator or None) of `config.dataset_type` (see `registry`)."""
  try:
    make = registry.factory(config.dataset_type)
  except KeyError:
    raise ConfigError(
      f"dataset_type={config.dataset_type!r} is not one of {', '.join(registry.dataset_types())}"
    ) from None
  return make(config, mesh)
