"""A batch's probes: numbered from the source column, hashed once per process.

A probe is (version, source address); its hash, the first 8 bytes of
`blake2b(version byte + 16 address bytes)` read big-endian, orders the store and decides
the probe split (docs/spec.md §3). `batch_probes` numbers a validated batch's probes from the source
column's dictionary indices (one compiled pass), merges the keys that the joined row groups'
dictionaries repeat, and hashes each key once per process (`_KnownHashes`).
"""

from __future__ import annotations

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from maxtext_netdata.data.raw import ip_text, probe_hash, schema
from maxtext_netdata.kernels import hash_table, kernel_cache

kernel_cache.install()  # cached kernels keyed on every project file imported


class _KnownHashes:
  """Probe hashes computed so far in this process, kept in a `hash_table.KeyTable`.

  A dump's probes (~50k in 200M rows) recur in every batch: each key is hashed once with
  blake2b in Python, a batch's keys are then matched in one compiled pass (Arrow's `index_in`
  rebuilt its hash table of every known key on each call). The table keeps at most `limit`
  keys, which bounds its memory.
  """

  def __init__(self, limit: int = 1_000_000):
    self.table = hash_table.KeyTable(3, (8,), np.uint8, limit=limit)  # 17 bytes in 3 words

  def lookup(self, keys: np.ndarray) -> np.ndarray:
    return self.entries(keys)[1]

  def entries(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(entry int64 [K], hash uint64 [K]) of each key: equal keys have equal entries."""
    padded = np.zeros((len(keys), 24), np.uint8)
    padded[:, :17] = np.asarray(keys, dtype=np.uint8).reshape(-1, 17)
    entries, new = self.table.lookup(padded.view(np.uint64))
    if len(new):
      stored = self.table.key_words[new.start : new.stop].view(np.uint8)[:, :17]
      digests = b"".join(probe_hash.digest(key.tobytes()) for key in stored)
      self.table.values[new.start : new.stop] = np.frombuffer(digests, np.uint8).reshape(-1, 8)
    return entries, self.table.values[entries].view(">u8")[:, 0].astype(np.uint64)


_KNOWN = _KnownHashes()


def _binary17(keys: np.ndarray) -> pa.Array:
  """uint8 [K, 17] as an Arrow binary(17) array over the same bytes."""
  return pa.Array.from_buffers(pa.binary(17), len(keys), [None, pa.py_buffer(keys)])


def probe_hashes(keys: np.ndarray) -> np.ndarray:
  """uint64 [K]: the hash of each (version byte + 16 address bytes) key of uint8 [K, 17]."""
  return _KNOWN.lookup(keys) if len(keys) else np.zeros(0, np.uint64)


@numba.njit(cache=True, nogil=True)
def _probe_codes(index, empty, version, probe):
  """Number the rows' probes in order of first appearance into `probe`; the first row of each.

  A row's probe is its source's dictionary entry `index`, and for an `empty` entry (the zero
  address of either version) the entry and the row's version.
  """
  size = len(empty)
  seen = np.empty(2 * size, np.int32)
  for code in range(2 * size):  # not np.full: its compile took ~0.5-1 s of a machine's first run
    seen[code] = -1
  first = np.empty(len(index), np.int64)
  count = 0
  for i in range(len(index)):
    code = np.int64(index[i])
    if empty[code] and version[i] == 6:
      code += size
    number = seen[code]
    if number < 0:
      number = seen[code] = count
      first[count] = i
      count += 1
    probe[i] = number
  return first[:count]


def first_codes(index: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
  """(code int32 [n], first row int64 [E]) of dictionary indices `index` (int32, in [0,
  size)): the indices renumbered in the order of their first row, and that row of each
  (`_probe_codes` without its empty entries; numpy's scatter and gathers took ~12 ns a row)."""
  codes = np.empty(len(index), np.int32)
  rows = _probe_codes(index, np.zeros(size, bool), np.zeros(len(index), np.uint8), codes)
  return codes, rows


def _batch_probes(columns: schema.RawColumns) -> tuple[np.ndarray, np.ndarray]:
  """(probe of each row int32 [n], key of each probe uint8 [K, 17]) of a validated batch.

  A key may appear twice (two texts of one address); `order_bucket` merges such probes.
  """
  n = len(columns)
  text = columns.src_text
  if isinstance(text, pa.DictionaryArray) and n:
    # The source's dictionary index is the probe: a non-empty address text has one family and
    # a valid row's version is that family, so (version, address) follows from the index. An
    # empty or null text is the zero address of the row's version: a code per version.
    dictionary = text.dictionary
    size = len(dictionary) + 1  # entry `len(dictionary)` stands for null rows
    offsets, _ = ip_text.string_buffers(dictionary)
    empty = np.ones(size, dtype=bool)
    empty[:-1] = offsets[1:] == offsets[:-1]
    if dictionary.null_count:
      empty[:-1] |= dictionary.is_null().to_numpy(zero_copy_only=False)
    index = text.indices
    if index.null_count:
      index = index.fill_null(size - 1)
    probe = np.empty(n, dtype=np.int32)
    rows = _probe_codes(index.to_numpy(), empty, columns.version, probe)
    table = np.empty((len(rows), 17), dtype=np.uint8)
    table[:, 0] = columns.version[rows]
    table[:, 1:] = columns.src[rows]
    return probe, table
  keys = np.empty((n, 17), dtype=np.uint8)
  keys[:, 0] = columns.version
  keys[:, 1:] = columns.src
  # Arrow's hash table finds the batch's probes in one C++ pass over the 17-byte keys.
  encoded = pc.dictionary_encode(_binary17(keys))
  probe = encoded.indices.to_numpy().astype(np.int32, copy=False)
  dictionary = encoded.dictionary
  table = np.frombuffer(dictionary.buffers()[1], dtype=np.uint8)
  table = table[dictionary.offset * 17 : (dictionary.offset + len(dictionary)) * 17]
  return probe, table.reshape(-1, 17)


def _merged(probe, table, entry, hashes) -> tuple:
  """(probe, table, hashes) with the keys of equal `entry` (the same bytes) made one.

  A batch joins row groups whose dictionaries repeat the same sources, so its source
  dictionary names a probe up to once per row group; one key per probe keeps the chunks'
  probe tables (spilled, merged when a bucket is sorted) to the batch's distinct probes.
  """
  if len(entry) < 2:
    return probe, table, hashes
  mark = np.empty(int(entry.max()) + 1, np.int64)
  mark[entry] = np.arange(len(entry))  # one key of each entry (whichever numpy writes last)
  first = mark[entry]
  keep = first == np.arange(len(entry))
  if keep.all():
    return probe, table, hashes
  local = (np.cumsum(keep, dtype=np.int32) - 1)[first]
  return local[probe], table[keep], hashes[keep]


def batch_probes(columns: schema.RawColumns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(probe of each row int32 [n], key of each probe uint8 [K, 17], its hash uint64 [K])."""
  probe, table = _batch_probes(columns)
  if not len(table):
    return probe, table, np.zeros(0, np.uint64)
  return _merged(probe, table, *_KNOWN.entries(table))
