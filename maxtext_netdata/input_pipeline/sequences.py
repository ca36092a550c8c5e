"""Host batches of training sequences, built whole-batch at a time with numpy.

`BatchBuilder` turns global step s into the rows [s·B + lo, s·B + hi) of the global stream
(B = global batch size): for each row its contexts from the epoch plan (`contexts.py`), then
per context a mode, timestamps, an order and a field order, filled with whole measurements
until the next one would not fit (SPEC §3). The work is split into stages that can be timed
separately:

    gathered = builder.gather(step, lo, hi)   # plan lookup + reading the store's rows
    batch = builder.build(gathered)           # layout (layout.py), tokens, segments
    batch = transforms.shift_data(batch)      # targets shifted left (SPEC §4)

Every random choice is `contexts.random_bits` of (seed, epoch, plan row, context index,
measurement index, purpose), so a row is a pure function of its coordinates: any worker count,
restart point or host count gives the same rows.
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from maxtext_netdata.config import ConfigError
from maxtext_netdata.errors import DataError
from maxtext_netdata.format import tokenizer
from maxtext_netdata.format import tokens as tk
from maxtext_netdata.input_pipeline import contexts
from maxtext_netdata.input_pipeline import layout as layout_lib
from maxtext_netdata.input_pipeline.layout import Gathered, Layout, segment_starts

# With packing, each row also tries this many random one-probe filler contexts of at most
# FILLER_ROWS measurements in the space its own contexts leave: a row's own contexts stop at
# the first measurement that does not fit, which alone leaves ~1.6% padding (0.8% with them).
FILLERS = 3
FILLER_ROWS = 2
# Shortest measurement of each IP version (failed, no timestamp): bounds what can fit.
_MIN_LENGTH = {4: 12, 6: 36}
LONGEST_MEASUREMENT = 47  # IPv6 with an RTT and an absolute timestamp
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


def _take_rows(array: np.ndarray, index: np.ndarray) -> np.ndarray:
  """array[index] for a C-contiguous [N] or [N, 2 | 16] uint8/bool array, but gathering each row
  as one or two machine words (numpy's generic 2-D fancy indexing is ~5-10x slower)."""
  array = np.asarray(array)
  if array.ndim == 1:
    return np.take(array, index)
  width = array.shape[1]
  word = np.uint64 if width == 16 else np.uint16
  return np.take(array.view(word), index, axis=0).view(array.dtype).reshape(-1, width)


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
    if seq_len < LONGEST_MEASUREMENT:
      raise ConfigError(
        f"max_target_length={seq_len} is shorter than the longest measurement"
        f" ({LONGEST_MEASUREMENT} tokens), which is never cut"
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
    self._plans: dict[int, contexts.EpochPlan] = {}
    self._lock = threading.Lock()  # Grain's read threads share the builder

  @classmethod
  def from_config(cls, config, store, global_batch_size: int, **overrides) -> BatchBuilder:
    """A builder with the data keys of `config` (`overrides` win)."""
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
    return cls(store, **kwargs)

  def __getstate__(self):
    state = dict(self.__dict__)
    state["_plans"] = {}
    state.pop("stats", None)
    del state["_lock"]
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._lock = threading.Lock()

  @functools.cached_property
  def stats(self) -> contexts.ProbeStats:
    return contexts.probe_stats(self.store, self.mode_weights)

  def plan(self, epoch: int) -> contexts.EpochPlan:
    """The plan of `epoch` (cached)."""
    with self._lock:
      plan = self._plans.get(epoch)
      if plan is None:
        plan = contexts.plan_epoch(
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

  def gather(self, step: int, lo: int, hi: int) -> Gathered:
    """Rows [lo, hi) of global batch `step`: contexts and their candidate store rows."""
    epoch, step_in_epoch = divmod(step, self.steps_per_epoch)
    plan = self.plan(epoch)
    position = step_in_epoch * self.global_batch_size + np.arange(lo, hi)
    units = plan.order[position % plan.num_rows]
    num_rows = hi - lo
    first = plan.unit_offsets[units]
    per_row = plan.unit_offsets[units + 1] - first
    ctx_row = np.repeat(np.arange(num_rows), per_row)
    ctx_index = np.arange(len(ctx_row)) - np.repeat(segment_starts(per_row), per_row)
    plan_ctx = np.repeat(first, per_row) + ctx_index
    ctx_unit = units[ctx_row]
    ctx_probe = plan.ctx_probe[plan_ctx]
    ctx_start = plan.ctx_start[plan_ctx]
    ctx_end = plan.ctx_end[plan_ctx]
    version = np.asarray(self.store.probe_version)
    cap = self.seq_len // np.where(version[ctx_probe] == 4, _MIN_LENGTH[4], _MIN_LENGTH[6])
    if self.packing:
      filler_row = np.repeat(np.arange(num_rows), FILLERS)
      filler_index = np.tile(np.arange(FILLERS), num_rows) + per_row[filler_row]
      bits = contexts.random_bits(
        contexts.stream_key(self.seed, epoch, contexts.FILLER), units[filler_row], filler_index
      )
      filler_start = (bits % np.uint64(self.store.num_rows)).astype(np.int64)
      offsets = self.stats.offsets
      filler_probe = np.searchsorted(offsets, filler_start, side="right") - 1
      ctx_row = np.concatenate([ctx_row, filler_row])
      ctx_index = np.concatenate([ctx_index, filler_index])
      ctx_unit = np.concatenate([ctx_unit, units[filler_row]])
      ctx_probe = np.concatenate([ctx_probe, filler_probe])
      ctx_start = np.concatenate([ctx_start, filler_start])
      ctx_end = np.concatenate([ctx_end, offsets[filler_probe + 1]])
      cap = np.concatenate([cap, np.full(len(filler_row), FILLER_ROWS)])
    rounds = np.lexsort((ctx_row, ctx_index))
    ctx_row, ctx_index, ctx_unit = ctx_row[rounds], ctx_index[rounds], ctx_unit[rounds]
    ctx_probe, ctx_start, ctx_end, cap = (
      ctx_probe[rounds],
      ctx_start[rounds],
      ctx_end[rounds],
      cap[rounds],
    )
    ctx_count = np.maximum(np.minimum(ctx_end - ctx_start, cap), 1)
    round_bounds = np.searchsorted(ctx_index, np.arange(ctx_index.max(initial=-1) + 2))
    store_row = np.repeat(ctx_start - segment_starts(ctx_count), ctx_count) + np.arange(
      ctx_count.sum()
    )
    store = self.store
    return Gathered(
      num_rows=num_rows,
      epoch=epoch,
      ctx_row=ctx_row,
      ctx_index=ctx_index,
      ctx_unit=ctx_unit,
      ctx_count=ctx_count,
      ctx_version=version[ctx_probe],
      ctx_src=_take_rows(store.probe_src, ctx_probe),
      round_bounds=round_bounds,
      store_row=store_row,
      dst=_take_rows(store.dst, store_row),
      seconds=_take_rows(store.seconds, store_row),
      rtt_bytes=_take_rows(store.rtt_bytes, store_row),
      failed=_take_rows(store.failed, store_row),
      hashed_order=(
        _take_rows(store.hashed_order, store_row) if self.field_order == "hashed" else None
      ),
    )

  def layout(self, g: Gathered) -> Layout:
    """Modes, timestamps and the fill of every context; where each measurement goes."""
    return layout_lib.layout(
      g, seq_len=self.seq_len, seed=self.seed, mode_cdf=self.mode_cdf, field_order=self.field_order
    )

  def build(self, g: Gathered) -> dict[str, np.ndarray]:
    """The `inputs*` arrays (INPUT_KEYS, int32 [rows, seq_len]) of the host batch of `g`.

    Before ShiftData the targets equal the inputs, so `transforms.shift_data` makes them
    from these three arrays (and worker processes send only these).
    """
    lay = self.layout(g)
    rows, seq_len = g.num_rows, self.seq_len
    inputs = np.full((rows, seq_len), tk.PAD, dtype=np.int32)
    c = lay.candidate
    cand_ctx = np.repeat(np.arange(len(g.ctx_count)), g.ctx_count)[c]
    tokenizer.encode(
      src=_take_rows(g.ctx_src, cand_ctx),
      dst=_take_rows(g.dst, c),
      version=g.ctx_version[cand_ctx],
      rtt_bytes=_take_rows(g.rtt_bytes, c),
      failed=g.failed[c],
      ts_kind=lay.ts_kind,
      ts_value=lay.ts_value,
      order=lay.order,
      out=inputs.reshape(-1),
      positions=lay.position,
    )
    segmentation, position = _segments(g, lay, inputs, seq_len)
    return {"inputs": inputs, "inputs_segmentation": segmentation, "inputs_position": position}


def _segments(
  g: Gathered, lay: Layout, inputs: np.ndarray, seq_len: int
) -> tuple[np.ndarray, np.ndarray]:
  """Segment ids 1..k per row (0 on padding) and positions restarting at 0 per segment.

  Both are running sums over the flattened batch (a max-scan is ~7x slower than a sum-scan in
  numpy): each segment start holds the step from the previous segment's id (1, or 1 - k at a
  row's first after a row of k segments), resp. 1 minus its distance from the previous start
  (every other token holding 1), then padding is zeroed.
  """
  emitted = np.flatnonzero(lay.ctx_used > 0)
  by_row = emitted[np.argsort(g.ctx_row[emitted], kind="stable")]
  rows = g.ctx_row[by_row]
  flat_start = rows * seq_len + lay.ctx_offset[by_row]
  row_first = np.flatnonzero(np.diff(rows, prepend=-1))
  segment_id = np.arange(len(by_row)) - np.repeat(row_first, np.diff(row_first, append=len(by_row)))
  size = g.num_rows * seq_len
  segmentation = np.zeros(size, dtype=np.int32)
  segmentation[flat_start] = np.diff(segment_id + 1, prepend=0)
  np.cumsum(segmentation, out=segmentation)
  position = np.ones(size, dtype=np.int32)
  position[flat_start] = 1 - np.diff(flat_start, prepend=0)
  np.cumsum(position, out=position)
  position -= 1
  padding = inputs.reshape(-1) == tk.PAD
  np.copyto(segmentation, 0, where=padding)
  np.copyto(position, 0, where=padding)
  return segmentation.reshape(g.num_rows, seq_len), position.reshape(g.num_rows, seq_len)
