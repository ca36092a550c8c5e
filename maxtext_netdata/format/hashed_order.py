"""The original ping-LLM format's deterministic field order (`hashed`), vectorized.

Per row: seed = big-endian first 4 bytes of md5("{src}|{dst}|{unix_seconds}") over the
address text as stored (null as empty); `random.Random(seed).shuffle` of [src, dst, result,
timestamp], or of [src, dst, result] with the timestamp put last when the row has none.

Seeding a `random.Random` costs ~15 us, far more than the rest, so this module reproduces
CPython's Mersenne Twister seeding (`init_by_array` of one 32-bit key word) and its first
outputs in numpy over many rows at once, and replays `shuffle`'s rejection sampling on those
outputs. A row that would need more outputs than computed (rare: none of 400,000 rows
tried) is shuffled by `random` itself. Only the md5 stays per-row Python (~1 us).
"""

from __future__ import annotations

import hashlib
import itertools
import random

import numpy as np

# Block ids as in `tokens` (BLOCK_SRC, BLOCK_DST, BLOCK_RESULT, BLOCK_TIMESTAMP = 0..3); an
# order's index is its rank in itertools.permutations(range(4)), as in tokenizer.PERMUTATIONS.
_DIGITS = 4 ** np.arange(3, -1, -1)
_RANK = np.zeros(4**4, dtype=np.uint8)
_RANK[np.array(list(itertools.permutations(range(4)))) @ _DIGITS] = np.arange(24)

_N, _M = 624, 397
_WORDS = 24  # MT outputs computed per row; a 4-shuffle needs 5.3 on average
_CHUNK = 16_384  # rows per numpy pass: the state is 624 x 4 bytes per row


def _init_genrand_19650218() -> np.ndarray:
  state = [19650218]
  for i in range(1, _N):
    state.append((1812433253 * (state[-1] ^ (state[-1] >> 30)) + i) & 0xFFFFFFFF)
  return np.array(state, dtype=np.uint32)


_BASE_STATE = _init_genrand_19650218()


def mt_first_outputs(seeds: np.ndarray, count: int = _WORDS) -> np.ndarray:
  """uint32 [N, count]: the first outputs of `random.Random(seed)` for 32-bit seeds.

  CPython seeds MT19937 with `init_by_array([seed])`; the first twist makes output i from
  state words i, i + 1 and i + 397 only, so `count` <= 227 outputs need no full twist.
  """
  seeds = np.asarray(seeds, dtype=np.uint32)
  state = np.empty((_N, len(seeds)), dtype=np.uint32)
  state[:] = _BASE_STATE[:, None]
  mixed = np.empty(len(seeds), dtype=np.uint32)

  def mix(i: int, multiplier: int) -> None:
    """state[i] ^= (state[i - 1] ^ (state[i - 1] >> 30)) * multiplier, in place."""
    previous = state[i - 1]
    np.right_shift(previous, 30, out=mixed)
    np.bitwise_xor(mixed, previous, out=mixed)
    np.multiply(mixed, np.uint32(multiplier), out=mixed)
    np.bitwise_xor(state[i], mixed, out=state[i])

  i = 1
  for _ in range(_N):  # max(N, key length) steps; the key word index is always 0
    mix(i, 1664525)
    state[i] += seeds
    i += 1
    if i >= _N:
      state[0] = state[_N - 1]
      i = 1
  for _ in range(_N - 1):
    mix(i, 1566083941)
    state[i] -= np.uint32(i)
    i += 1
    if i >= _N:
      state[0] = state[_N - 1]
      i = 1
  state[0] = 0x80000000
  y = (state[:count] & np.uint32(0x80000000)) | (state[1 : count + 1] & np.uint32(0x7FFFFFFF))
  y = state[_M : _M + count] ^ (y >> 1) ^ np.where(y & 1, np.uint32(0x9908B0DF), np.uint32(0))
  y ^= y >> 11
  y ^= (y << 7) & np.uint32(0x9D2C5680)
  y ^= (y << 15) & np.uint32(0xEFC60000)
  y ^= y >> 18
  return np.ascontiguousarray(y.T)


def _replay_shuffle(words: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
  """(items [N, size], complete [N]) of `shuffle(list(range(size)))` on each row's outputs.

  `shuffle` swaps item i (from the last down to 1) with item randbelow(i + 1), where
  randbelow(n) takes the top n.bit_length() bits of the next output until one is < n.
  """
  n = len(words)
  rows = np.arange(n)
  items = np.tile(np.arange(size, dtype=np.intp), (n, 1))
  pointer = np.zeros(n, dtype=np.intp)
  complete = np.ones(n, dtype=bool)
  for i in range(size - 1, 0, -1):
    bound = i + 1
    shift = np.uint32(32 - bound.bit_length())
    pick = np.zeros(n, dtype=np.intp)
    pending = complete.copy()
    while pending.any():
      exhausted = pending & (pointer >= words.shape[1])
      candidate = (words[rows, np.minimum(pointer, words.shape[1] - 1)] >> shift).astype(np.intp)
      accepted = pending & ~exhausted & (candidate < bound)
      pick[accepted] = candidate[accepted]
      pointer[pending] += 1
      complete &= ~exhausted
      pending &= ~accepted & ~exhausted
    last = items[:, i].copy()
    items[:, i] = items[rows, pick]
    items[rows, pick] = last
  return items, complete


def _rank(items: np.ndarray) -> np.ndarray:
  return _RANK[items @ _DIGITS]


def _seeds(src_text, dst_text, seconds) -> np.ndarray:
  src = src_text.to_pylist() if hasattr(src_text, "to_pylist") else list(src_text)
  dst = dst_text.to_pylist() if hasattr(dst_text, "to_pylist") else list(dst_text)
  seconds = np.asarray(seconds, dtype=np.int64).tolist()
  md5 = hashlib.md5
  return np.fromiter(
    (
      int.from_bytes(md5(f"{s or ''}|{d or ''}|{t}".encode()).digest()[:4], "big")
      for s, d, t in zip(src, dst, seconds, strict=True)
    ),
    dtype=np.uint32,
    count=len(seconds),
  )


def _python_order(seed: int, has_ts: bool) -> int:
  blocks = [0, 1, 2, 3] if has_ts else [0, 1, 2]
  random.Random(seed).shuffle(blocks)
  return int(_rank(np.array(blocks if has_ts else blocks + [3])))


def _orders_of_seeds(seeds: np.ndarray) -> np.ndarray:
  """uint8 [N, 2]: the order without (column 0) and with (column 1) a timestamp."""
  out = np.empty((len(seeds), 2), dtype=np.uint8)
  for lo in range(0, len(seeds), _CHUNK):
    chunk = seeds[lo : lo + _CHUNK]
    words = mt_first_outputs(chunk, _WORDS)
    three, complete_three = _replay_shuffle(words, 3)
    four, complete_four = _replay_shuffle(words, 4)
    out[lo : lo + len(chunk), 0] = _rank(np.concatenate([three, np.full((len(chunk), 1), 3)], 1))
    out[lo : lo + len(chunk), 1] = _rank(four)
    for column, complete in ((0, complete_three), (1, complete_four)):
      for row in np.flatnonzero(~complete):
        out[lo + row, column] = _python_order(int(chunk[row]), bool(column))
  return out


def hashed_order_pairs(src_text, dst_text, seconds) -> np.ndarray:
  """uint8 [N, 2] order indices of each row without (column 0) and with (column 1) a
  timestamp: both from one md5 and one seeding, for stores that decide later."""
  return _orders_of_seeds(_seeds(src_text, dst_text, seconds))


def hashed_orders(src_text, dst_text, seconds, has_ts) -> np.ndarray:
  """uint8 [N] order indices (into tokenizer.PERMUTATIONS) of the `hashed` field order."""
  pairs = hashed_order_pairs(src_text, dst_text, seconds)
  return pairs[np.arange(len(pairs)), np.asarray(has_ts, dtype=bool).astype(np.intp)]
