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

import dataclasses
import functools
import threading

import numpy as np

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
  """The rows of one host batch: their epoch's plan and the plan row of each."""

  epoch: int
  plan: epoch_plan.EpochPlan
  plan_rows: np.ndarray  # int64 [rows]


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
      dst=np.asarray(store.dst),
      seconds=np.asarray(store.seconds),
      rtt_bytes=rtt_bytes,
      failed=np.asarray(store.failed),
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
    """Rows [lo, hi) of global batch `step`: their epoch and plan rows."""
    epoch, step_in_epoch = divmod(step, self.steps_per_epoch)
    plan = self.plan(epoch)
    position = step_in_epoch * self.global_batch_size + np.arange(lo, hi)
    return BatchRows(epoch=epoch, plan=plan, plan_rows=plan.order[position % plan.num_rows])

  def _warm_kernel(self) -> None:
    """`fill_batch` called on a batch of no rows, with the argument types of every batch:
    compiles (or loads) the kernel's variant the batches use, on `load_in_background`'s
    thread. Epoch 0's plan, made here, is the one the first batch needs."""
    try:
      rows = self.gather(0, 0, 0)
    except DataError:
      return  # the batches raise it
    empty = batch_kernel.empty_output((0, self.seq_len))
    batch_kernel.fill_batch(*self._kernel_args(rows, (empty,) * len(KEYS)), False)

  def _kernel_args(self, rows: BatchRows, arrays) -> tuple:
    """`fill_batch`'s arguments but `shifted`, as plain tuples (its dispatch), the store's
    built once."""
    plan = rows.plan
    contexts = (plan.context_offsets, plan.context_probe, plan.context_start, plan.context_end)
    settings = tuple(self._settings_of(rows.epoch))
    return rows.plan_rows, contexts, self._store_tuple, settings, tuple(arrays)

  def _fill(self, rows: BatchRows, shifted: bool) -> dict[str, np.ndarray]:
    shape = (len(rows.plan_rows), self.seq_len)
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
