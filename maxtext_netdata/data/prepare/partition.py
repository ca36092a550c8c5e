"""Bounded-memory prepare: rows partitioned by probe hash, each bucket sorted.

The steps are plain functions, shared by the built-in runner (`data.prepare.local_runner`, buckets
spilled to local files) and the Apache Beam runner (`data.prepare.beam_runner`, buckets grouped by
GroupByKey), so that both build byte-identical stores:

1. `read_chunks` → `Gather`: each file's validated batches (`batch_chunk`: a `Chunk`, its probes
   numbered) gathered, then split by bucket into one record per bucket (`split_chunks` →
   `Records`; `read_records` makes a bucket's records one chunk again). A probe's bucket is a
   non-decreasing function of its hash, so every probe lives in exactly one bucket and
   buckets follow one another in hash order.
2. `data.prepare.bucket_sort`: a bucket's chunks → its probes (ordered by (hash, version,
   address)) and its rows grouped by probe, time-sorted within a probe, ties by content; a
   bucket larger than the memory budget is sorted in slices of that order.
3. `data.prepare.assemble`: sorted buckets (or pieces) in bucket order → the store's splits.

The probe hash is the first 8 bytes of `blake2b(version byte + 16 address bytes)`, read as a
big-endian integer: the same number that decides the probe split (docs/spec.md §3). The store's
content depends only on the set of input rows: not on the bucket count, the file order or the
rows' order within files.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from maxtext_netdata.data.prepare import hashed_kernel, probes, row_kernels
from maxtext_netdata.data.raw import reader, schema
from maxtext_netdata.data.store import store

# Rows of one bucket at most (the memory budget may ask for fewer): the sort's cost per row
# grows with the arrays' size (cache misses), so small buckets are also faster.
MAX_BUCKET_ROWS = 1 << 21
# Bytes held per row of the bucket being sorted: its columns (37, 39 with hashed order), the
# probe rank (4), the permutation (8) and the largest gathered column (16), with headroom
# for buckets that the hash fills unevenly.
SORT_BYTES_PER_ROW = 100
# Memory that does not depend on the bucket size: imports (numba's compiler ~90 MiB of it,
# loaded for the address parser and the probe table) and the reader's batches.
FIXED_BYTES = 416 << 20
# Bytes held per gathered row while the spill splits the gathered batches by bucket: the
# batches' columns (30, 32 with hashed order) and the records they are placed in (26, 28),
# with headroom for the probe tables and counts.
GATHER_BYTES_PER_ROW = 64


def bucket_rows(memory_mb: int) -> int:
  """Rows per bucket that keep a prepare with `memory_mb` of memory within it."""
  return int(min(MAX_BUCKET_ROWS, sort_rows(memory_mb)))


def sort_rows(memory_mb: int) -> int:
  """Rows that one sort may hold within `memory_mb` of memory: a bucket with more (a bucket
  holds whole probes, and probes differ in size) is sorted in slices (`bucket_sort`)."""
  return int(max(1 << 16, (memory_mb * (1 << 20) - FIXED_BYTES) // SORT_BYTES_PER_ROW))


def gather_rows(buckets: int, memory_mb: int) -> int:
  """Rows `Gather` gathers before splitting them by bucket: enough for 64k rows a bucket (a
  record's own cost then weighs nothing), at most what half the memory budget holds at
  `GATHER_BYTES_PER_ROW` (no bucket is being sorted meanwhile)."""
  budget = (memory_mb * (1 << 20) - FIXED_BYTES) // 2
  return int(min(max(1 << 18, buckets << 16), max(1 << 16, budget // GATHER_BYTES_PER_ROW)))


def num_buckets(total_rows: int, memory_mb: int) -> int:
  """Buckets for `total_rows` raw rows (the content does not depend on it)."""
  return max(1, -(-total_rows // bucket_rows(memory_mb)))


def bucket_of(hashes: np.ndarray, buckets: int) -> np.ndarray:
  """int64 bucket of each hash: non-decreasing in the hash, so buckets keep hash order."""
  scaled = (hashes.astype(np.float64) * (buckets / 2.0**64)).astype(np.int64)
  return np.minimum(scaled, buckets - 1)


@dataclasses.dataclass
class Chunk:
  """Rows of one bucket from one batch; `probe` indexes the chunk's own probe table."""

  keys: np.ndarray  # uint8 [K, 17] version byte + source address of each probe
  hashes: np.ndarray  # uint64 [K]
  probe: np.ndarray  # int32 [n]
  columns: dict  # name → array of store.ROW_ARRAYS (hashed_order only when stored)
  # A batch's destination texts as read (`dst_index` uses a dictionary's codes), if kept.
  dst_text: pa.Array | None = None

  def __len__(self) -> int:
    return len(self.probe)

  def dst_index(self, table) -> np.ndarray:
    """uint32 [n]: each row's destination as its entry in `table` (a `dst_table.DstEncoder`):
    the batch's distinct destinations looked up once each, when the codes are known (with a
    month's ~300k destinations in the table a lookup misses the cache, ~45 ns, and a batch
    holds far fewer distinct destinations than rows)."""
    codes = None if self.dst_text is None else dst_codes(self.dst_text, self.columns["dst"])
    if codes is None:
      return table.encode(self.columns["dst"])
    codes, entries = codes
    return table.encode(entries)[codes]


def _names(hashed: bool) -> list[str]:
  return [name for name in store.ROW_ARRAYS if hashed or name != "hashed_order"]


def batch_chunk(columns: schema.RawColumns, hashed: bool) -> Chunk:
  """A validated batch's rows as one chunk: its probes numbered, its RTT payloads made."""
  probe, table, hashes = probes.batch_probes(columns)
  rtt_bytes, _ = row_kernels.rtt_payload(columns.rtt)  # tokenizer.rtt_bytes, compiled
  data = {"dst": columns.dst, "seconds": columns.seconds, "rtt_bytes": rtt_bytes}
  if hashed:
    data["hashed_order"] = hashed_kernel.hashed_order_pairs(
      columns.src_text, columns.dst_text, columns.seconds
    )
  text = columns.dst_text  # kept only as codes into a dictionary: plain texts cost memory
  return Chunk(table, hashes, probe, data, text if pa.types.is_dictionary(text.type) else None)


def dst_codes(text: pa.Array, dst: np.ndarray) -> tuple | None:
  """(code int32 [n], entries uint8 [E, 16]): each row's destination as an index into the
  batch's distinct destination texts, parsed (`dst`, the rows' addresses, at a row of each:
  all its rows hold the same bytes), from the text column's dictionary; None when it has
  none. Two texts of one address are two entries of the same bytes."""
  if not pa.types.is_dictionary(text.type) or not len(text):
    return None
  # A null text (the all-zero address: data/raw/addresses.py) is one more entry, the last.
  indices = text.indices.fill_null(len(text.dictionary)) if text.null_count else text.indices
  codes = indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
  codes, rows = probes.first_codes(codes, len(text.dictionary) + 1)
  return codes, dst[rows]


def partition(columns: schema.RawColumns, buckets: int, hashed: bool) -> list[tuple[int, Chunk]]:
  """(bucket, chunk) of each bucket that rows of this validated batch fall in."""
  return list(split_chunks([batch_chunk(columns, hashed)], buckets).chunks())


@dataclasses.dataclass
class Records:
  """Rows split by bucket, as one record per bucket in one buffer (`row_kernels.record_layout`:
  the bucket's probe table, then its rows' probes, indices into that table, and columns, the
  seconds as uint32, the reader having checked that they fit). Record i, of bucket
  `buckets[i]`, is `data[bounds[i]:bounds[i + 1]]`: the spill writes it to the bucket's file
  with one write (`local_runner.SpillWriter`), the Beam runner ships it as one element, and
  `read_records` makes a bucket's records one chunk again.

  The built-in runner's records keep each destination as a uint32 index into a table of
  the build's destinations (`row_kernels.DST_INDEXED`; 14 bytes a row instead of 26): the
  Beam runner's workers share no such table and keep the 16 bytes.

  In this machine's byte order: records are read by the machine that wrote them, or by Beam
  workers of the same kind.
  """

  data: np.ndarray  # uint8 [S]
  buckets: np.ndarray  # int64 [B']: the buckets that hold rows, ascending
  bounds: np.ndarray  # int64 [B' + 1]
  rows: np.ndarray  # int64 [B']
  keys: np.ndarray  # int64 [B']
  flags: int  # row_kernels.HASHED | row_kernels.DST_INDEXED

  @property
  def hashed(self) -> bool:
    return bool(self.flags & row_kernels.HASHED)

  def __iter__(self):
    """(bucket, record: uint8 array) of each bucket."""
    bounds = self.bounds.tolist()
    for i, bucket in enumerate(self.buckets.tolist()):
      yield bucket, self.data[bounds[i] : bounds[i + 1]]

  def chunks(self, dst_table: np.ndarray | None = None):
    """(bucket, Chunk) of each bucket (`dst_table`: that of the records' destinations)."""
    for bucket, record in self:
      yield bucket, read_records([record], dst_table)


def read_records(records: list, dst_table: np.ndarray | None = None) -> Chunk:
  """One chunk of the rows of `records` (uint8 arrays or bytes, each one or more whole
  `Records` records), their probe tables joined; `dst_table` (uint8 [D, 16]) is the table of
  destinations that indexed records were written with."""
  arrays = [np.frombuffer(r, np.uint8) for r in records]
  data = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
  chunk, used = unpack_whole(data, dst_table)
  assert used == len(data), (used, len(data))
  return chunk


def unpack_whole(data: np.ndarray, dst_table: np.ndarray | None = None) -> tuple[Chunk, int]:
  """(one chunk of the whole records at the start of `data`, their bytes): a record cut
  short at its end is left out (`whole_records`)."""
  whole, rows, keys, flags = whole_records(data)
  chunk = empty_chunk(rows, keys, bool(flags & row_kernels.HASHED))
  got = row_kernels.unpack_records(data[:whole], 0, 0, *chunk_arrays(chunk), dst_table)
  assert tuple(got) == (whole, rows, keys), (tuple(got), whole, rows, keys)
  return chunk, whole


def whole_records(data: np.ndarray) -> tuple[int, int, int, int]:
  """(bytes, rows, keys, flags) of the whole records at the start of `data` (uint8): a record
  cut short at its end is left out."""
  at = rows = keys = flags = 0
  while at + 24 <= len(data):
    n, k, f = (int(x) for x in data[at : at + 24].view(np.int64))
    size = int(row_kernels.record_layout(n, k, f)[0])
    if at + size > len(data):
      break
    at, rows, keys, flags = at + size, rows + n, keys + k, f
  return at, rows, keys, flags


def empty_chunk(rows: int, keys: int, hashed: bool, row_array=None) -> Chunk:
  """A chunk of `rows` rows and `keys` probe keys, its arrays allocated, not filled (for
  `row_kernels.unpack_records`); its row arrays from `row_array(name, dtype, shape)` when
  given (a caller's reused buffers), else new."""
  row_array = row_array or (lambda name, dtype, shape: np.empty(shape, dtype))
  columns = {}
  for name in _names(hashed):
    dtype, tail = store.ROW_ARRAYS[name]
    columns[name] = row_array(name, dtype, (rows, *tail))
  probe = row_array("probe", np.int32, (rows,))
  return Chunk(np.empty((keys, 17), np.uint8), np.empty(keys, np.uint64), probe, columns)


def chunk_arrays(chunk: Chunk) -> tuple:
  """The arrays `row_kernels.unpack_records` fills, of `chunk`'s."""
  columns = chunk.columns
  order = columns.get("hashed_order", np.zeros((0, 2), np.uint8))
  return (chunk.probe, columns["dst"], columns["seconds"], columns["rtt_bytes"], order,
          chunk.keys, chunk.hashes)  # fmt: skip


def split_chunks(chunks: list[Chunk], buckets: int, dst_table=None, key_bucket=None) -> Records:
  """The rows of `chunks` by bucket, as records (`row_kernels.write_records`, `scatter_rows`);
  a bucket's probe table is its probes' keys in the chunks' order, a bucket's rows the
  chunks' rows in their order. `chunks` is emptied as each is placed, so that its memory
  goes as the records fill. With `dst_table` (a `dst_table.DstEncoder` kept for the build)
  the records keep each destination as its index in that table. Each key's bucket is that
  of its hash (`bucket_of`) unless `key_bucket` (int64, the chunks' keys in order) says."""
  flags = row_kernels.HASHED if "hashed_order" in chunks[0].columns else 0
  if dst_table is not None:
    flags |= row_kernels.DST_INDEXED
  keys = np.concatenate([c.keys for c in chunks])
  hashes = np.concatenate([c.hashes for c in chunks])
  key_at = np.cumsum([0, *(len(c.keys) for c in chunks)])
  if key_bucket is None:
    key_bucket = bucket_of(hashes, buckets)
  # Each key's number within its bucket, for all buckets at once (per bucket, a pass over
  # every probe of the batch cost buckets x probes: ~100 x 50k per batch at 200M rows).
  key_order, key_bounds = row_kernels.counting_order(key_bucket, buckets)
  key_local = np.empty(len(keys), np.int32)
  key_local[key_order] = np.arange(len(keys)) - np.repeat(key_bounds[:-1], np.diff(key_bounds))
  key_rows = np.concatenate([np.bincount(c.probe, minlength=len(c.keys)) for c in chunks])
  rows = np.bincount(key_bucket, weights=key_rows, minlength=buckets).astype(np.int64)
  held = np.flatnonzero(np.diff(key_bounds))
  layout = row_kernels.record_layout(rows[held], np.diff(key_bounds)[held], flags)
  bounds = np.zeros(len(held) + 1, np.int64)
  np.cumsum(layout[0], out=bounds[1:])
  data = np.zeros(int(bounds[-1]), np.uint8)
  row_kernels.write_records(
    data, held, bounds[:-1], rows[held], np.append(key_bounds[held], key_bounds[-1]), flags,
    keys[key_order], hashes[key_order],
  )  # fmt: skip
  parts = np.zeros((buckets, 5), np.int64)  # each bucket's parts' first bytes in `data`
  parts[held] = np.stack(layout[1:], axis=1) + bounds[:-1, None]
  cursor = np.zeros(buckets, np.int64)
  for at in key_at[:-1].tolist():
    chunk = chunks.pop(0)
    index = None if dst_table is None else chunk.dst_index(dst_table)
    row_kernels.scatter_rows(
      chunk.probe, at, key_bucket, key_local, chunk.columns, cursor, parts, data, index
    )
    del chunk, index
  return Records(
    data=data, buckets=held, bounds=bounds, rows=rows[held], keys=np.diff(key_bounds)[held],
    flags=flags,
  )  # fmt: skip


def join(chunks: list[Chunk]) -> Chunk:
  """The rows of `chunks` as one chunk (its probe table their tables one after another);
  `chunks` is emptied as each is copied, so that its memory goes as the copy grows."""
  if len(chunks) == 1:
    return chunks.pop()
  hashed = bool(chunks) and "hashed_order" in chunks[0].columns
  out = empty_chunk(sum(len(c) for c in chunks), 0, hashed)
  if chunks:
    out.keys = np.concatenate([c.keys for c in chunks])
    out.hashes = np.concatenate([c.hashes for c in chunks])
  at, key_at = 0, 0
  while chunks:
    chunk = chunks.pop(0)
    m = len(chunk)
    out.probe[at : at + m] = chunk.probe + key_at
    for name, column in out.columns.items():
      column[at : at + m] = chunk.columns[name]
    at, key_at = at + m, key_at + len(chunk.keys)
  return out


class Gather:
  """Batches' chunks gathered into `rows` rows or more before they are split by bucket: split
  by itself, a batch of RIPE Atlas's month (~17,500 buckets, ~12,000 probes nearly all in
  every batch) gave ~8,000 records of ~30 rows, each written and read back at a cost of its
  own (~1 µs a row in all; docs/prepare.md, "Many buckets: a month on one host")."""

  def __init__(self, buckets: int, rows: int, dst_table=None):
    self.buckets, self.rows, self.dst_table = buckets, rows, dst_table
    self.pending: list[Chunk] = []
    self.pending_rows = 0

  def add(self, chunk: Chunk) -> Records | None:
    """The rows gathered so far, split by bucket, once they are `rows` or more; else None."""
    self.pending.append(chunk)
    self.pending_rows += len(chunk)
    return self.flush() if self.pending_rows >= self.rows else None

  def flush(self) -> Records | None:
    """Every row gathered so far, split by bucket (None if none)."""
    if not self.pending:
      return None
    self.pending_rows = 0
    return split_chunks(self.pending, self.buckets, self.dst_table)


def read_chunks(entry, metadata, options, *, hashed, skip_bad, report, on_rows=None,
                bounds=(None, None)):  # fmt: skip
  """`batch_chunk` of every batch of valid rows of one file (`reader.read_batches`) within
  `bounds` (since, until: Unix seconds, None for none); counts the rows read and skipped in
  `report` (a `reader.ReadReport`, with the file's own `FileReport`, of all its valid rows),
  and calls `on_rows(rows)` per batch."""
  file = report.files[entry.uri] = reader.FileReport()
  since, until = bounds
  for columns, skipped, rows in reader.read_batches(entry, metadata, options, skip_bad=skip_bad):
    report.rows_read += rows
    report.skipped.merge(skipped)
    file.add(rows, skipped, columns.seconds)
    if (since is not None or until is not None) and len(columns):
      inside = schema.in_time(columns.seconds, since, until)
      if not inside.all():
        columns = columns.select(inside)
    if len(columns):
      yield batch_chunk(columns, hashed)
    if on_rows is not None:
      on_rows(rows)
