"""A table of distinct fixed-width keys kept across batches: each batch's keys → entry numbers.

Prepare looks up every batch's probe keys (17 bytes, padded to three uint64 words → the probe
hash) against every key seen before (57k keys a batch among ~85k known at 200M rows). Arrow's
`pc.index_in` rebuilds its hash table of the whole value set on every call, no numpy function
keeps one between calls, and a Python dict costs a Python object per key per call, so this
is our own open-addressing table, compiled by numba (`cache=True`: compiled once per machine,
loaded by later runs): a batch's keys are hashed and matched a word at a time in one compiled
pass (~26 ns a key; byte by byte it was ~80), and only keys never seen before are inserted.

Each entry has a fixed-width value row (`values[entry]`) that the caller computes once, for
the entries a lookup inserted. Memory is bounded: when a lookup leaves more than `limit`
entries, the table is cleared and the lookup redone, so it keeps at most `limit` entries
between lookups (or one lookup's distinct keys, if more).
"""

from __future__ import annotations

import time

import numba
import numpy as np

from maxtext_netdata.kernels import kernel_cache, warmup

kernel_cache.install()  # cached kernels keyed on every project file imported

_EMPTY = np.int64(-1)
_MIX1 = np.uint64(0xFF51AFD7ED558CCD)
_MIX2 = np.uint64(0xC4CEB9FE1A85EC53)
_SEED = np.uint64(0x9E3779B97F4A7C15)


@numba.njit(cache=True, nogil=True, inline="always")
def _fmix(h):
  """MurmurHash3's 64-bit finalizer: every input bit reaches every output bit."""
  h ^= h >> np.uint64(33)
  h *= _MIX1
  h ^= h >> np.uint64(33)
  h *= _MIX2
  return h ^ (h >> np.uint64(33))


def _grown(array: np.ndarray, size: int) -> np.ndarray:
  """`array` with room for at least `size` rows (doubling), its rows kept."""
  if len(array) >= size:
    return array
  out = np.empty((max(size, 2 * len(array)), *array.shape[1:]), array.dtype)
  out[: len(array)] = array
  return out


@numba.njit(cache=True, nogil=True, inline="always")
def _same_words(a, i, b, j):
  for w in range(a.shape[1]):
    if a[i, w] != b[j, w]:
      return False
  return True


@numba.njit(cache=True, nogil=True)
def _lookup_words(words, hash_mask, slots, key_words, key_hash, count, out):
  """Entry of each key row of `words` (uint64 [n, W]) into `out`; unknown keys inserted.

  `slots` int64 [C] holds entries (-1 empty), C a power of two with room for every key of
  this call at half load; `key_words` [≥ count + n, W] and `key_hash` have room for them
  too. `hash_mask` is ANDed into every hash (the tests force collisions with it). Returns the
  number of entries after the call.

  Known keys are found in passes over all keys (hash; first slot; compare), each pass's loads
  independent of one another, so the processor overlaps their cache misses (one pass per key
  cost 2-3 times as much). What the passes did not find is probed and inserted one at a time.

  Rows are copied a word at a time: a row assignment compiles numba's shape-mismatch error,
  whose message formatting (str of ints, string concatenation) took ~3-4 s of a first compile
  of ~4-5 s on a new machine; the loop compiles in a fraction of a second.
  """
  n = len(words)
  mask = np.uint64(len(slots) - 1)
  hashes = np.empty(n, np.uint64)
  for i in range(n):
    h = _SEED ^ np.uint64(words.shape[1])
    for w in range(words.shape[1]):
      h = _fmix(h ^ words[i, w])
    hashes[i] = h & hash_mask
  found = np.empty(n, np.int64)
  for i in range(n):
    found[i] = slots[hashes[i] & mask]
  for i in range(n):
    entry = found[i]
    out[i] = entry if entry != _EMPTY and _same_words(words, i, key_words, entry) else -1
  for i in range(n):
    if out[i] >= 0:
      continue
    pos = hashes[i] & mask
    while True:
      entry = slots[pos]
      if entry == _EMPTY:
        for w in range(words.shape[1]):  # not `key_words[count] = words[i]`: see below
          key_words[count, w] = words[i, w]
        key_hash[count] = hashes[i]
        slots[pos] = count
        out[i] = count
        count += 1
        break
      if _same_words(words, i, key_words, entry):
        out[i] = entry
        break
      pos = (pos + np.uint64(1)) & mask
  return count


@numba.njit(cache=True, nogil=True)
def _rehash_words(key_hash, count, slots):
  mask = np.uint64(len(slots) - 1)
  for entry in range(count):
    pos = key_hash[entry] & mask
    while slots[pos] != _EMPTY:
      pos = (pos + np.uint64(1)) & mask
    slots[pos] = entry


class KeyTable:
  """Distinct keys of `words` uint64 words each (a shorter key padded with zero bytes by the
  caller) → entries 0, 1, ... in the order first seen, with a value row each.

  `lookup` gives each key's entry and the range of entries it inserted, whose `values` rows
  the caller fills before using them. `hash_mask` (all bits by default) narrows the hash:
  tests use it to make every key collide.
  """

  def __init__(self, words: int, value_shape: tuple, value_dtype, limit: int = 1_000_000,
               hash_mask: int = 2**64 - 1):  # fmt: skip
    self.words, self.limit = words, limit
    self.value_shape, self.value_dtype = tuple(value_shape), np.dtype(value_dtype)
    self.hash_mask = np.uint64(hash_mask)
    self.resets = 0
    self.clear()

  def clear(self) -> None:
    """Forget every entry (the memory bound)."""
    self.count = 0
    self.slots = np.full(1 << 10, -1, np.int64)
    self.key_words = np.zeros((1 << 9, self.words), np.uint64)
    self.key_hash = np.zeros(1 << 9, np.uint64)
    self.values = np.zeros((1 << 9, *self.value_shape), self.value_dtype)

  def __len__(self) -> int:
    return self.count

  def key(self, entry: int) -> np.ndarray:
    """The key words of `entry` (uint64 [words])."""
    return self.key_words[entry]

  def lookup(self, words: np.ndarray) -> tuple[np.ndarray, range]:
    """(entry int64 [K] of each key row of uint64 [K, words], the new entries)."""
    words = np.ascontiguousarray(words, dtype=np.uint64).reshape(-1, self.words)
    out = np.empty(len(words), np.int64)
    first = self.count
    wanted = self.count + len(words)
    self.key_words = _grown(self.key_words, wanted)
    self.key_hash = _grown(self.key_hash, wanted)
    self.values = _grown(self.values, wanted)
    if 2 * wanted > len(self.slots):
      capacity = len(self.slots)
      while capacity < 2 * wanted:
        capacity *= 2
      self.slots = np.full(capacity, -1, np.int64)
      _rehash_words(self.key_hash, self.count, self.slots)
    self.count = _lookup_words(words, self.hash_mask, self.slots, self.key_words,
                               self.key_hash, self.count, out)  # fmt: skip
    if self.count > self.limit and first:
      self.resets += 1
      self.clear()
      return self.lookup(words)
    return out, range(first, self.count)


# A long first compile is named on stderr where it is paid (`warmup.noted`).
_lookup_words = warmup.noted(_lookup_words, "compiled the key table's lookup")
_rehash_words = warmup.noted(_rehash_words, "compiled the key table's rehash")


def compile_seconds() -> float:
  """Seconds to compile (first run on a machine) or load (later runs) the compiled lookup."""
  started = time.perf_counter()
  KeyTable(3, (8,), np.uint8, limit=4).lookup(np.zeros((2, 3), np.uint64))
  return time.perf_counter() - started
