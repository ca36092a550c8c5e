"""The compiled key table against a plain dict, and the probe hashes built on it.

The reference is a Python dict from key bytes to the first-seen order of the keys since the
last reset; every lookup's entries must name the same keys (`table.key(entry)`) and the
values the caller stored for them.
"""

import hashlib

import numpy as np
import pytest

from maxtext_netdata.data.prepare import probes
from maxtext_netdata.kernels import hash_table


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
  table = hash_table.KeyTable(3, (1,), np.int64, limit=limit, hash_mask=mask)
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
