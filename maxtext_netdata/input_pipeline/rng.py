"""The pipeline's randomness: splitmix64 over uint64 counters, vectorized.

Every random choice of a batch is a pure function of (seed, epoch, purpose) — the stream key —
and of the choice's coordinates: plan row, context index within the row, measurement index
within the context. No generator object or state exists, so any row's choices are computed
directly, in any process, in any order. `batch_kernel` computes the same draws one at a time.
"""

from __future__ import annotations

import numpy as np

# Purposes of random draws; each keeps its own stream. CONTEXT and MEASUREMENT draws are split
# into 21-bit fields (`fraction`) for their several choices.
JITTER, SHUFFLE, PACK_ORDER, CONTEXT, MEASUREMENT, FILLER = range(6)
FIELD_BITS = 21

# The three counters share one 64-bit word: plan row above COUNTER_BITS * 2, then context
# index, then measurement index. Counters at or past their limit would silently reuse draws.
COUNTER_BITS = 12
COUNTER_LIMIT = 1 << COUNTER_BITS
ROW_LIMIT = 1 << (64 - 2 * COUNTER_BITS)

GOLDEN = 0x9E3779B97F4A7C15
M1 = 0xBF58476D1CE4E5B9
M2 = 0x94D049BB133111EB
_GOLDEN, _M1, _M2 = np.uint64(GOLDEN), np.uint64(M1), np.uint64(M2)


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


def _check_below(name: str, values, limit: int) -> None:
  values = np.asarray(values)
  if values.size and (int(values.max()) >= limit or int(values.min()) < 0):
    raise ValueError(f"random_bits: {name} counter outside [0, {limit}); draws would repeat")


def random_bits(key: np.ndarray, row, context=0, index=0) -> np.ndarray:
  """uint64 random bits of `key` at each (row, context, index) of the broadcast arguments.

  The counters are packed into one word (row < ROW_LIMIT, context and index < COUNTER_LIMIT)
  and hashed once, so the result is a pure function of the key and the counter values.
  Counters outside their range raise ValueError: packed, they would collide with others.
  """
  _check_below("row", row, ROW_LIMIT)
  _check_below("context", context, COUNTER_LIMIT)
  _check_below("measurement", index, COUNTER_LIMIT)
  counter = np.asarray(row, dtype=np.uint64) << np.uint64(2 * COUNTER_BITS)
  counter |= np.asarray(context, dtype=np.uint64) << np.uint64(COUNTER_BITS)
  counter |= np.asarray(index, dtype=np.uint64)
  return splitmix64(counter ^ key)


def fraction(bits: np.ndarray, field: int) -> np.ndarray:
  """float64 in [0, 1) from 21-bit field `field` (0, 1 or 2) of uint64 random bits."""
  shifted = bits >> np.uint64(FIELD_BITS * field)
  return (shifted & np.uint64((1 << FIELD_BITS) - 1)).astype(np.float64) * 2.0**-FIELD_BITS


def permutation(key: np.ndarray, n: int) -> np.ndarray:
  """A seeded permutation of range(n): sort by random bits."""
  return np.argsort(random_bits(key, np.arange(n)), kind="stable")
