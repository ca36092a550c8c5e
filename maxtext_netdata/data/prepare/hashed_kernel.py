"""The `hashed` field order of every row, compiled: `format.hashed_order.hashed_order_pairs`
bit for bit, ~5x faster.

Per row the order is decided by `random.Random(seed).shuffle` with seed = the big-endian first
4 bytes of md5("{src}|{dst}|{unix_seconds}") (docs/spec.md §2). `format.hashed_order` holds the
reference: md5 per row in Python (~3 us) and CPython's Mersenne Twister seeding replayed in
numpy over 16k rows at a time (~5 us a row: 1,247 passes over the rows' 624-word states). A
store with `network_field_order: hashed` spent more on it than on the rest of prepare. Here
one compiled pass builds each row's message straight from the Arrow text buffers and runs
md5 (RFC 1321) on it, seeds the twisters of 64 rows side by side, takes their first outputs
and replays both shuffles (without and with a timestamp): ~1.5 us a row against ~8.7.
numba has no md5 and hashlib cannot be called from compiled code, hence our own
implementation; tests check it against hashlib and the reference.

A row whose shuffle would need more than `OUTPUTS` twister outputs (rare: none of 400,000 rows
tried) is marked and handed to the reference's `random.Random` replay, as the numpy version
does.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from maxtext_netdata.format import hashed_order
from maxtext_netdata.kernels import kernel_cache, warmup

kernel_cache.install()  # cached kernels keyed on every project file imported

OUTPUTS = 24  # twister outputs per row, as format.hashed_order._WORDS
_M32 = 0xFFFFFFFF
_MD5_SHIFTS = np.array([7, 12, 17, 22] * 4 + [5, 9, 14, 20] * 4 + [4, 11, 16, 23] * 4
                       + [6, 10, 15, 21] * 4, np.int64)  # fmt: skip
_MD5_K = np.array([int(abs(math.sin(i + 1)) * 2**32) & _M32 for i in range(64)], np.int64)
_BASE_STATE = hashed_order._BASE_STATE.astype(np.int64)  # init_genrand(19650218)
_RANK = hashed_order._RANK.astype(np.int64)  # order rank by 4-digit base-4 code


@numba.njit(cache=True, nogil=True)
def _md5_seed(buf, length, block, shifts, k):
  """Big-endian int of md5(buf[:length])'s first 4 bytes; pads in `buf` (64 spare bytes)."""
  total = ((length + 8) // 64 + 1) * 64
  buf[length] = 0x80
  for i in range(length + 1, total - 8):
    buf[i] = 0
  bits = np.int64(length) * 8
  for i in range(8):
    buf[total - 8 + i] = (bits >> (8 * i)) & 0xFF
  a0, b0, c0, d0 = 0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476
  for start in range(0, total, 64):
    for j in range(16):
      p = start + 4 * j
      block[j] = (
        np.int64(buf[p])
        | (np.int64(buf[p + 1]) << 8)
        | (np.int64(buf[p + 2]) << 16)
        | (np.int64(buf[p + 3]) << 24)
      )
    a, b, c, d = a0, b0, c0, d0
    for i in range(64):
      if i < 16:
        f = (b & c) | (~b & d)
        g = i
      elif i < 32:
        f = (d & b) | (~d & c)
        g = (5 * i + 1) % 16
      elif i < 48:
        f = b ^ c ^ d
        g = (3 * i + 5) % 16
      else:
        f = c ^ (b | (~d & 0xFFFFFFFF))
        g = (7 * i) % 16
      f = (f + a + k[i] + block[g]) & 0xFFFFFFFF
      a, d, c = d, c, b
      s = shifts[i]
      b = (b + (((f << s) | (f >> (32 - s))) & 0xFFFFFFFF)) & 0xFFFFFFFF
    a0 = (a0 + a) & 0xFFFFFFFF
    b0 = (b0 + b) & 0xFFFFFFFF
    c0 = (c0 + c) & 0xFFFFFFFF
    d0 = (d0 + d) & 0xFFFFFFFF
  return ((a0 & 0xFF) << 24) | (((a0 >> 8) & 0xFF) << 16) | (((a0 >> 16) & 0xFF) << 8) | (a0 >> 24)


@numba.njit(cache=True, nogil=True)
def _twister_outputs(seeds, count, base, state, words):
  """words[b, :] = the first outputs of CPython's `random.Random(seeds[b])` (32-bit seeds):
  `init_by_array([seed])`, then each output from state words i, i + 1 and i + 397 of the
  first twist (count <= 227 needs no full twist). The rows' seedings run side by side
  (`state` [624, B]): one row's is a chain of 1,247 dependent steps, which alone left the
  core waiting on each multiply; B independent chains keep it busy and vectorize."""
  rows = len(seeds)
  for i in range(624):
    for b in range(rows):
      state[i, b] = base[i]
  i = 1
  for _ in range(624):
    for b in range(rows):
      prev = state[i - 1, b]
      mixed = np.uint32((prev ^ (prev >> np.uint32(30))) * np.uint32(1664525))
      state[i, b] = np.uint32((state[i, b] ^ mixed) + np.uint32(seeds[b]))
    i += 1
    if i >= 624:
      for b in range(rows):
        state[0, b] = state[623, b]
      i = 1
  for _ in range(623):
    for b in range(rows):
      prev = state[i - 1, b]
      mixed = np.uint32((prev ^ (prev >> np.uint32(30))) * np.uint32(1566083941))
      state[i, b] = np.uint32((state[i, b] ^ mixed) - np.uint32(i))
    i += 1
    if i >= 624:
      for b in range(rows):
        state[0, b] = state[623, b]
      i = 1
  for b in range(rows):
    state[0, b] = 0x80000000
  for n in range(count):
    for b in range(rows):
      y = (np.int64(state[n, b]) & 0x80000000) | (np.int64(state[n + 1, b]) & 0x7FFFFFFF)
      y = np.int64(state[n + 397, b]) ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
      y ^= y >> 11
      y ^= (y << 7) & 0x9D2C5680
      y ^= (y << 15) & 0xEFC60000
      y ^= y >> 18
      words[b, n] = y


@numba.njit(cache=True, nogil=True)
def _shuffled_rank(words, size, rank):
  """Rank of `shuffle(list(range(size)))` (padded with the blocks after it) replayed on
  `words`, or -1 when it would need more outputs than there are."""
  items = np.arange(4)
  p = 0
  for i in range(size - 1, 0, -1):
    bound = i + 1
    bits = 0
    b = bound
    while b:
      bits += 1
      b >>= 1
    while True:
      if p >= len(words):
        return -1
      pick = words[p] >> (32 - bits)
      p += 1
      if pick < bound:
        break
    items[i], items[pick] = items[pick], items[i]
  return rank[items[0] * 64 + items[1] * 16 + items[2] * 4 + items[3]]


@numba.njit(cache=True, nogil=True)
def _append_text(buf, at, offsets, data, index):
  if index >= 0:
    for j in range(offsets[index], offsets[index + 1]):
      buf[at] = data[j]
      at += 1
  return at


@numba.njit(cache=True, nogil=True)
def _message(buf, src, dst, seconds, r, digits):
  """Writes "{src}|{dst}|{seconds}" of row r into `buf`; its length."""
  src_offsets, src_data, src_index = src
  dst_offsets, dst_data, dst_index = dst
  at = _append_text(buf, 0, src_offsets, src_data, src_index[r])
  buf[at] = 124  # |
  at = _append_text(buf, at + 1, dst_offsets, dst_data, dst_index[r])
  buf[at] = 124
  at += 1
  t = seconds[r]
  if t < 0:
    buf[at] = 45  # -
    at += 1
    t = -t
  n = 0
  while True:
    digits[n] = 48 + t % 10
    n += 1
    t //= 10
    if t == 0:
      break
  for j in range(n):
    buf[at + j] = digits[n - 1 - j]
  return at + n


@numba.njit(cache=True, nogil=True)
def _pairs(src, dst, seconds, base, rank, shifts, k, buf, out, outputs):
  """out[r] = (rank without, rank with timestamp) of each row; -1 where outputs ran out."""
  block = np.empty(16, np.int64)
  digits = np.empty(24, np.uint8)
  group = 64
  seeds = np.empty(group, np.int64)
  state = np.empty((624, group), np.uint32)
  words = np.empty((group, outputs), np.int64)
  for lo in range(0, len(seconds), group):
    hi = min(lo + group, len(seconds))
    for r in range(lo, hi):
      length = _message(buf, src, dst, seconds, r, digits)
      seeds[r - lo] = _md5_seed(buf, length, block, shifts, k)
    _twister_outputs(seeds[: hi - lo], outputs, base, state, words)
    for r in range(lo, hi):
      out[r, 0] = _shuffled_rank(words[r - lo], 3, rank)
      out[r, 1] = _shuffled_rank(words[r - lo], 4, rank)


def _text_parts(text) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(int32 offsets, uint8 data, int64 entry of each row, -1 for null) of a string array or
  a dictionary-encoded one; a null address is empty text, as in the reference."""
  text = pa.array(text) if not isinstance(text, pa.Array) else text
  if pa.types.is_dictionary(text.type):
    index = pc.fill_null(text.indices.cast(pa.int64()), -1).to_numpy(zero_copy_only=False)
    values = text.dictionary
  else:
    index = np.where(text.is_valid().to_numpy(zero_copy_only=False), np.arange(len(text)), -1)
    values = text
  values = pc.fill_null(values.cast(pa.string()), "")
  buffers = values.buffers()
  offsets = np.frombuffer(buffers[1], np.int32)[values.offset : values.offset + len(values) + 1]
  data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.zeros(1, np.uint8)
  return np.ascontiguousarray(offsets), data, np.ascontiguousarray(index, dtype=np.int64)


def _longest(parts) -> int:
  offsets = parts[0]
  return int(np.diff(offsets).max()) if len(offsets) > 1 else 0


def hashed_order_pairs(src_text, dst_text, seconds, outputs: int = OUTPUTS) -> np.ndarray:
  """uint8 [N, 2]: `format.hashed_order.hashed_order_pairs` of the rows, compiled.

  `src_text` and `dst_text` are Arrow string arrays (dictionary-encoded or not, nulls read as
  empty text) or sequences of str; `seconds` the rows' Unix seconds. `outputs` (<= 227):
  twister outputs computed per row; a row that needs more is replayed by `random` (a test
  lowers it to send many rows there).
  """
  seconds = np.ascontiguousarray(seconds, dtype=np.int64)
  out = np.empty((len(seconds), 2), np.int64)
  if len(seconds):
    src, dst = _text_parts(src_text), _text_parts(dst_text)
    buf = np.empty(_longest(src) + _longest(dst) + 2 + 20 + 72, np.uint8)
    _pairs(src, dst, seconds, _BASE_STATE, _RANK, _MD5_SHIFTS, _MD5_K, buf, out, outputs)
    for row, column in zip(*np.nonzero(out < 0), strict=True):  # outputs ran out: the reference
      seed = _seed_of_row(src_text, dst_text, seconds, row)
      out[row, column] = hashed_order._python_order(seed, bool(column))
  return out.astype(np.uint8)


def _seed_of_row(src_text, dst_text, seconds, row: int) -> int:
  def text(values):
    value = values[row]
    value = value.as_py() if hasattr(value, "as_py") else value
    return [value]

  return int(hashed_order._seeds(text(src_text), text(dst_text), seconds[row : row + 1])[0])


def md5_seeds(messages: list[bytes]) -> np.ndarray:
  """The md5 seed of each message (the kernel's md5 alone, for checking it)."""
  block = np.empty(16, np.int64)
  out = np.empty(len(messages), np.int64)
  for i, message in enumerate(messages):
    buf = np.zeros(len(message) + 72, np.uint8)
    buf[: len(message)] = np.frombuffer(message, np.uint8)
    out[i] = _md5_seed(buf, len(message), block, _MD5_SHIFTS, _MD5_K)
  return out


# Called through `warmup.noted`: a long first compile is named on stderr where it is paid.
_pairs = warmup.noted(_pairs, "prepare: compiled the hashed field order")
