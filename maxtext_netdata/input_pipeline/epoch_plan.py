"""The epoch plan: which contexts of which probes make up each row of an epoch.

Every probe's time-sorted rows are cut into *pieces*. A probe's grid of pieces has a stride of
`stride` rows (the rows that fill about one sequence, from the probe's mean measurement length)
and a jittered phase drawn from (seed, epoch, probe), so the boundaries move between epochs:

    [0, j) head | [j, j+s) long | [j+s, j+2s) long | ... | tail [.., n)

A *long* piece becomes a row of its own whose context fills from the piece start until the
sequence is full (it may read past the piece end, never past the probe end). Heads, tails and
probes shorter than a stride are *short*: with packing they are grouped into *units* (first
fit over a seeded permutation, by estimated tokens) whose contexts each stop at their piece
end; without packing each short piece is a padded row. Either way every measurement belongs to
exactly one piece, so one epoch covers every measurement about once (a long context reads a
few rows more or fewer than its stride, depending on its mode).

Rows are then ordered by a seeded permutation (`enable_data_shuffling`), or by their first row
in the store. The plan depends only on (store, seed, epoch, max_target_length, packing), never
on workers, hosts or restarts.

This module also holds the counter-based randomness used by the whole pipeline: splitmix64
over uint64 counters, vectorized, so any row's random choices are computed directly from its
coordinates without a generator object.
"""

from __future__ import annotations

import dataclasses

import numpy as np

# Purposes of random draws; each keeps its own stream of the counter-based hash. CONTEXT and
# MEASUREMENT draws are split into 21-bit fields (`fraction`) for their several choices.
JITTER, SHUFFLE, PACK_ORDER, CONTEXT, MEASUREMENT, FILLER = range(6)
_FIELD_BITS = 21

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)

# Tokens of a measurement without timestamp (SPEC §2) and a timestamp's mean cost by mode.
_BASE_LENGTH = {4: 14, 6: 38}
_FAILED_SAVING = 2
_DELTA1_LENGTH, _DELTA4_LENGTH = 2, 5


def splitmix64(x: np.ndarray) -> np.ndarray:
  """The splitmix64 finalizer of uint64 array `x` (a bijection with good avalanche).

  Array arithmetic wraps modulo 2**64 (numpy warns only for scalars, so callers pass arrays).
  """
  z = x + _GOLDEN
  z = (z ^ (z >> np.uint64(30))) * _M1
  z = (z ^ (z >> np.uint64(27))) * _M2
  return z ^ (z >> np.uint64(31))


def stream_key(seed: int, epoch: int, purpose: int) -> np.ndarray:
  """A uint64 [1] key naming one stream of draws of one (seed, epoch)."""
  key = np.zeros(1, dtype=np.uint64)
  for part in (seed, epoch, purpose):
    key = splitmix64(key ^ np.array([part & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
  return key


def random_bits(key: np.ndarray, row, context=0, index=0) -> np.ndarray:
  """uint64 random bits of `key` at each (row, context, index) of the broadcast arguments.

  The three counters are packed into one word (row < 2**40, context and index < 2**12: a row
  has far fewer contexts, a context far fewer measurements) and hashed once, so the result is
  a pure function of the key and the counter values.
  """
  counter = np.asarray(row, dtype=np.uint64) << np.uint64(24)
  counter |= np.asarray(context, dtype=np.uint64) << np.uint64(12)
  counter |= np.asarray(index, dtype=np.uint64)
  return splitmix64(counter ^ key)


def fraction(bits: np.ndarray, field: int) -> np.ndarray:
  """float64 in [0, 1) from 21-bit field `field` (0, 1 or 2) of uint64 random bits."""
  shifted = bits >> np.uint64(_FIELD_BITS * field)
  return (shifted & np.uint64((1 << _FIELD_BITS) - 1)).astype(np.float64) * 2.0**-_FIELD_BITS


def _permutation(key: np.uint64, n: int) -> np.ndarray:
  """A seeded permutation of range(n): sort by random bits."""
  return np.argsort(random_bits(key, np.arange(n)), kind="stable")


@dataclasses.dataclass(frozen=True)
class ProbeStats:
  """Per-probe sizes the planner needs, computed once per store."""

  offsets: np.ndarray  # int64 [P+1]
  mean_length: np.ndarray  # float64 [P] expected tokens per measurement

  @property
  def num_probes(self) -> int:
    return len(self.offsets) - 1


def probe_stats(store, mode_weights, chunk_rows: int = 1 << 24) -> ProbeStats:
  """Expected tokens per measurement of each probe of `store`.

  From the IP version, the share of failed rows and the share of gaps over 255 s (DELTA4
  timestamps), weighting the timestamp cost by how often a measurement carries one (all of
  `full`, about half of `partial`). Reads the store in chunks of `chunk_rows`.
  """
  offsets = np.asarray(store.probe_offsets, dtype=np.int64)
  weights = np.asarray(mode_weights, dtype=np.float64)
  weights = weights / weights.sum()
  stamped = weights[0] + 0.5 * weights[1]
  # Cumulative sums evaluated at probe boundaries, one chunk at a time.
  failed_cum = np.zeros(len(offsets))
  gap_cum = np.zeros(len(offsets))
  carry_failed = carry_gap = 0.0
  previous_second = None
  for lo in range(0, store.num_rows, chunk_rows):
    hi = min(lo + chunk_rows, store.num_rows)
    failed = np.asarray(store.failed[lo:hi], dtype=np.float64)
    seconds = np.asarray(store.seconds[lo:hi])
    before = np.empty(hi - lo, dtype=np.int64)
    before[0] = seconds[0] if previous_second is None else previous_second
    before[1:] = seconds[:-1]
    long_gap = (seconds - before > 255).astype(np.float64)
    cf = carry_failed + np.cumsum(failed)
    cg = carry_gap + np.cumsum(long_gap)
    at = (offsets > lo) & (offsets <= hi)
    failed_cum[at] = cf[offsets[at] - lo - 1]
    gap_cum[at] = cg[offsets[at] - lo - 1]
    carry_failed, carry_gap, previous_second = cf[-1], cg[-1], seconds[-1]
  counts = np.diff(offsets).astype(np.float64)
  failed_sum = np.diff(failed_cum)
  long_gap_sum = np.diff(gap_cum)
  safe = np.maximum(counts, 1)
  version = np.asarray(store.probe_version)
  base = np.where(version == 4, _BASE_LENGTH[4], _BASE_LENGTH[6]).astype(np.float64)
  long_share = long_gap_sum / safe
  stamp = _DELTA1_LENGTH + (_DELTA4_LENGTH - _DELTA1_LENGTH) * long_share
  mean = base - _FAILED_SAVING * failed_sum / safe + stamped * stamp
  return ProbeStats(offsets=offsets, mean_length=mean)


@dataclasses.dataclass(frozen=True)
class EpochPlan:
  """The rows of one epoch, each a list of contexts.

  Row `u` (in plan order) has contexts [unit_offsets[u], unit_offsets[u+1]); context c reads
  probe `ctx_probe[c]` from store row `ctx_start[c]` up to (not including) `ctx_end[c]`.
  `order[i]` is the plan row at stream position i of the epoch.
  """

  unit_offsets: np.ndarray  # int64 [U+1]
  ctx_probe: np.ndarray  # int64 [C]
  ctx_start: np.ndarray  # int64 [C]
  ctx_end: np.ndarray  # int64 [C]
  order: np.ndarray  # int64 [U]

  @property
  def num_rows(self) -> int:
    return len(self.order)


def pieces(stats: ProbeStats, seq_len: int, key: np.uint64):
  """All pieces of all probes: (probe, start, end, is_long), store row coordinates."""
  offsets = stats.offsets
  counts = np.diff(offsets)
  probes = np.arange(stats.num_probes)
  stride = np.maximum(1, np.floor(seq_len / stats.mean_length)).astype(np.int64)
  jitter = (random_bits(key, probes) % stride.astype(np.uint64)).astype(np.int64)
  fits = counts >= stride
  jitter = np.where(fits, jitter, 0)
  num_long = np.where(fits, (counts - jitter) // stride, 0)
  long_probe = np.repeat(probes, num_long)
  first_long = np.cumsum(num_long) - num_long
  k = np.arange(len(long_probe)) - np.repeat(first_long, num_long)
  long_start = offsets[long_probe] + jitter[long_probe] + k * stride[long_probe]
  long_end = long_start + stride[long_probe]

  head = fits & (jitter > 0)
  tail_start = jitter + num_long * stride
  tail = tail_start < counts  # also the whole of a probe shorter than its stride
  short_probe = np.concatenate([probes[head], probes[tail]])
  short_start = np.concatenate([offsets[:-1][head], offsets[:-1][tail] + tail_start[tail]])
  short_end = np.concatenate([offsets[:-1][head] + jitter[head], offsets[1:][tail]])
  return long_probe, long_start, long_end, short_probe, short_start, short_end


def _first_fit(sizes: list[float], budget: float, open_limit: int = 16) -> list[int]:
  """Bin of each item, first fit over at most `open_limit` open bins (in input order)."""
  bins: list[int] = []
  open_ids: list[int] = []
  open_free: list[float] = []
  next_id = 0
  for size in sizes:
    for i, free in enumerate(open_free):
      if size <= free:
        bins.append(open_ids[i])
        open_free[i] = free - size
        break
    else:
      if len(open_ids) == open_limit:
        fullest = min(range(open_limit), key=open_free.__getitem__)
        del open_ids[fullest], open_free[fullest]
      bins.append(next_id)
      open_ids.append(next_id)
      open_free.append(budget - size)
      next_id += 1
  return bins


def plan_epoch(
  stats: ProbeStats, *, seq_len: int, seed: int, epoch: int, packing: bool, shuffle: bool
) -> EpochPlan:
  """The plan of one epoch (see the module docstring)."""
  long_probe, long_start, _, short_probe, short_start, short_end = pieces(
    stats, seq_len, stream_key(seed, epoch, JITTER)
  )
  long_end = stats.offsets[long_probe + 1]  # long contexts fill up to the probe end
  num_short = len(short_probe)
  if packing and num_short:
    if shuffle:
      visit = _permutation(stream_key(seed, epoch, PACK_ORDER), num_short)
    else:
      visit = np.arange(num_short)
    estimate = (short_end - short_start) * stats.mean_length[short_probe]
    bins = np.asarray(_first_fit(estimate[visit].tolist(), float(seq_len)), dtype=np.int64)
    by_bin = np.argsort(bins, kind="stable")
    short_order = visit[by_bin]
    short_counts = np.bincount(bins)
  else:
    short_order = np.arange(num_short)
    short_counts = np.ones(num_short, dtype=np.int64)
  ctx_probe = np.concatenate([long_probe, short_probe[short_order]])
  ctx_start = np.concatenate([long_start, short_start[short_order]])
  ctx_end = np.concatenate([long_end, short_end[short_order]])
  unit_sizes = np.concatenate([np.ones(len(long_probe), dtype=np.int64), short_counts])
  unit_offsets = np.zeros(len(unit_sizes) + 1, dtype=np.int64)
  np.cumsum(unit_sizes, out=unit_offsets[1:])
  num_units = len(unit_sizes)
  if shuffle:
    order = _permutation(stream_key(seed, epoch, SHUFFLE), num_units)
  else:
    order = np.argsort(ctx_start[unit_offsets[:-1]], kind="stable")
  return EpochPlan(
    unit_offsets=unit_offsets,
    ctx_probe=ctx_probe.astype(np.int64),
    ctx_start=ctx_start.astype(np.int64),
    ctx_end=ctx_end.astype(np.int64),
    order=order.astype(np.int64),
  )
