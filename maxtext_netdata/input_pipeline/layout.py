"""Per-context decisions of a host batch: mode, timestamps, fill and order of measurements.

Input: the contexts of a batch's rows and their candidate measurements (`Gathered`, read from
the store by `BatchBuilder.gather`). Output: which candidates each context takes and where
each goes in the [rows, seq_len] batch (`Layout`), before any token is written.

Contexts are processed in rounds (all first contexts of the rows, then all second ...): a
context takes its candidates in time order while they fit in what earlier contexts of its
row left, and stops at the first that does not (SPEC §3: never cut a measurement).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from maxtext_netdata.format import tokenizer
from maxtext_netdata.format import tokens as tk
from maxtext_netdata.input_pipeline import contexts

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
  key = functools.partial(contexts.stream_key, seed, g.epoch)
  # Per context: field 0 picks the mode, field 1 the share of dropped timestamps.
  ctx_bits = contexts.random_bits(key(contexts.CONTEXT), g.ctx_unit, g.ctx_index)
  ctx_mode = np.searchsorted(mode_cdf, contexts.fraction(ctx_bits, 0), side="right")
  drop_fraction = 0.1 + 0.8 * contexts.fraction(ctx_bits, 1)
  count = g.ctx_count
  first = segment_starts(count)
  cand_ctx = np.repeat(np.arange(len(count)), count)
  cand_j = np.arange(len(cand_ctx)) - first[cand_ctx]
  unit, index = g.ctx_unit[cand_ctx], g.ctx_index[cand_ctx]
  mode = ctx_mode[cand_ctx]
  # Per measurement: field 0 drops its timestamp, field 1 places it when shuffled, the top
  # bits choose its field order.
  bits = contexts.random_bits(key(contexts.MEASUREMENT), unit, index, cand_j)
  kept = contexts.fraction(bits, 0) >= drop_fraction[cand_ctx]
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
  draw = contexts.fraction(bits[taken], 1)
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
