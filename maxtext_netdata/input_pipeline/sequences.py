"""Host batches of training sequences, one compiled pass per batch.

`BatchBuilder` turns global step s into the rows [s·B + lo, s·B + hi) of the global stream
(B = global batch size): each row is a plan row of the epoch plan (`epoch_plan.py`), and
`batch_kernel.fill_batch` writes the batch from the plan rows and the store in one pass (per
context a mode, timestamps, an order and a field order, filled with whole measurements until
the next one would not fit, docs/spec.md §3). Stages that can be timed separately:

    rows = builder.gather(step, lo, hi)       # epoch and plan rows of the batch's rows
    batch = builder.build(rows)               # the three inputs arrays (what workers send)
    batch = builder.build_shifted(rows)       # all six arrays, ShiftData included (docs/spec.md §4)

Every random choice is `rng.random_bits` of (seed, epoch, plan row, context index,
measurement index, purpose), so a row is a pure function of its coordinates: any worker count,
restart point or host count gives the same rows.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading

import numpy as np

from maxtext_netdata.data.store import read_ahead
from maxtext_netdata.errors import ConfigError, DataError
from maxtext_netdata.format import tokens as tk
from maxtext_netdata.input_pipeline import (
  batch_kernel,
  batch_kernel_loading,
  buffers,
  epoch_plan,
  rng,
)

# With packing, each row also tries this many random one-probe filler contexts of at most
# FILLER_ROWS measurements in the space its own contexts leave: a row's own contexts stop at
# the first measurement that does not fit, which alone leaves ~1.6% padding (0.8% with them).
FILLERS = 3
FILLER_ROWS = 2
# Counters of a row's random draws stay below rng.COUNTER_LIMIT up to this length: a row holds
# at most max_target_length // 12 plan contexts (each takes at least one shortest measurement),
# then FILLERS fillers, and a context at most max_target_length // 12 measurements.
MAX_SEQ_LEN = tk.SHORTEST_MEASUREMENT[4] * (rng.COUNTER_LIMIT - FILLERS + 1) - 1
_PLAN_CACHE = 2  # epochs whose plan a builder keeps (the current one and its neighbour)
# From a store read at random: the batches ahead of the one being built whose store rows are
# asked for (`BatchBuilder.read_ahead`).
READ_AHEAD_STEPS = 4
# ... and of each row's fillers, the first: at 32 x 1024 on a 60M-row store, 34% of the rows
# took their first filler, 1.4% a second, 0.3% a third; asking for the first besides the
# contexts gave 1.2x the batches, asking for all three read 1.18x the bytes for no more.
READ_AHEAD_FILLERS = 1

KEYS = (
  "inputs",
  "inputs_segmentation",
  "inputs_position",
  "targets",
  "targets_segmentation",
  "targets_position",
)
INPUT_KEYS = KEYS[:3]  # what `build` makes; ShiftData derives the targets from them
_PERMUTATIONS = batch_kernel.permutations()


@dataclasses.dataclass(frozen=True)
class BatchRows:
  """The rows of one host batch: their epoch's plan and the stream position of each in the
  epoch (the kernel finds their plan rows)."""

  epoch: int
  plan: epoch_plan.EpochPlan
  positions: np.ndarray  # int64 [rows], each in [0, plan.num_rows)

  @functools.cached_property
  def plan_rows(self) -> np.ndarray:
    """The plan row of each row (int64 [rows])."""
    return self.plan.rows_at(self.positions)


class BatchBuilder:
  """Host batches of one prepared split.

  Pickles as its parameters and the store's path; plans and store arrays are opened lazily
  in each process.
  """

  def __init__(
    self,
    store,
    *,
    seq_len: int,
    global_batch_size: int,
    seed: int,
    packing: bool,
    shuffle: bool,
    mode_weights,
    field_order: str,
    num_epoch: int,
  ):
    if global_batch_size < 1:
      raise ValueError(f"global batch size {global_batch_size} must be positive")
    if seq_len < tk.LONGEST_MEASUREMENT:
      raise ConfigError(
        f"max_target_length={seq_len} is shorter than the longest measurement"
        f" ({tk.LONGEST_MEASUREMENT} tokens), which is never cut"
      )
    if seq_len > MAX_SEQ_LEN:
      raise ConfigError(
        f"max_target_length={seq_len} is above {MAX_SEQ_LEN}: the random draws of a sequence"
        f" count its contexts and measurements in {rng.COUNTER_BITS} bits each, and longer"
        " sequences would repeat draws"
      )
    if field_order == "hashed" and store.hashed_order is None:
      raise DataError(
        f"{store.path}: network_field_order=hashed needs a store prepared with it; run"
        " prepare again"
      )
    self.store = store
    self.seq_len = seq_len
    self.global_batch_size = global_batch_size
    self.seed = seed
    self.packing = packing
    self.shuffle = shuffle
    weights = np.asarray(mode_weights, dtype=np.float64)
    self.mode_weights = weights / weights.sum()
    self.mode_cdf = np.cumsum(self.mode_weights)[:2]
    self.field_order = field_order
    self.num_epoch = num_epoch
    self._plans: dict[int, epoch_plan.EpochPlan] = {}
    self._settings: dict[int, batch_kernel.Settings] = {}
    self._lock = threading.Lock()  # Grain's read threads share the builder
    # Read-ahead from a store read at random (`gather`): by (lo, hi), the last steps gathered
    # (the last one is being built) and the last step asked for; the thread that asks, made
    # with the first batch.
    self._recent: dict[tuple[int, int], collections.deque] = {}
    self._asked: dict[tuple[int, int], int] = {}
    self._reader: read_ahead.ReadAhead | None = None
    self._buffers = buffers.OutputPool()  # batches' memory, reused once they are released
    batch_kernel_loading.load_in_background(
      self._warm_kernel
    )  # while plans, JAX and the model get ready

  @classmethod
  def from_config(cls, config, store, global_batch_size: int, **overrides) -> BatchBuilder:
    """A builder with the data keys of `config` (`overrides` win); `store` read the way
    `network_store_access` says (`PreparedStore.with_access`)."""
    kwargs = dict(
      seq_len=config.max_target_length,
      global_batch_size=global_batch_size,
      seed=config.data_shuffle_seed,
      packing=config.packing,
      shuffle=config.enable_data_shuffling,
      mode_weights=config.network_mode_weights,
      field_order=config.network_field_order,
      num_epoch=config.num_epoch,
    )
    kwargs.update(overrides)
    return cls(store.with_access(config.network_store_access), **kwargs)

  def __getstate__(self):
    state = dict(self.__dict__)
    state["_plans"] = {}
    state["_settings"] = {}
    state.update(_recent={}, _asked={}, _reader=None)
    state.pop("stats", None)
    state.pop("_store_columns", None)
    del state["_lock"]
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._lock = threading.Lock()

  @functools.cached_property
  def stats(self) -> epoch_plan.ProbeStats:
    return epoch_plan.probe_stats(self.store, self.mode_weights)

  def plan(self, epoch: int) -> epoch_plan.EpochPlan:
    """The plan of `epoch` (cached)."""
    with self._lock:
      plan = self._plans.get(epoch)
      if plan is None:
        plan = epoch_plan.plan_epoch(
          self.stats,
          seq_len=self.seq_len,
          seed=self.seed,
          epoch=epoch,
          packing=self.packing,
          shuffle=self.shuffle,
        )
        while len(self._plans) >= _PLAN_CACHE:
          self._plans.pop(next(iter(self._plans)))
        self._plans[epoch] = plan
      return plan

  @functools.cached_property
  def steps_per_epoch(self) -> int:
    """Global steps of one epoch: epoch 0's rows // global batch (the remainder is dropped).

    Later epochs (whose jittered plans have a few rows more or fewer) use the same count,
    dropping their extra rows or wrapping around to their first ones.
    """
    rows = self.plan(0).num_rows
    steps = rows // self.global_batch_size
    if steps == 0:
      raise DataError(
        f"{self.store.path}: {rows} sequences per epoch, fewer than one global batch of"
        f" {self.global_batch_size}"
      )
    return steps

  @property
  def num_steps(self) -> int | None:
    """Steps of all epochs; None when `num_epoch` is -1 (forever)."""
    if self.num_epoch < 0:
      return None
    return self.steps_per_epoch * self.num_epoch

  @functools.cached_property
  def _store_columns(self) -> batch_kernel.StoreColumns:
    """The store arrays the kernel reads, as plain ndarrays (memory maps stay lazy)."""
    store = self.store
    rtt_bytes = np.asarray(store.rtt_bytes)
    hashed = np.asarray(store.hashed_order) if self.field_order == "hashed" else rtt_bytes
    return batch_kernel.StoreColumns(
      probe_offsets=np.asarray(self.stats.offsets),
      probe_version=np.asarray(store.probe_version),
      probe_src=np.asarray(store.probe_src),
      dst_table=np.asarray(store.dst_table),
      dst_index=np.asarray(store.dst_index),
      seconds=np.asarray(store.seconds),
      rtt_bytes=rtt_bytes,
      hashed_order=hashed,
    )

  @functools.cached_property
  def _store_tuple(self) -> tuple:
    return tuple(self._store_columns)

  def _settings_of(self, epoch: int) -> batch_kernel.Settings:
    """The kernel's settings for the batches of `epoch` (the last epoch's kept: its stream
    keys take ~70 us, as much as the pass over a small batch)."""
    settings = self._settings.get(epoch)
    if settings is None:
      purposes = (rng.CONTEXT, rng.MEASUREMENT, rng.FILLER)
      settings = batch_kernel.Settings(
        keys=np.concatenate([rng.stream_key(self.seed, epoch, p) for p in purposes]),
        mode_cdf=self.mode_cdf,
        field_order=batch_kernel.FIELD_ORDERS[self.field_order],
        fillers=FILLERS if self.packing else 0,
        filler_rows=FILLER_ROWS,
        permutations=_PERMUTATIONS,
      )
      self._settings = {epoch: settings}
    return settings

  def gather(self, step: int, lo: int, hi: int) -> BatchRows:
    """Rows [lo, hi) of global batch `step`: their epoch and plan rows. From a store read at
    random (larger than memory, `network_store_access`), the store rows of the same rows of
    the next READ_AHEAD_STEPS batches are asked for too, on a thread (`read_ahead`)."""
    if self.store.access == "random" and hi > lo:
      self._read_ahead_next(step, lo, hi)
    return self._rows(step, lo, hi)

  def _read_ahead_next(self, step: int, lo: int, hi: int) -> list[int]:
    """Hands the read-ahead thread the next READ_AHEAD_STEPS batches this process will build
    after `step`, those not handed over yet, and returns them: the steps `stride` apart,
    `stride` the least gap between the last steps it gathered (1 in-process; a Grain worker
    builds every worker-count-th batch, and asks for its own batches only)."""
    key = (lo, hi)
    num_steps = self.num_steps  # before the lock: the first call plans the epoch, under it
    with self._lock:
      recent = self._recent.setdefault(key, collections.deque(maxlen=8))
      recent.append(step)
      seen = sorted(set(recent))
      stride = min((b - a for a, b in zip(seen, seen[1:], strict=False)), default=1)
      last = step + stride * READ_AHEAD_STEPS
      asked = self._asked.get(key, step)
      if not step <= asked <= last:  # a jump (a new iterator, a resume): start again
        asked = step
      steps = [s for s in range(step + stride, last + 1, stride) if s > asked]
      if num_steps is not None:
        steps = [s for s in steps if s < num_steps]
      self._asked[key] = max(asked, last)
      if self._reader is None:
        self._reader = read_ahead.ReadAhead()
    if steps:
      self._reader.submit(functools.partial(self.read_ahead, steps, lo, hi))
    return steps

  def read_ahead(self, steps: list[int], lo: int, hi: int) -> int:
    """Asks the kernel to read into page cache, without waiting, the store rows that rows
    [lo, hi) of batches `steps` may read (`context_rows`; `read_ahead.will_need`), but those
    of batches this process builds already: from a store larger than memory each batch's
    rows then arrive together while the batches before it are built, instead of one page
    fault at a time as the batch kernel reads them. Returns the page runs asked for."""
    names = ("dst_index", "seconds", "rtt_bytes")
    names += ("hashed_order",) if self.field_order == "hashed" else ()
    arrays = [getattr(self.store, name) for name in names]
    recent = self._recent.get((lo, hi)) or (-1,)
    runs = 0
    for step in steps:
      if step > recent[-1]:  # not being built yet
        runs += read_ahead.will_need(arrays, *self.context_rows(self._rows(step, lo, hi)))
    return runs

  def context_rows(
    self, rows: BatchRows, fillers: int = READ_AHEAD_FILLERS
  ) -> tuple[np.ndarray, np.ndarray]:
    """(first, stop) store rows the batch kernel may read for `rows`: of each plan context,
    from its start, at most as many measurements as a sequence holds; with packing, of the
    first `fillers` fillers of each row (a row reads its fillers only when its own contexts
    leave room; with FILLERS, every row the batch may read)."""
    offsets, probe, start, end = rows.plan.contexts(rows.plan_rows)
    counts = np.diff(offsets)
    version = np.asarray(self.store.probe_version)[probe]
    shortest = np.where(version == 4, tk.SHORTEST_MEASUREMENT[4], tk.SHORTEST_MEASUREMENT[6])
    count = np.maximum(np.minimum(end - start, self.seq_len // shortest), 1)
    if not self.packing:
      return start, start + count
    # The fillers each row may try (`batch_kernel._filler`): a random store row, at most
    # FILLER_ROWS from it, within its probe.
    key = self._settings_of(rows.epoch).keys[2:3]
    k = counts[:, None] + np.arange(fillers)
    plan_rows = np.broadcast_to(rows.plan_rows[:, None], k.shape)
    filler = rng.random_bits(key, plan_rows, k, 0) % np.uint64(self.store.num_rows)
    filler = filler.astype(np.int64).ravel()
    offsets = self.stats.offsets
    probe_end = offsets[np.searchsorted(offsets, filler, side="right")]
    filler_stop = np.minimum(probe_end, filler + FILLER_ROWS)
    return np.r_[start, filler], np.r_[start + count, filler_stop]

  def _rows(self, step: int, lo: int, hi: int) -> BatchRows:
    epoch, step_in_epoch = divmod(step, self.steps_per_epoch)
    plan = self.plan(epoch)
    position = step_in_epoch * self.global_batch_size + np.arange(lo, hi)
    return BatchRows(epoch=epoch, plan=plan, positions=position % plan.num_rows)

  def _warm_kernel(self) -> None:
    """`fill_batch` called on a batch of no rows, with the argument types of every batch:
    compiles (or loads) the kernel's variant the batches use, on `load_in_background`'s
    thread. Epoch 0's plan, made here, is the one the first batch needs. A store read at
    random then also loads `plan_order.rows_at`, which its read-ahead calls."""
    try:
      rows = self.gather(0, 0, 0)
    except DataError:
      return  # the batches raise it
    empty = batch_kernel.empty_output((0, self.seq_len))
    batch_kernel.fill_batch(*self._kernel_args(rows, (empty,) * len(KEYS)), False)
    if self.store.access == "random":
      rows.plan.rows_at(rows.positions)  # the read-ahead's plan rows (`context_rows`)

  def _kernel_args(self, rows: BatchRows, arrays) -> tuple:
    """`fill_batch`'s arguments but `shifted`, as plain tuples (its dispatch), the store's
    built once."""
    settings = tuple(self._settings_of(rows.epoch))
    return rows.positions, rows.plan.kernel_plan, self._store_tuple, settings, tuple(arrays)

  def _fill(self, rows: BatchRows, shifted: bool) -> dict[str, np.ndarray]:
    shape = (len(rows.positions), self.seq_len)
    names = KEYS if shifted else INPUT_KEYS
    out = dict(zip(names, self._buffers.take(shape, len(names)), strict=True))
    inputs = [out[key] for key in INPUT_KEYS]
    targets = [out[key] for key in KEYS[3:]] if shifted else inputs
    try:
      batch_kernel_loading.fill_batch_now()(*self._kernel_args(rows, (*inputs, *targets)), shifted)
    except ValueError as e:  # the kernel checks what it reads from the store
      raise DataError(f"{self.store.path}: {e}") from None
    return out

  def build(self, rows: BatchRows) -> dict[str, np.ndarray]:
    """The `inputs*` arrays (INPUT_KEYS, int32 [rows, seq_len]) of the host batch `rows`.

    Before ShiftData the targets equal the inputs, so `transforms.shift_data` makes them from
    these three arrays (worker processes send only these).
    """
    return self._fill(rows, shifted=False)

  def build_shifted(self, rows: BatchRows) -> dict[str, np.ndarray]:
    """All six arrays (KEYS) of the host batch `rows`, ShiftData included, in one pass:
    equal to `transforms.shift_data(self.build(rows))`."""
    return self._fill(rows, shifted=True)
