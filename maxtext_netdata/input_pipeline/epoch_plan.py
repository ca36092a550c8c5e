"""The epoch plan: which contexts of which probes make up each row of an epoch.

Names used here and in `sequences.py` / `batch_kernel.py`, one per concept:
- *piece*: a run of one probe's time-sorted store rows cut by the epoch grid (below);
- *context*: the run of one probe's consecutive measurements that one segment of a sequence
  is filled from (a plan context, from a piece, or a *filler*: a few random measurements);
- *plan row*: the contexts of one training sequence, in order; its index in the plan is the
  coordinate of all its random draws (`rng.py`);
- *row*: a row of a batch, i.e. the plan row at that stream position.

A probe's grid of pieces has a stride of `stride` store rows (the measurements that fill about
one sequence, from the probe's mean measurement length) and a jittered phase drawn from (seed,
epoch, probe), so the boundaries move between epochs:

    [0, j) head | [j, j+s) long | [j+s, j+2s) long | ... | tail [.., n)

A *long* piece is a plan row of its own whose context fills from the piece start until the
sequence is full (it may read past the piece end, never past the probe end). Heads, tails and
probes shorter than a stride are *short*: with packing they are grouped into plan rows (first
fit over a seeded permutation, by estimated tokens) whose contexts each stop at their piece
end; without packing each short piece is a padded plan row. Either way every measurement
belongs to exactly one piece, so one epoch covers every measurement about once (a long context
reads a few measurements more or fewer than its stride, depending on its mode).

Plan rows are then ordered by a keyed bijection of the stream position
(`enable_data_shuffling`; `plan_order.py`), or by their first store row; the plan itself holds
per-probe arrays and the short pieces, never an array of the epoch's rows. The plan depends
only on (store, seed, epoch, max_target_length, packing), never on workers, hosts or restarts.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os

import numpy as np

from maxtext_netdata.data.store import shared_arrays
from maxtext_netdata.data.store import store as store_lib
from maxtext_netdata.format import tokens as tk
from maxtext_netdata.input_pipeline import plan_order, rng

# A timestamp's mean cost by mode, from the block lengths (docs/spec.md §2).
_DELTA1_LENGTH = tk.TS_BLOCK_LENGTH[tk.TS_DELTA1]
_DELTA4_LENGTH = tk.TS_BLOCK_LENGTH[tk.TS_DELTA4]
_FAILED_SAVING = tk.RESULT_BLOCK_LENGTH[False] - tk.RESULT_BLOCK_LENGTH[True]
PLANS_DIR = "plans"  # a split's folder of cached epoch plans
_CODE_CHARS = 8  # a plan folder's name starts with this many hex digits of the code digest


@dataclasses.dataclass(frozen=True)
class ProbeStats:
  """Per-probe sizes the planner needs, computed once per store."""

  offsets: np.ndarray  # int64 [P+1]
  mean_length: np.ndarray  # float64 [P] expected tokens per measurement
  plans_dir: str | None = None  # where a prepared store keeps its plans (`plan_epoch`)

  @property
  def num_probes(self) -> int:
    return len(self.offsets) - 1


def probe_stats(store, mode_weights, chunk_rows: int = 1 << 24) -> ProbeStats:
  """Expected tokens per measurement of each probe of `store`.

  From the IP version, the share of failed rows and the share of gaps over 255 s (DELTA4
  timestamps), weighting the timestamp cost by how often a measurement carries one (all of
  `full`, about half of `partial`). The counts come with the store (`data.store.store`); a store
  object without them is read in chunks of `chunk_rows`.
  """
  offsets = np.asarray(store.probe_offsets, dtype=np.int64)
  weights = np.asarray(mode_weights, dtype=np.float64)
  weights = weights / weights.sum()
  stamped = weights[0] + 0.5 * weights[1]
  # Counted once by prepare and memory-mapped (`PreparedStore.probe_counts`): no store scan.
  counts_of = getattr(store, "probe_counts", None)
  failed, long_gaps = counts_of() if counts_of else store_lib.probe_counts(store, chunk_rows)
  failed_sum = np.asarray(failed, dtype=np.float64)
  long_gap_sum = np.asarray(long_gaps, dtype=np.float64)
  counts = np.diff(offsets).astype(np.float64)
  safe = np.maximum(counts, 1)
  version = np.asarray(store.probe_version)
  base = np.where(
    version == 4,
    tk.measurement_length(4, False, tk.TS_NONE),
    tk.measurement_length(6, False, tk.TS_NONE),
  ).astype(np.float64)
  long_share = long_gap_sum / safe
  stamp = _DELTA1_LENGTH + (_DELTA4_LENGTH - _DELTA1_LENGTH) * long_share
  mean = base - _FAILED_SAVING * failed_sum / safe + stamped * stamp
  path = getattr(store, "path", None)
  plans_dir = os.path.join(path, PLANS_DIR) if isinstance(path, str) else None
  return ProbeStats(offsets=offsets, mean_length=mean, plans_dir=plans_dir)


@dataclasses.dataclass(frozen=True)
class EpochPlan:
  """The plan rows of one epoch, in memory of the order of the probes, not of the rows.

  Plan rows [0, num_long) are *long*: plan row l is long piece k = l - long_first[p] of the
  probe p with long_first[p] <= l < long_first[p + 1], one context from store row
  long_start[p] + k * stride[p] to the probe's end (probe_end[p]). Plan rows
  [num_long, num_rows) are *short*: plan row num_long + j has contexts [short_offsets[j],
  short_offsets[j + 1]), context c reading probe short_probe[c] from store row short_start[c]
  up to (not including) short_end[c]. The plan row at stream position i is `rows_at([i])`
  (`plan_order`: a keyed bijection with `order_keys`, or store order by `short_position`,
  `short_by_position`): no array of the epoch's rows is made or kept (at RIPE Atlas's month,
  ~1 billion plan rows, the arrays of rows took ~1.2 bytes a measurement and minutes to make).
  """

  long_first: np.ndarray  # int64 [P+1]
  long_start: np.ndarray  # int64 [P]
  stride: np.ndarray  # int64 [P]
  probe_end: np.ndarray  # int64 [P]
  short_offsets: np.ndarray  # int64 [S+1]
  short_probe: np.ndarray  # int64 [C]
  short_start: np.ndarray  # int64 [C]
  short_end: np.ndarray  # int64 [C]
  order_keys: np.ndarray  # uint64 [plan_order.ROUNDS] when shuffled, else [0]
  short_position: np.ndarray  # int64 [S] unshuffled, else [0]: positions of the short rows
  short_by_position: np.ndarray  # int64 [S] unshuffled, else [0]: the short row at each

  def __post_init__(self):
    # Read-only however the plan was made (mapped from its cache, or computed where the cache
    # could not be written): numba compiles the batch kernel per argument type, and a
    # writable array is another type than a read-only one, another first compile (~10 s).
    for field in dataclasses.fields(self):
      getattr(self, field.name).setflags(write=False)

  @functools.cached_property
  def num_long(self) -> int:
    return int(self.long_first[-1])

  @functools.cached_property
  def num_rows(self) -> int:
    return self.num_long + len(self.short_offsets) - 1

  @functools.cached_property
  def kernel_order(self) -> tuple:
    """`plan_order.row_at`'s arguments but the position."""
    return (
      self.order_keys,
      self.short_position,
      self.short_by_position,
      self.num_long,
      self.num_rows,
    )

  @functools.cached_property
  def kernel_plan(self) -> tuple:
    """The plan as `batch_kernel.Plan` (a plain tuple), made once: every batch passes it."""
    return (
      self.long_first,
      self.long_start,
      self.stride,
      self.short_offsets,
      self.short_probe,
      self.short_start,
      self.short_end,
      *self.kernel_order,
    )

  def rows_at(self, positions) -> np.ndarray:
    """The plan rows at stream `positions` (each in [0, num_rows))."""
    positions = np.ascontiguousarray(positions, dtype=np.int64)
    out = np.empty(len(positions), dtype=np.int64)
    plan_order.rows_at(*self.kernel_order, positions, out)
    return out

  def contexts(self, plan_rows) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The contexts of `plan_rows`: (offsets [n+1], probe, start, end); row i has contexts
    [offsets[i], offsets[i + 1])."""
    rows = np.asarray(plan_rows, dtype=np.int64)
    is_long = rows < self.num_long
    short = np.where(is_long, 0, rows - self.num_long)
    first = self.short_offsets[short]
    counts = np.where(is_long, 1, self.short_offsets[short + 1] - first)
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    context_row = np.repeat(np.arange(len(rows)), counts)
    index = np.repeat(first - offsets[:-1], counts) + np.arange(offsets[-1])
    long = is_long[context_row]
    probe, start, end = (np.empty(offsets[-1], dtype=np.int64) for _ in range(3))
    long_rows = rows[context_row[long]]
    p = np.searchsorted(self.long_first, long_rows, side="right") - 1
    probe[long] = p
    start[long] = self.long_start[p] + (long_rows - self.long_first[p]) * self.stride[p]
    end[long] = self.probe_end[p]
    at = index[~long]  # the short contexts' places in the short arrays
    probe[~long] = self.short_probe[at]
    start[~long] = self.short_start[at]
    end[~long] = self.short_end[at]
    return offsets, probe, start, end


def _grid(stats: ProbeStats, seq_len: int, key: np.ndarray):
  """Each probe's grid of pieces, (stride, jitter, num_long), and its short pieces (heads,
  tails, probes shorter than a stride): (probe, start, end), store row coordinates. Probe p's
  long pieces are [offsets[p] + jitter[p] + k * stride[p], ... + stride[p]), k < num_long[p]."""
  offsets = stats.offsets
  counts = np.diff(offsets)
  probes = np.arange(stats.num_probes)
  stride = np.maximum(1, np.floor(seq_len / stats.mean_length)).astype(np.int64)
  jitter = (rng.random_bits(key, probes) % stride.astype(np.uint64)).astype(np.int64)
  fits = counts >= stride
  jitter = np.where(fits, jitter, 0)
  num_long = np.where(fits, (counts - jitter) // stride, 0)
  head = fits & (jitter > 0)
  tail_start = jitter + num_long * stride
  tail = tail_start < counts  # also the whole of a probe shorter than its stride
  short_probe = np.concatenate([probes[head], probes[tail]])
  short_start = np.concatenate([offsets[:-1][head], offsets[:-1][tail] + tail_start[tail]])
  short_end = np.concatenate([offsets[:-1][head] + jitter[head], offsets[1:][tail]])
  return (stride, jitter, num_long), (short_probe, short_start, short_end)


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
  """The plan of one epoch (see the module docstring).

  For a prepared store (`stats.plans_dir`) the plan is computed by one process and kept beside
  the store (`shared_arrays.cached_arrays`), and every process and Grain worker maps it: one copy in
  page cache, not one per worker, and one computation at each epoch boundary. Plans of this
  key more than one epoch behind, and plans made by other code (a folder's name starts with
  the planner's code digest), are deleted as a new one is written; other keys of this code
  (another seed or length: a run beside this one) are kept.
  """
  params = dict(seq_len=seq_len, seed=seed, epoch=epoch, packing=packing, shuffle=shuffle)
  if stats.plans_dir is None:
    return _plan_epoch(stats, **params)
  key = _plan_key(stats, params)

  def stale(name: str) -> bool:
    prefix, _, number = name.rpartition("-e")
    if prefix == key and number.isdigit() and int(number) < epoch - 1:
      return True
    # Made by other code (or named as plans were before the digest led the name, as those of
    # the former layout, arrays of every plan row): no longer read. A process that maps it
    # keeps its pages.
    return not name.startswith(f"{_code_digest().hex()[:_CODE_CHARS]}-")

  arrays = shared_arrays.cached_arrays(
    stats.plans_dir,
    f"{key}-e{epoch}",
    lambda: dataclasses.asdict(_plan_epoch(stats, **params)),
    prune=stale,
  )
  return EpochPlan(**{name: np.asarray(array) for name, array in arrays.items()})


@functools.cache
def _code_digest() -> bytes:
  """The planner's source: a cached plan is stale once the code that made it changes."""
  digest = hashlib.sha256()
  for module in (__file__, rng.__file__):
    with open(module, "rb") as f:
      digest.update(f.read())
  return digest.digest()


def _plan_key(stats: ProbeStats, params: dict) -> str:
  """What a plan depends on besides its epoch: code, probe sizes and statistics, keys."""
  digest = hashlib.sha256(_code_digest())
  digest.update(np.ascontiguousarray(stats.offsets).tobytes())
  digest.update(np.ascontiguousarray(stats.mean_length).tobytes())
  digest.update(json.dumps({k: v for k, v in params.items() if k != "epoch"}).encode())
  return f"{_code_digest().hex()[:_CODE_CHARS]}-{digest.hexdigest()[:16]}"


def _plan_epoch(
  stats: ProbeStats, *, seq_len: int, seed: int, epoch: int, packing: bool, shuffle: bool
) -> EpochPlan:
  (stride, jitter, num_long), (short_probe, short_start, short_end) = _grid(
    stats, seq_len, rng.stream_key(seed, epoch, rng.JITTER)
  )
  num_short = len(short_probe)
  if packing and num_short:
    if shuffle:
      visit = rng.permutation(rng.stream_key(seed, epoch, rng.PACK_ORDER), num_short)
    else:
      visit = np.arange(num_short)
    estimate = (short_end - short_start) * stats.mean_length[short_probe]
    bins = np.asarray(_first_fit(estimate[visit].tolist(), float(seq_len)), dtype=np.int64)
    short_order = visit[np.argsort(bins, kind="stable")]
    short_counts = np.bincount(bins)
  else:
    short_order = np.arange(num_short)
    short_counts = np.ones(num_short, dtype=np.int64)
  offsets = stats.offsets
  long_first = np.zeros(stats.num_probes + 1, dtype=np.int64)
  np.cumsum(num_long, out=long_first[1:])
  long_start = offsets[:-1] + jitter
  short_offsets = np.zeros(len(short_counts) + 1, dtype=np.int64)
  np.cumsum(short_counts, out=short_offsets[1:])
  short_start = short_start[short_order]
  empty = np.zeros(0, dtype=np.int64)
  if shuffle:
    keys = plan_order.order_keys(rng.stream_key(seed, epoch, rng.SHUFFLE))
    position, by_position = empty, empty
  else:
    # Store order: each short row's position is the short rows and the long rows that start
    # before it (pieces never share a start row).
    first = short_start[short_offsets[:-1]]
    by_position = np.argsort(first, kind="stable")
    first = first[by_position]
    p = np.searchsorted(offsets, first, side="right") - 1
    before = -((long_start[p] - first) // stride[p])  # long pieces of p starting before
    position = np.arange(len(first)) + long_first[p] + np.clip(before, 0, num_long[p])
    keys = np.zeros(0, dtype=np.uint64)
  return EpochPlan(
    long_first=long_first,
    long_start=long_start.astype(np.int64),
    stride=stride,
    probe_end=offsets[1:].astype(np.int64),
    short_offsets=short_offsets,
    short_probe=short_probe[short_order].astype(np.int64),
    short_start=short_start.astype(np.int64),
    short_end=short_end[short_order].astype(np.int64),
    order_keys=keys,
    short_position=position.astype(np.int64),
    short_by_position=by_position.astype(np.int64),
  )
