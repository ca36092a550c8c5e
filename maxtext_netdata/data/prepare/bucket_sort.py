"""A bucket's rows in store order: grouped by probe, time-sorted within a probe, ties by content.

`order_bucket(chunks)`: a bucket's chunks → its probes (ordered by (hash, version, address))
and the permutation that puts its rows in store order (`SortedBucket`); `sort_bucket` applies
it (`store.ProbeRows` with `probe_hash`) and `write_piece` saves that as a piece. Both runners
(`data.prepare.local_runner`, `data.prepare.beam_runner`) and the merge of an update
(`data.prepare.merge`) order rows with these functions, so all of them give the same bytes.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from maxtext_netdata.data.prepare import partition, row_kernels
from maxtext_netdata.data.store import store

PROBE_HASH_FILE = "probe_hash.npy"


@dataclasses.dataclass
class SortedBucket:
  """A bucket's rows in store order, kept as its unsorted columns and the permutation.

  `column(name, rows)` gathers a column's selected rows straight from the unsorted one, so
  a row is moved once on its way into a split, not once to sort it and again to split it.
  """

  probe_offsets: np.ndarray  # int64 [P+1]
  probe_src: np.ndarray  # uint8 [P, 16]
  probe_version: np.ndarray  # uint8 [P]
  probe_hash: np.ndarray  # uint64 [P]
  columns: dict  # name → unsorted row array of store.ROW_ARRAYS
  perm: np.ndarray  # int64 [N]: row i of the sorted bucket is row perm[i] of `columns`

  @property
  def num_rows(self) -> int:
    return len(self.perm)

  @property
  def num_probes(self) -> int:
    return len(self.probe_version)

  @property
  def hashed(self) -> bool:
    return "hashed_order" in self.columns

  def probe_array(self, name: str) -> np.ndarray:
    return getattr(self, name)

  def column(self, name: str, rows: np.ndarray | None = None) -> np.ndarray:
    """Sorted column `name`, or its rows `rows` (indices into the sorted bucket)."""
    return store.take_rows(self.columns[name], self.perm if rows is None else self.perm[rows])

  def column_into(self, name: str, rows: np.ndarray | None, out: np.ndarray) -> None:
    """`column(name, rows)` written into `out`."""
    store.take_rows(self.columns[name], self.perm if rows is None else self.perm[rows], out=out)

  def rows(self) -> store.ProbeRows:
    """The sorted bucket as one `store.ProbeRows` (columns gathered one at a time)."""
    columns = {name: None for name in store.ROW_ARRAYS}
    for name in list(self.columns):
      columns[name] = self.column(name)
      del self.columns[name]
    return store.ProbeRows(
      probe_offsets=self.probe_offsets,
      probe_src=self.probe_src,
      probe_version=self.probe_version,
      probe_hash=self.probe_hash,
      **columns,
    )


def sort_bucket(chunks: list[partition.Chunk]) -> store.ProbeRows:
  """The rows of a bucket's chunks grouped by probe and time-sorted (see the module doc).

  The result carries `probe_hash` (uint64 [P]); chunks are released as they are copied.
  """
  return order_bucket(chunks).rows()


def order_bucket(chunks: list[partition.Chunk]) -> SortedBucket:
  """`sort_bucket` without moving the rows: the columns and their permutation."""
  joined = partition.join(chunks)  # a spill file's single chunk, read into place: taken as it is
  keys, hashes, columns = joined.keys, joined.hashes, joined.columns
  entry = joined.probe
  del joined
  rank, probe_keys, probe_hash = probe_ranks(keys, hashes)
  probe = rank[entry]
  del entry
  perm = row_order(probe, columns)
  sizes = np.bincount(probe, minlength=len(probe_keys))
  del probe
  offsets = np.zeros(len(probe_keys) + 1, dtype=np.int64)
  np.cumsum(sizes, out=offsets[1:])
  return SortedBucket(
    probe_offsets=offsets,
    probe_src=np.ascontiguousarray(probe_keys[:, 1:]),
    probe_version=np.ascontiguousarray(probe_keys[:, 0]),
    probe_hash=probe_hash,
    columns=columns,
    perm=perm,
  )


def probe_ranks(keys: np.ndarray, hashes: np.ndarray) -> tuple:
  """(rank int32 [K] of each chunk key's probe, probe keys [P, 17], probe hashes [P]).

  Probes are ordered by (hash, version, address); a probe seen in several chunks (one key
  per chunk and batch: ~400k keys for ~500 probes in a bucket of a 200M-row dump) is one
  probe. The keys are first merged by hash in Arrow's hash table, so only the few distinct
  probes are sorted; if two different keys share a hash, all keys are sorted instead.
  """
  encoded = pc.dictionary_encode(pa.array(hashes, pa.uint64()))
  inverse = encoded.indices.to_numpy()
  distinct = encoded.dictionary.to_numpy()
  some_row = np.empty(len(distinct), dtype=np.int64)
  some_row[inverse] = np.arange(len(keys))  # any key of a hash stands for it
  if (keys == keys[some_row][inverse]).all():  # one key per hash
    order = np.lexsort((*keys[some_row].T[::-1], distinct))
    rank = np.empty(len(order), dtype=np.int32)
    rank[order] = np.arange(len(order), dtype=np.int32)
    return rank[inverse], keys[some_row][order], distinct[order]
  order = np.lexsort((*keys.T[::-1], hashes))
  sorted_keys = keys[order]
  new = np.ones(len(order), dtype=bool)
  new[1:] = (sorted_keys[1:] != sorted_keys[:-1]).any(axis=1)
  rank = np.empty(len(order), dtype=np.int32)
  rank[order] = np.cumsum(new) - 1
  return rank, sorted_keys[new], hashes[order][new]


def row_order(probe: np.ndarray, columns: dict) -> np.ndarray:
  """Row permutation by (probe, seconds), ties broken by the rows' content.

  Ties (same probe and second) are ordered by destination, RTT payload and hashed order, so
  the result does not depend on the order the rows arrived in (rows equal in all of these are
  equal in every stored byte).
  """
  seconds = columns["seconds"]
  n = len(probe)
  if n == 0:
    return np.zeros(0, dtype=np.int64)
  # Dumps are sorted by time and listed in time order, so a stable sort by probe alone
  # usually leaves each probe's rows in time order.
  grouped = row_kernels.time_grouped_order(probe, int(probe.max()) + 1, seconds)
  if grouped is not None:
    perm, tie, count = grouped
  else:  # not time-ordered within a probe: sort by (probe, seconds)
    span = int(seconds.max()) - int(seconds.min())
    if int(probe.max()) < 2**29 and span < 2**34:
      key = (probe.astype(np.uint64) << np.uint64(34)) | (seconds - seconds.min()).astype(np.uint64)
      perm = np.argsort(key)
      del key
    else:
      perm = np.lexsort((seconds, probe))
    tie, count = row_kernels.ties(probe, seconds, perm)
  if not count:
    return perm
  in_tie = np.zeros(n, dtype=bool)
  in_tie[1:] |= tie
  in_tie[:-1] |= tie
  where = np.flatnonzero(in_tie)
  run = np.cumsum(~np.concatenate([[False], tie])[where])  # one id per run of equal keys
  rows = perm[where]
  dst = store.take_rows(columns["dst"], rows).view(">u8")
  rtt = store.take_rows(columns["rtt_bytes"], rows).view(">u2")[:, 0]
  content = [dst[:, 1], dst[:, 0], rtt]
  if columns.get("hashed_order") is not None:
    content = [store.take_rows(columns["hashed_order"], rows).view(np.uint16)[:, 0], *content]
  # lexsort's order (the last key first) by Arrow's multi-key sort, which sorts by the run
  # once and then compares within each run's few rows: ~6x faster than numpy's lexsort.
  keys = [run, *content[::-1]]
  table = pa.table(
    {str(i): np.ascontiguousarray(k, k.dtype.newbyteorder("=")) for i, k in enumerate(keys)}
  )
  order = pc.sort_indices(table, sort_keys=[(str(i), "ascending") for i in range(len(keys))])
  perm[where] = rows[order.to_numpy()]
  return perm


def write_piece(rows: store.ProbeRows, path: str, meta: dict) -> dict:
  """Save a sorted bucket as a split-format folder plus its probes' hashes; its counts."""
  counts = rows.write(path, meta)
  store.save_array(os.path.join(path, PROBE_HASH_FILE), rows.probe_hash)
  return counts


HOUR_BITS = 21  # hours since 1970 that uint32 seconds reach (< 2^21)


class Slicer:
  """A bucket too large for one sort, cut into slices: consecutive ranges of its store order
  that are sorted one at a time.

  A bucket holds whole probes, and probes differ in size: a RIPE Atlas anchor pings the other
  ~800 anchors every 4 minutes (~9M rows a month from that mesh alone) while a month's mean
  probe holds ~3M rows, so at 2M-row buckets a bucket of one anchor, or of several probes,
  may hold more rows than the memory budget can sort (`partition.sort_rows`).

  Its rows are counted by (probe, hour) in a first pass over its chunks (`count`); `plan`
  cuts the bins, in store order (probe by hash, version, address; then hour), into slices of
  at most `target` rows each (a bin larger than that is a slice of its own: a probe with
  more rows in one hour than a sort may hold); in a second pass over the same chunks, in the
  same order, `cut` names each row's slice. Each slice then sorts alone (`order_bucket`) and
  the slices, one after another, are the bucket's sorted rows: rows of one probe and second
  are never cut apart, so ties are broken among the same rows, and the splits' writer
  joins a probe that runs on into the next slice (`assemble.SplitWriter`).
  """

  def __init__(self, target: int):
    self.target = target
    self.keys, self.hashes, self.bins, self.counts = [], [], [], []
    self.key_count = 0
    self.starts = self.rank = self.probe_keys = self.probe_hash = None

  def count(self, chunk: partition.Chunk) -> None:
    """First pass: the chunk's rows counted by (key, hour)."""
    self.keys.append(chunk.keys)
    self.hashes.append(chunk.hashes)
    code = (chunk.probe.astype(np.int64) + self.key_count) << HOUR_BITS
    code |= (chunk.columns["seconds"] // 3600).astype(np.int64)
    bins, counts = np.unique(code, return_counts=True)
    self.bins.append(bins)
    self.counts.append(counts)
    self.key_count += len(chunk.keys)

  def plan(self) -> int:
    """The number of slices (the first pass done)."""
    self.rank, self.probe_keys, self.probe_hash = probe_ranks(
      np.concatenate(self.keys), np.concatenate(self.hashes)
    )
    hours = (1 << HOUR_BITS) - 1
    codes = np.concatenate(self.bins)
    codes = (self.rank[codes >> HOUR_BITS].astype(np.int64) << HOUR_BITS) | (codes & hours)
    bins, inverse = np.unique(codes, return_inverse=True)
    ends = np.cumsum(np.bincount(inverse, weights=np.concatenate(self.counts)).astype(np.int64))
    self.keys = self.hashes = self.bins = self.counts = None
    starts, first = [], 0
    while first < len(bins):  # greedy: each slice takes the most bins that fit
      before = ends[first - 1] if first else 0
      last = max(first + 1, int(np.searchsorted(ends, before + self.target, side="right")))
      starts.append(first)
      first = last
    self.starts = bins[starts]
    self.key_count = 0
    return len(starts)

  def cut(self, chunk: partition.Chunk) -> tuple[partition.Chunk, np.ndarray]:
    """Second pass: (the chunk with one key per probe and slice, each key's slice)."""
    rank = self.rank[chunk.probe.astype(np.int64) + self.key_count].astype(np.int64)
    self.key_count += len(chunk.keys)
    code = (rank << HOUR_BITS) | (chunk.columns["seconds"] // 3600).astype(np.int64)
    slices = len(self.starts)
    pair = rank * slices + np.searchsorted(self.starts, code, side="right") - 1
    used = np.flatnonzero(np.bincount(pair, minlength=len(self.probe_keys) * slices))
    number = np.zeros(len(self.probe_keys) * slices, np.int32)
    number[used] = np.arange(len(used), dtype=np.int32)
    probe = used // slices
    cut = partition.Chunk(
      self.probe_keys[probe], self.probe_hash[probe], number[pair], chunk.columns
    )
    return cut, used % slices
