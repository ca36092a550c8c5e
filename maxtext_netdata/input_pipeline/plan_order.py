"""Which plan row stands at each position of an epoch's stream, without an array of them.

An epoch of RIPE Atlas's month (~35 billion measurements, ~1 billion plan rows) would need an
8 GB permutation of its plan rows, and an argsort of a billion keys to make it (minutes, and
tens of GB), at every epoch boundary. Instead the position is mapped by a keyed bijection:

- shuffled: a Feistel network of ROUNDS rounds over the 2h-bit words (2^2h the least even
  power of two at or above the plan's rows; splitmix64 of the right half with a round key is
  each round's function), with cycle walking: a value at or past the plan's rows is mapped
  again until it falls within them, which keeps it a permutation of range(num_rows). The
  round keys are `order_keys(stream_key(seed, epoch, SHUFFLE))`.
- unshuffled: the plan rows in order of their first store row. Long plan rows come in that
  order already (probe by probe, piece by piece); the few short ones are placed among them by
  `short_position` (ascending) and `short_by_position` (which short row stands there).

`row_at` is the kernel's (one position, compiled into `batch_kernel.fill_batch`); `rows_at` is
the same for an array of positions, for callers in Python (the read-ahead, tests), compiled
once and cached like the kernel (`cache=True`).
"""

from __future__ import annotations

import numba
import numpy as np

from maxtext_netdata.input_pipeline import rng
from maxtext_netdata.kernels import kernel_cache

kernel_cache.install()  # the cache keyed on rng's text too

ROUNDS = 6  # four make a strong pseudo-random permutation of a pseudo-random function
NAME = f"feistel-{ROUNDS}"  # recorded in data positions: a resume under another order is refused


def order_keys(key: np.ndarray) -> np.ndarray:
  """The Feistel network's round keys (uint64 [ROUNDS]) of stream key `key`."""
  return rng.random_bits(key, np.arange(ROUNDS))


@numba.njit
def _half_bits(num_rows):
  """h: half of the least even bit count (at least 2) whose words hold range(num_rows)."""
  bits = 2
  while (np.int64(1) << bits) < num_rows:
    bits += 2
  return bits // 2


@numba.njit
def _feistel(keys, value, half):
  mask = (np.uint64(1) << np.uint64(half)) - np.uint64(1)
  left = value >> np.uint64(half)
  right = value & mask
  for key in keys:
    z = (right ^ key) + np.uint64(rng.GOLDEN)  # splitmix64, as rng.random_bits
    z = (z ^ (z >> np.uint64(30))) * np.uint64(rng.M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(rng.M2)
    left, right = right, left ^ ((z ^ (z >> np.uint64(31))) & mask)
  return (left << np.uint64(half)) | right


@numba.njit
def row_at(keys, short_position, short_by_position, num_long, num_rows, position):
  """The plan row at `position` (0 <= position < num_rows) of an epoch's stream: by the
  Feistel network of round keys `keys`, or where `keys` is empty, in store order (the
  short plan rows at `short_position`, the long ones in between)."""
  if position < 0 or position >= num_rows:  # past the words: the walk would never end
    raise ValueError("plan order: a stream position outside the epoch's plan rows")
  if keys.shape[0]:
    half = _half_bits(num_rows)
    value = _feistel(keys, np.uint64(position), half)
    while value >= np.uint64(num_rows):
      value = _feistel(keys, value, half)
    return np.int64(value)
  j = np.searchsorted(short_position, position, side="right")  # short rows at or before
  if j and short_position[j - 1] == position:
    return num_long + short_by_position[j - 1]
  return position - j


@numba.njit(cache=True, nogil=True)
def rows_at(keys, short_position, short_by_position, num_long, num_rows, positions, out):
  """`row_at` of each of `positions` into `out` (int64, as long)."""
  for i in range(positions.shape[0]):
    out[i] = row_at(keys, short_position, short_by_position, num_long, num_rows, positions[i])
