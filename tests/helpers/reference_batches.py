"""A plain numpy reference of the batch kernel's semantics (input_pipeline/batch_kernel.py).

The whole-batch numpy builder the kernel replaced, kept as its reference (a different
algorithm: no shared code beyond `rng` and the tokenizer): gather every candidate
measurement of every context of the batch, decide modes, timestamps and the fill round by
round (all first contexts of the rows, then all second ...), sort, encode with the
vectorized tokenizer, then segment ids and positions. `gather(builder, step, lo, hi)` and
`build(builder, gathered)` take a `BatchBuilder` for its parameters only; `build` returns the
three inputs arrays and the `Layout` (where each measurement went), which tests use to check
a batch against the store.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from maxtext_netdata.format import tokenizer
from maxtext_netdata.format import tokens as tk
from maxtext_netdata.input_pipeline import rng, sequences

FULL, PARTIAL, NONE = 0, 1, 2
_TS_LENGTH = np.array([0, 9, 2, 5], dtype=np.int32)
_FIXED_ORDER = 0  # PERMUTATIONS[0] is src, dst, result, timestamp


@dataclasses.dataclass
class Gathered:
  """Rows of one host batch with every candidate measurement read from the store.

  Contexts are in round-major order (all first contexts of the rows, then all second ...);
  candidates are the first `ctx_count[c]` rows of each context, laid end to end.
  """

  num_rows: int
  epoch: int
  ctx_row: np.ndarray  # int64 [C] row of the batch
  ctx_index: np.ndarray  # int64 [C] index of the context within its row
  ctx_unit: np.ndarray  # int64 [C] plan row (the random key of the row)
  ctx_count: np.ndarray  # int64 [C] candidates
  ctx_version: np.ndarray  # uint8 [C]
  ctx_src: np.ndarray  # uint8 [C, 16]
  round_bounds: np.ndarray  # int64 [R+1] contexts of round k: [round_bounds[k], ..[k+1])
  store_row: np.ndarray  # int64 [M] candidate rows
  dst: np.ndarray  # uint8 [M, 16]
  seconds: np.ndarray  # int64 [M]
  rtt_bytes: np.ndarray  # uint8 [M, 2]
  failed: np.ndarray  # bool [M]
  hashed_order: np.ndarray | None  # uint8 [M, 2]


@dataclasses.dataclass
class Layout:
  """Where each taken measurement goes, in sequence order."""

  store_row: np.ndarray  # int64 [T]
  candidate: np.ndarray  # int64 [T] index into the Gathered candidates
  position: np.ndarray  # int64 [T] flat start in the [rows, seq_len] batch
  ts_kind: np.ndarray  # uint8 [T]
  ts_value: np.ndarray  # int64 [T]
  order: np.ndarray  # uint8 [T]
  ctx_mode: np.ndarray  # int64 [C] mode of each context
  ctx_offset: np.ndarray  # int64 [C] start of the context in its row
  ctx_used: np.ndarray  # int64 [C] tokens of the context (0: not emitted)


def segment_starts(counts: np.ndarray) -> np.ndarray:
  """Index of the first element of each of consecutive segments of `counts` elements."""
  starts = np.zeros(len(counts), dtype=np.int64)
  np.cumsum(counts[:-1], out=starts[1:])
  return starts


def layout(g: Gathered, *, seq_len: int, seed: int, mode_cdf, field_order: str) -> Layout:
  """Modes, timestamps and the fill of every context of `g`; where each measurement goes.

  `mode_cdf`: cumulative weights of full and partial (none takes the rest).
  """
  key = functools.partial(rng.stream_key, seed, g.epoch)
  # Per context: field 0 picks the mode, field 1 the share of dropped timestamps.
  ctx_bits = rng.random_bits(key(rng.CONTEXT), g.ctx_unit, g.ctx_index)
  ctx_mode = np.searchsorted(mode_cdf, rng.fraction(ctx_bits, 0), side="right")
  drop_fraction = 0.1 + 0.8 * rng.fraction(ctx_bits, 1)
  count = g.ctx_count
  first = segment_starts(count)
  cand_ctx = np.repeat(np.arange(len(count)), count)
  cand_j = np.arange(len(cand_ctx)) - first[cand_ctx]
  unit, index = g.ctx_unit[cand_ctx], g.ctx_index[cand_ctx]
  mode = ctx_mode[cand_ctx]
  # Per measurement: field 0 drops its timestamp, field 1 places it when shuffled, the top
  # bits choose its field order.
  bits = rng.random_bits(key(rng.MEASUREMENT), unit, index, cand_j)
  kept = rng.fraction(bits, 0) >= drop_fraction[cand_ctx]
  has_ts = (mode == FULL) | ((mode == PARTIAL) & kept)
  ts_kind, ts_value = tokenizer.timestamp_kinds(g.seconds, has_ts, cand_j == 0)
  version = g.ctx_version[cand_ctx]
  length = tokenizer.measurement_lengths(version, g.failed, ts_kind).astype(np.int64)
  within = np.cumsum(length)
  within -= np.repeat(within[first] - length[first], count)
  dropped = (~has_ts).astype(np.int64)
  dropped_within = np.cumsum(dropped)
  dropped_within -= np.repeat(dropped_within[first] - dropped[first], count)

  taken_count = np.zeros(len(count), dtype=np.int64)
  ctx_offset = np.zeros(len(count), dtype=np.int64)
  ctx_used = np.zeros(len(count), dtype=np.int64)
  remaining = np.full(g.num_rows, seq_len, dtype=np.int64)
  for k in range(len(g.round_bounds) - 1):
    c0, c1 = g.round_bounds[k], g.round_bounds[k + 1]
    if c0 == c1:
      continue
    rows = g.ctx_row[c0:c1]
    room = remaining[rows]
    m0, m1 = first[c0], first[c1 - 1] + count[c1 - 1]
    fits = within[m0:m1] <= np.repeat(room, count[c0:c1])
    n = np.add.reduceat(fits, first[c0:c1] - m0, dtype=np.int64)
    last = first[c0:c1] + n - 1
    emitted = n > 0
    used = np.where(emitted, within[np.maximum(last, 0)], 0)
    # A partial context with no dropped timestamp among its taken measurements loses the
    # last one's: that changes no other measurement's timestamp and only frees space.
    fix = emitted & (ctx_mode[c0:c1] == PARTIAL) & (dropped_within[np.maximum(last, 0)] == 0)
    fixed = last[fix]
    used[fix] -= _TS_LENGTH[ts_kind[fixed]]
    length[fixed] -= _TS_LENGTH[ts_kind[fixed]]
    has_ts[fixed] = False
    ts_kind[fixed] = tk.TS_NONE
    ts_value[fixed] = 0
    taken_count[c0:c1] = n
    ctx_offset[c0:c1] = seq_len - room
    ctx_used[c0:c1] = used
    remaining[rows] = room - used

  taken = np.flatnonzero(cand_j < taken_count[cand_ctx])
  t_ctx = cand_ctx[taken]
  t_j = cand_j[taken]
  t_mode = ctx_mode[t_ctx]
  sort_key = t_j.astype(np.float64)
  shuffled = (t_mode == NONE) | ((t_mode == PARTIAL) & ~has_ts[taken])
  draw = rng.fraction(bits[taken], 1)
  sort_key[shuffled] = (draw * taken_count[t_ctx])[shuffled]
  # Timsort on a mostly ascending key: `full` contexts are already runs.
  sort_key += t_ctx * (seq_len + 1.0)
  in_sequence = taken[np.argsort(sort_key, kind="stable")]
  s_ctx = cand_ctx[in_sequence]
  s_length = length[in_sequence]
  before = np.cumsum(s_length) - s_length
  s_first = segment_starts(taken_count)
  before -= np.repeat(before[s_first[taken_count > 0]], taken_count[taken_count > 0])
  position = g.ctx_row[s_ctx] * seq_len + ctx_offset[s_ctx] + before

  if field_order == "random":
    order = tokenizer.random_orders(bits[in_sequence] >> np.uint64(42))  # above fields 0, 1
  elif field_order == "fixed":
    order = np.full(len(in_sequence), _FIXED_ORDER, dtype=np.uint8)
  else:
    order = g.hashed_order[in_sequence, has_ts[in_sequence].astype(np.intp)]
  return Layout(
    store_row=g.store_row[in_sequence],
    candidate=in_sequence,
    position=position,
    ts_kind=ts_kind[in_sequence],
    ts_value=ts_value[in_sequence],
    order=order,
    ctx_mode=ctx_mode,
    ctx_offset=ctx_offset,
    ctx_used=ctx_used,
  )


def _take_rows(array: np.ndarray, index: np.ndarray) -> np.ndarray:
  """array[index] for a C-contiguous [N] or [N, 2 | 16] uint8/bool array, but gathering each row
  as one or two machine words (numpy's generic 2-D fancy indexing is ~5-10x slower)."""
  array = np.asarray(array)
  if array.ndim == 1:
    return np.take(array, index)
  width = array.shape[1]
  word = np.uint64 if width == 16 else np.uint16
  return np.take(array.view(word), index, axis=0).view(array.dtype).reshape(-1, width)


def gather(builder, step: int, lo: int, hi: int) -> Gathered:
  """Rows [lo, hi) of global batch `step`: contexts and their candidate store rows."""
  epoch, step_in_epoch = divmod(step, builder.steps_per_epoch)
  plan = builder.plan(epoch)
  position = step_in_epoch * builder.global_batch_size + np.arange(lo, hi)
  units = plan.rows_at(position % plan.num_rows)
  num_rows = hi - lo
  context_offsets, ctx_probe, ctx_start, ctx_end = plan.contexts(units)
  per_row = np.diff(context_offsets)
  ctx_row = np.repeat(np.arange(num_rows), per_row)
  ctx_index = np.arange(len(ctx_row)) - np.repeat(segment_starts(per_row), per_row)
  ctx_unit = units[ctx_row]
  version = np.asarray(builder.store.probe_version)
  cap = builder.seq_len // np.where(
    version[ctx_probe] == 4, tk.SHORTEST_MEASUREMENT[4], tk.SHORTEST_MEASUREMENT[6]
  )
  if builder.packing:
    filler_row = np.repeat(np.arange(num_rows), sequences.FILLERS)
    filler_index = np.tile(np.arange(sequences.FILLERS), num_rows) + per_row[filler_row]
    bits = rng.random_bits(
      rng.stream_key(builder.seed, epoch, rng.FILLER), units[filler_row], filler_index
    )
    filler_start = (bits % np.uint64(builder.store.num_rows)).astype(np.int64)
    offsets = builder.stats.offsets
    filler_probe = np.searchsorted(offsets, filler_start, side="right") - 1
    ctx_row = np.concatenate([ctx_row, filler_row])
    ctx_index = np.concatenate([ctx_index, filler_index])
    ctx_unit = np.concatenate([ctx_unit, units[filler_row]])
    ctx_probe = np.concatenate([ctx_probe, filler_probe])
    ctx_start = np.concatenate([ctx_start, filler_start])
    ctx_end = np.concatenate([ctx_end, offsets[filler_probe + 1]])
    cap = np.concatenate([cap, np.full(len(filler_row), sequences.FILLER_ROWS)])
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
  store = builder.store
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
      _take_rows(store.hashed_order, store_row) if builder.field_order == "hashed" else None
    ),
  )


def build(builder, g: Gathered) -> tuple[dict[str, np.ndarray], Layout]:
  """The `inputs*` arrays (INPUT_KEYS, int32 [rows, seq_len]) of the host batch of `g`.

  Before ShiftData the targets equal the inputs, so `transforms.shift_data` makes them
  from these three arrays (and worker processes send only these).
  """
  lay = layout(
    g,
    seq_len=builder.seq_len,
    seed=builder.seed,
    mode_cdf=builder.mode_cdf,
    field_order=builder.field_order,
  )
  rows, seq_len = g.num_rows, builder.seq_len
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
  return {"inputs": inputs, "inputs_segmentation": segmentation, "inputs_position": position}, lay


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


def shift(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """MaxText's ShiftData on the three inputs arrays, whole-array numpy (docs/spec.md §4)."""
  targets = np.full_like(batch["inputs"], tk.PAD)
  targets[:, :-1] = batch["inputs"][:, 1:]
  segmentation = np.zeros_like(batch["inputs_segmentation"])
  segmentation[:, :-1] = batch["inputs_segmentation"][:, 1:]
  segmentation[targets == tk.PAD] = 0
  return {
    **batch,
    "targets": targets,
    "targets_segmentation": segmentation,
    "targets_position": batch["inputs_position"].copy(),
  }
