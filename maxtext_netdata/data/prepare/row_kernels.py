"""Compiled per-row passes of prepare's partition and bucket sort.

Each replaces numpy steps that went over the rows several times (a stable `argsort` of small
integer keys, then gathers, compares and masks for the ties) by one compiled pass with the
same result, bit for bit:

- `counting_order(keys, size)`: the stable order of integer keys in [0, size), which is what
  `np.argsort(keys, kind="stable")` returns, and each key's bounds in it. A counting sort:
  two passes over the keys and one over `size` counters, where numpy's radix sort of 16-bit
  keys reads them twice per byte and needs a copy cast to uint16 (and sorts wider keys by
  merge sort).
- `ties(probe, seconds, perm)`: whether `perm` orders the rows by (probe, seconds), and which
  neighbouring rows share both, in one pass (numpy gathered both columns through `perm` and
  compared them in four more passes over temporaries).
- `time_grouped_order(keys, size, seconds)`: both of the above at once for rows that arrive
  in time order, as a dump's do: each row is compared with the previous row of its key as it
  is placed, reading the rows once and in order.
- `rtt_payload(rtt_ms)`: `format.tokenizer.rtt_bytes`, the RTT payload bytes and failed flags
  of every row in one pass without the five float64 temporaries.
- `write_records`, `scatter_rows(...)`: gathered batches' rows (`partition.Gather`) written
  straight into their buckets' records (`partition.Records`): each batch read once, in
  order, and no gather through a permutation of all gathered rows (which missed the cache:
  4x the time of the same gathers per batch).
- `unpack_records(data, ...)`: records (a spill file's, a Beam bucket's) into one chunk's
  columns; a bucket's file holds one record per gathering (RIPE Atlas's month: ~7,000),
  which numpy took ~20 µs each to unpack.

Compiled by numba with `cache=True` (once per machine, loaded by later runs); a first compile
that takes more than ~2 s says so on stderr with its time (`warmup.noted`).
"""

from __future__ import annotations

import math
import time

import numba
import numpy as np

from maxtext_netdata.kernels import kernel_cache, warmup

kernel_cache.install()  # cached kernels keyed on every project file imported


@numba.njit(cache=True, nogil=True)
def _counting_order(keys, size, order, bounds):
  for i in range(len(keys)):
    bounds[keys[i] + 1] += 1
  for k in range(size):
    bounds[k + 1] += bounds[k]
  at = bounds[:-1].copy()
  for i in range(len(keys)):
    key = keys[i]
    order[at[key]] = i
    at[key] += 1


def counting_order(keys: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
  """(order int64 [N], bounds int64 [size + 1]) of integer `keys`, each in [0, size).

  `order` is `np.argsort(keys, kind="stable")`; the rows of key k are
  `order[bounds[k]:bounds[k + 1]]`. The caller guarantees the range (keys outside it would
  write outside the arrays).
  """
  order = np.empty(len(keys), np.int64)
  bounds = np.zeros(size + 1, np.int64)
  if len(keys):
    _counting_order(keys, size, order, bounds)
  return order, bounds


@numba.njit(cache=True, nogil=True)
def _time_grouped_order(keys, seconds, size, order, bounds, tie):
  for i in range(len(keys)):
    bounds[keys[i] + 1] += 1
  for k in range(size):
    bounds[k + 1] += bounds[k]
  at = bounds[:-1].copy()
  last = np.empty(size, np.int64)  # the seconds of each key's row placed last
  count = 0
  for i in range(len(keys)):
    key = keys[i]
    pos = at[key]
    second = seconds[i]
    if pos > bounds[key]:
      if second < last[key]:
        return -1
      if second == last[key]:
        tie[pos - 1] = True
        count += 1
    last[key] = second
    order[pos] = i
    at[key] = pos + 1
  return count


def time_grouped_order(keys: np.ndarray, size: int, seconds: np.ndarray) -> tuple | None:
  """(order, tie, number of ties) as `counting_order` then `ties` give them, in one pass; None
  if that order does not leave each key's rows in time order (`ties` would say None).

  The rows of a key arrive in `order` in the order they come, so each is compared with the
  key's row placed before it: no gather through the order.
  """
  order = np.empty(len(keys), np.int64)
  bounds = np.zeros(size + 1, np.int64)
  tie = np.zeros(max(len(keys) - 1, 0), dtype=bool)
  count = _time_grouped_order(keys, seconds, size, order, bounds, tie) if len(keys) else 0
  return None if count < 0 else (order, tie, int(count))


@numba.njit(cache=True, nogil=True)
def _ties(probe, seconds, perm, tie):
  count = 0
  for i in range(1, len(perm)):
    before, row = perm[i - 1], perm[i]
    same = probe[row] == probe[before]
    if same and seconds[row] < seconds[before]:
      return -1
    equal = same and seconds[row] == seconds[before]
    tie[i - 1] = equal
    count += equal
  return count


def ties(probe: np.ndarray, seconds: np.ndarray, perm: np.ndarray) -> tuple[np.ndarray, int] | None:
  """(tie bool [N-1], number of ties): row i+1 of `perm` has the same (probe, seconds) as row
  i; None if `perm` does not order the rows by (probe, seconds)."""
  tie = np.empty(max(len(perm) - 1, 0), dtype=bool)
  count = _ties(probe, seconds, perm, tie)
  return None if count < 0 else (tie, int(count))


@numba.njit(cache=True, nogil=True)
def _rtt_payload(rtt_ms, out, failed):
  for i in range(len(rtt_ms)):
    rtt = np.float64(rtt_ms[i])
    if not math.isfinite(rtt):
      return i
    us = max(1.0, rtt * 1000)
    # As tokenizer.rtt_bytes (frexp, clip, ldexp, clamp, truncate), from the float's bits:
    # `us` >= 1 is normal, so frexp's exponent is the biased exponent less 1022, and scaling
    # by 2**-e (e <= 31) is exact. An infinite `us` (rtt over ~1.8e305 ms) is the largest
    # code, as a finite one past it is (tokenizer.rtt_bytes caps the RTT first).
    biased = np.int64((np.float64(us).view(np.uint64) >> np.uint64(52)) & np.uint64(0x7FF))
    e = 31 if biased == 0x7FF else min(max(biased - 1022 - 11, 0), 31)
    scale = np.uint64(1023 - e) << np.uint64(52)
    m = np.int64(min(us * np.uint64(scale).view(np.float64), 2047.0))
    negative = rtt < 0
    failed[i] = negative
    out[i, 0] = 0 if negative else (e << 3) | (m >> 8)
    out[i, 1] = 0 if negative else m & 0xFF
  return -1


def rtt_payload(rtt_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """`format.tokenizer.rtt_bytes(rtt_ms)`: (uint8 [N, 2] payload bytes, bool [N] failed);
  ValueError naming the first NaN or infinite RTT."""
  rtt_ms = np.ascontiguousarray(rtt_ms)
  out = np.empty((len(rtt_ms), 2), np.uint8)
  failed = np.empty(len(rtt_ms), dtype=bool)
  row = _rtt_payload(rtt_ms, out, failed) if len(rtt_ms) else -1
  if row >= 0:
    raise ValueError(f"RTT at index {row} is {rtt_ms[row]}; RTTs must be finite")
  return out, failed


HASHED, DST_INDEXED = 1, 2  # a record's flags


def record_layout(n, k, flags):
  """(size, offsets of the probe, dst, seconds, rtt and hashed-order parts) of the record of
  n rows and k probe keys (integers, or int64 arrays of them): a header of three int64 (n, k,
  flags), the keys (17 bytes each), their uint64 hashes, the rows' probes (int32), dst (16
  bytes, or with `DST_INDEXED` a uint32 index into the build's table of destinations),
  seconds (uint32), rtt payloads (2 bytes) and hashed orders (2 bytes, with `HASHED`), each
  part starting on 8 bytes."""
  hashed, indexed = flags & HASHED, (flags & DST_INDEXED) // DST_INDEXED
  probe = 24 + (17 * k + 7) // 8 * 8 + 8 * k
  dst = probe + (4 * n + 7) // 8 * 8
  seconds = dst + 16 * n * (1 - indexed) + (4 * n + 7) // 8 * 8 * indexed
  rtt = seconds + (4 * n + 7) // 8 * 8
  order = rtt + (2 * n + 7) // 8 * 8
  size = order + (2 * n + 7) // 8 * 8 * hashed
  return size, probe, dst, seconds, rtt, order


# The same arithmetic, compiled, for the kernels (numpy computes it for arrays of records).
_layout = numba.njit(cache=True, nogil=True)(record_layout)


@numba.njit(cache=True, nogil=True)
def _unpack_records(data, d16, d32, d64, row, key, probe, dst, seconds, rtt, order, keys, hashes,
                    table):  # fmt: skip
  at = 0  # records start on 8 bytes: the views index their parts directly
  while at + 24 <= len(data):
    n, k, flags = d64[at // 8], d64[at // 8 + 1], d64[at // 8 + 2]
    size, p_probe, p_dst, p_seconds, p_rtt, p_order = _layout(n, k, flags)
    if at + size > len(data):
      break  # the record goes on past the block
    if flags & DST_INDEXED and len(table) == 0:
      return -1, row, key  # an indexed record without its table
    for j in range(17 * k):
      keys[17 * key + j] = data[at + 24 + j]
    for j in range(k):
      hashes[key + j] = d64[(at + p_probe) // 8 - k + j]
    for i in range(n):
      probe[row + i] = d32[(at + p_probe) // 4 + i] + key
      seconds[row + i] = d32[(at + p_seconds) // 4 + i]
      rtt[row + i] = d16[(at + p_rtt) // 2 + i]
    if flags & DST_INDEXED:
      for i in range(n):
        entry = d32[(at + p_dst) // 4 + i]
        dst[row + i, 0] = table[entry, 0]
        dst[row + i, 1] = table[entry, 1]
    else:
      for i in range(n):
        dst[row + i, 0] = d64[(at + p_dst) // 8 + 2 * i]
        dst[row + i, 1] = d64[(at + p_dst) // 8 + 2 * i + 1]
    if flags & HASHED:
      for i in range(n):
        order[row + i] = d16[(at + p_order) // 2 + i]
    at += size
    row += n
    key += k
  return at, row, key


def unpack_records(data, row: int, key: int, probe, dst, seconds, rtt, order, keys, hashes,
                   table=None):  # fmt: skip
  """The whole records at the start of uint8 `data` (`partition.Records`; 8-aligned) into
  the columns from row `row` (probe int32, dst uint8 [N, 16], seconds int64, rtt uint8
  [N, 2], order uint8 [N, 2] or [0, 2] without the hashed order) and the probe tables (keys
  uint8 [K, 17], hashes uint64 [K]) from key `key`, each row's probe made an index into the
  joined table, the seconds widened, an indexed destination looked up in `table` (uint8
  [D, 16], the build's table the records were written with).

  (bytes read, rows, keys written so far): the bytes after those begin a record that goes on
  past `data`. The caller sizes the arrays from the records' headers.
  """
  views = [data[: len(data) // size * size].view(dtype) for size, dtype in _WORDS]
  words = np.zeros((0, 2), np.uint64) if table is None else np.asarray(table).view(np.uint64)
  used, row, key = _unpack_records(
    data, *views, row, key, probe, dst.view(np.uint64), seconds,
    rtt.view(np.uint16).reshape(-1), order.view(np.uint16).reshape(-1), keys.reshape(-1),
    hashes, words,
  )  # fmt: skip
  if used < 0:
    raise ValueError("records of indexed destinations, read without their table")
  return used, row, key


_WORDS = ((2, np.uint16), (4, np.uint32), (8, np.uint64))


@numba.njit(cache=True, nogil=True)
def _record_heads(data, d64, held, start, rows, key_bounds, flags, keys, hashes):
  for i in range(len(held)):
    at, k0, k1 = start[i], key_bounds[i], key_bounds[i + 1]
    d64[at // 8] = rows[i]
    d64[at // 8 + 1] = k1 - k0
    d64[at // 8 + 2] = flags
    for j in range(17 * (k1 - k0)):
      data[at + 24 + j] = keys[17 * k0 + j]
    probe_at = _layout(rows[i], k1 - k0, flags)[1]
    for j in range(k1 - k0):
      d64[(at + probe_at) // 8 - (k1 - k0) + j] = hashes[k0 + j]


@numba.njit(cache=True, nogil=True)
def _scatter_rows(probe, key_at, key_bucket, key_local, dst, dst_index, seconds, rtt, order,
                  cursor, parts, d16, d32, d64):  # fmt: skip
  hashed, indexed = order.shape[0] > 0, dst_index.shape[0] > 0
  for i in range(len(probe)):
    key = key_at + probe[i]
    bucket = key_bucket[key]
    j = cursor[bucket]
    cursor[bucket] = j + 1
    d32[parts[bucket, 0] // 4 + j] = key_local[key]
    if indexed:
      d32[parts[bucket, 1] // 4 + j] = dst_index[i]
    else:
      d64[parts[bucket, 1] // 8 + 2 * j] = dst[i, 0]
      d64[parts[bucket, 1] // 8 + 2 * j + 1] = dst[i, 1]
    d32[parts[bucket, 2] // 4 + j] = seconds[i]
    d16[parts[bucket, 3] // 2 + j] = rtt[i]
    if hashed:
      d16[parts[bucket, 4] // 2 + j] = order[i]


def write_records(data, held, start, rows, key_bounds, flags: int, keys, hashes) -> None:
  """The head of each record in uint8 `data` (zeros, 8-aligned): record i, of bucket
  `held[i]`, starts at byte `start[i]` and holds `rows[i]` rows and the probe keys
  `keys[key_bounds[i]:key_bounds[i + 1]]` (uint8 [K, 17], with their uint64 `hashes`)."""
  _record_heads(
    data, data.view(np.int64), held, start, rows, key_bounds, flags, keys.reshape(-1), hashes,
  )  # fmt: skip


def scatter_rows(probe, key_at: int, key_bucket, key_local, columns: dict, cursor, parts,
                 data, dst_index=None) -> None:  # fmt: skip
  """Place the rows of one chunk (probe int32 [n], indexing keys `key_at + probe` of the
  gathered table) into their buckets' records in `data`: row i is row `cursor[bucket]` of its
  bucket's record (the counter advanced), whose parts (probe, dst, seconds, rtt, hashed
  order) start at bytes `parts[bucket]`; its probe is written as `key_local[key]`, the key's
  number in its bucket's table, its destination as `dst_index[i]` when given. The chunk is
  read once, in order."""

  def words(name: str) -> np.ndarray:  # 2-byte rows as one uint16 each
    array = columns.get(name)
    return np.zeros(0, np.uint16) if array is None else array.view(np.uint16).reshape(-1)

  _scatter_rows(
    probe, key_at, key_bucket, key_local, columns["dst"].view(np.uint64),
    np.zeros(0, np.uint32) if dst_index is None else dst_index, columns["seconds"],
    words("rtt_bytes"), words("hashed_order"), cursor, parts,
    *(data.view(dtype) for _, dtype in _WORDS),
  )  # fmt: skip


def compile_seconds() -> float:
  """Seconds to compile (first run on a machine) or load (later runs) these kernels."""
  started = time.perf_counter()
  counting_order(np.zeros(2, np.int32), 1)
  counting_order(np.zeros(2, np.uint16), 1)
  counting_order(np.zeros(2, np.int64), 1)
  ties(np.zeros(2, np.int32), np.zeros(2, np.int64), np.arange(2))
  time_grouped_order(np.zeros(2, np.int32), 1, np.zeros(2, np.int64))
  rtt_payload(np.zeros(1))
  two = np.zeros((2, 2), np.uint8)
  unpack_records(np.zeros(0, np.uint8), 0, 0, np.zeros(0, np.int32), np.zeros((0, 16), np.uint8),
                 np.zeros(0, np.int64), two, two, np.zeros((0, 17), np.uint8),
                 np.zeros(0, np.uint64))  # fmt: skip
  one, data = np.zeros(1, np.int64), np.zeros(64, np.uint8)
  write_records(data, one, one, one, np.array([0, 1]), 0, np.zeros((1, 17), np.uint8),
                np.zeros(1, np.uint64))  # fmt: skip
  columns = {"dst": np.zeros((1, 16), np.uint8), "seconds": one, "rtt_bytes": two[:1].copy()}
  scatter_rows(np.zeros(1, np.int32), 0, one, np.zeros(1, np.int32), columns, one.copy(),
               np.zeros((1, 5), np.int64) + 8, np.zeros(64, np.uint8))  # fmt: skip
  return time.perf_counter() - started


# Called through `warmup.noted`: a long first compile is named on stderr where it is paid.
_counting_order = warmup.noted(_counting_order, "prepare: compiled the counting sort")
_time_grouped_order = warmup.noted(_time_grouped_order, "prepare: compiled the time order")
_ties = warmup.noted(_ties, "prepare: compiled the tie check")
_rtt_payload = warmup.noted(_rtt_payload, "prepare: compiled the RTT payload pass")
_unpack_records = warmup.noted(_unpack_records, "prepare: compiled the spill reader")
_record_heads = warmup.noted(_record_heads, "prepare: compiled the spill record heads")
_scatter_rows = warmup.noted(_scatter_rows, "prepare: compiled the bucket scatter")
