"""The compiled byte-string table against a plain dict, and the probe hashes built on it.

The reference is a Python dict from key bytes to the first-seen order of the keys since the
last reset; every lookup's entries must name the same keys (`table.key(entry) == key`) and
the values the caller stored for them.
"""

import hashlib

import numpy as np
import pytest

from maxtext_netdata.data import lookup, probes


def _batches(rng, count, distinct, sizes=(0, 40)):
  """Batches of variable-length keys (empty keys included) drawn from `distinct` keys."""
  pool = [rng.bytes(int(n)) for n in rng.integers(sizes[0], sizes[1], distinct)]
  pool[0] = b""
  for _ in range(count):
    picked = [pool[i] for i in rng.integers(0, distinct, int(rng.integers(0, 3_000)))]
    offsets = np.zeros(len(picked) + 1, np.int64)
    np.cumsum([len(k) for k in picked], out=offsets[1:])
    yield picked, offsets, np.frombuffer(b"".join(picked), np.uint8)


def _check(table, batches):
  """Run the batches through `table`, storing each key's length+first byte as its value."""
  known: dict[bytes, int] = {}
  for picked, offsets, data in batches:
    resets = table.resets
    entries, new = table.lookup(offsets, data)
    if table.resets != resets:
      known = {}
    for entry in new:
      key = table.key(entry)
      assert key not in known  # inserted once
      known[key] = entry
      table.values[entry] = [len(key), key[0] if key else 0]
    assert len(table) == len(known) and len(table) <= max(table.limit, len(picked))
    assert [known[key] for key in picked] == entries.tolist()
    assert all(table.key(e) == key for e, key in zip(entries, picked, strict=True))
    expected = [[len(k), k[0] if k else 0] for k in picked]
    assert table.values[entries].tolist() == (expected or [])


def test_matches_a_dict_over_many_batches():
  table = lookup.BytesTable((2,), np.int64, limit=1_000_000)
  _check(table, _batches(np.random.default_rng(0), 60, 5_000))
  assert table.resets == 0 and len(table) > 4_000


def test_reset_past_the_limit_keeps_lookups_exact():
  table = lookup.BytesTable((2,), np.int64, limit=700)
  _check(table, _batches(np.random.default_rng(1), 40, 5_000))
  assert table.resets >= 10


@pytest.mark.parametrize("mask", [0, 0x3])
def test_colliding_hashes(mask):
  """Every key in one or four hash chains: found by comparing the bytes."""
  table = lookup.BytesTable((2,), np.int64, hash_mask=mask)
  _check(table, _batches(np.random.default_rng(2), 8, 300, sizes=(0, 3)))
  assert len(table) > 150


def test_fixed_width_keys_that_differ_in_one_byte():
  keys = np.zeros((17 * 16, 17), np.uint8)
  keys[np.arange(len(keys)), np.arange(len(keys)) % 17] = np.arange(len(keys)) // 17 + 1
  table = lookup.BytesTable((1,), np.uint8)
  offsets = np.arange(0, keys.size + 1, 17)
  entries, new = table.lookup(offsets, keys.reshape(-1))
  assert entries.tolist() == list(range(len(keys))) and new == range(len(keys))
  again, new = table.lookup(offsets, keys.reshape(-1))
  assert again.tolist() == entries.tolist() and len(new) == 0


def test_offsets_outside_the_data_are_refused():
  table = lookup.BytesTable((1,), np.uint8)
  with pytest.raises(ValueError, match="outside"):
    table.lookup(np.array([0, 5]), np.zeros(4, np.uint8))
  with pytest.raises(ValueError, match="decrease"):
    table.lookup(np.array([0, 3, 2]), np.zeros(4, np.uint8))
  entries, new = table.lookup(np.array([0]), np.zeros(0, np.uint8))
  assert len(entries) == 0 and len(new) == 0


def test_probe_hashes_are_blake2b_across_batches_and_resets():
  rng = np.random.default_rng(3)
  keys = rng.integers(0, 256, (3_000, 17), dtype=np.uint8)
  keys[:, 0] = rng.choice([4, 6], len(keys))
  expected = np.array(
    [int.from_bytes(hashlib.blake2b(k.tobytes(), digest_size=8).digest(), "big") for k in keys],
    dtype=np.uint64,
  )
  known = probes._KnownHashes(limit=500)
  for _ in range(20):
    picked = rng.integers(0, len(keys), int(rng.integers(1, 400)))
    assert (known.lookup(keys[picked]) == expected[picked]).all()
  assert known.table.resets >= 1
  assert (probes.probe_hashes(keys) == expected).all()


@pytest.mark.parametrize(
  "limit, mask", [(1_000_000, 2**64 - 1), (700, 2**64 - 1), (1_000_000, 0x3)], ids=str
)
def test_words_table_matches_a_dict(limit, mask):
  """Fixed-width keys (3 words), as the probe keys are: entries in first-seen order since the
  last reset, each key inserted once, its value kept; exact through resets and collisions."""
  rng = np.random.default_rng(4)
  pool = rng.integers(0, 2**63, (3_000, 3), dtype=np.uint64)
  pool[1] = pool[0]
  pool[1, 2] ^= np.uint64(1)  # differs from key 0 in one bit of its last word
  table = lookup.WordsTable(3, (1,), np.int64, limit=limit, hash_mask=mask)
  known: dict[bytes, int] = {}
  for _ in range(30):
    picked = pool[rng.integers(0, len(pool), int(rng.integers(0, 2_000)))]
    resets = table.resets
    entries, new = table.lookup(picked)
    if table.resets != resets:
      known = {}
    for entry in new:
      key = table.key(entry).tobytes()
      assert key not in known
      known[key] = entry
      table.values[entry] = entry * 7
    assert [known[key.tobytes()] for key in picked] == entries.tolist()
    assert (table.values[entries, 0] == entries * 7).all()
    assert len(table) == len(known) <= max(limit, len(picked))
  assert (table.resets >= 5) == (limit == 700)
