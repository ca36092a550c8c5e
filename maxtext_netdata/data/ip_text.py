"""Address text → bytes, compiled: glibc's `inet_pton` over a whole Arrow string array.

Prepare parses every entry of every row group's address dictionaries, and in a large dump
those dictionaries are nearly as long as the row groups (~0.86 distinct destinations a row
in generate's 200M-row world), so the parse is per-row work. Measured per entry on such
dictionaries: `socket.inet_pton` from Python ~1 µs, a lookup table kept across row groups
(`data.lookup`, whose compare of the stored bytes misses the cache) ~120 ns, this compiled
parser ~90 ns with nothing kept between calls. It is a line-by-line port of glibc's
`inet_pton4`/`inet_pton6` (resolv/inet_pton.c), which `socket.inet_pton` calls on Linux, so it
accepts and rejects exactly what `socket.inet_pton` does: tests compare the two on generated
and mutated texts of every form (compressed `::`, IPv4-mapped and other embedded IPv4,
leading zeros, upper case, too many groups or digits, stray characters, NUL, non-ASCII).

A text containing ":" is parsed as IPv6, any other as IPv4 (`addresses._parse_one`'s rule).
Compiled by numba with `cache=True` (once per machine, loaded by later runs).
"""

from __future__ import annotations

import numba
import numpy as np
import pyarrow as pa

ADDRESS_BYTES = 16
EMPTY, INVALID = -1, 0  # family codes besides 4 and 6


@numba.njit(cache=True, nogil=True, inline="always")
def _pton4(data, start, stop, out, k, at):
  """glibc's inet_pton4 of data[start:stop] into out[k, at:at+4]; whether it is valid."""
  octets = 0
  saw_digit = False
  value = 0
  pos = at
  for i in range(start, stop):
    ch = data[i]
    if 48 <= ch <= 57:
      if saw_digit and value == 0:
        return False
      value = value * 10 + (ch - 48)
      if value > 255:
        return False
      if not saw_digit:
        octets += 1
        if octets > 4:
          return False
        saw_digit = True
    elif ch == 46 and saw_digit:
      if octets == 4:
        return False
      out[k, pos] = value
      pos += 1
      value = 0
      saw_digit = False
    else:
      return False
  if octets < 4:
    return False
  out[k, pos] = value
  return True


@numba.njit(cache=True, nogil=True, inline="always")
def _hex(ch):
  if 48 <= ch <= 57:
    return ch - 48
  if 97 <= ch <= 102:
    return ch - 87
  if 65 <= ch <= 70:
    return ch - 55
  return -1


@numba.njit(cache=True, nogil=True, inline="always")
def _pton6(data, start, stop, out, k):
  """glibc's inet_pton6 of the non-empty data[start:stop] into out[k]; whether it is valid."""
  src = start
  if data[src] == 58:
    src += 1
    if src == stop or data[src] != 58:
      return False
  curtok = src
  xdigits = 0
  val = 0
  tp = 0
  colonp = -1
  while src < stop:
    ch = data[src]
    src += 1
    digit = _hex(ch)
    if digit >= 0:
      if xdigits == 4:
        return False
      val = (val << 4) | digit
      xdigits += 1
      continue
    if ch == 58:
      curtok = src
      if xdigits == 0:
        if colonp >= 0:
          return False
        colonp = tp
        continue
      elif src == stop:
        return False
      if tp + 2 > 16:
        return False
      out[k, tp] = val >> 8
      out[k, tp + 1] = val & 0xFF
      tp += 2
      xdigits = 0
      val = 0
      continue
    if ch == 46 and tp + 4 <= 16 and _pton4(data, curtok, stop, out, k, tp):
      tp += 4
      xdigits = 0
      break
    return False
  if xdigits > 0:
    if tp + 2 > 16:
      return False
    out[k, tp] = val >> 8
    out[k, tp + 1] = val & 0xFF
    tp += 2
  if colonp >= 0:
    if tp == 16:
      return False
    n = tp - colonp
    for i in range(n):
      out[k, 15 - i] = out[k, tp - 1 - i]
    for i in range(colonp, 16 - n):
      out[k, i] = 0
    tp = 16
  return tp == 16


@numba.njit(cache=True, nogil=True)
def _parse_all(offsets, data, out, family):
  """Bytes and family code of each text data[offsets[k]:offsets[k+1]] into out[k], family[k]."""
  for k in range(len(offsets) - 1):
    start, stop = offsets[k], offsets[k + 1]
    for j in range(16):
      out[k, j] = 0
    if start == stop:
      family[k] = -1
      continue
    colon = False
    for i in range(start, stop):
      colon |= data[i] == 58
    if colon:
      ok = _pton6(data, start, stop, out, k)
      family[k] = 6 if ok else 0
    else:
      ok = _pton4(data, start, stop, out, k, 0)
      family[k] = 4 if ok else 0
    if not ok:
      for j in range(16):
        out[k, j] = 0


def string_buffers(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
  """(offsets int64 [K+1], data uint8) of an Arrow string or binary array, without copying
  the data. Null entries keep their (usually empty) bytes: fill them first where that matters.
  """
  wide = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
  _, offsets_buffer, data_buffer = array.buffers()
  dtype = np.dtype(np.int64 if wide else np.int32)
  offsets = np.frombuffer(offsets_buffer, dtype, len(array) + 1, array.offset * dtype.itemsize)
  data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
  return offsets.astype(np.int64), data


def parse(array: pa.Array, spare: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """(bytes uint8 [K + spare, 16], family int8 [K + spare]) of each text of a string array.

  Family 4 or 6 (IPv4 in the first 4 bytes), `EMPTY` for an empty text and `INVALID` for an
  unparsable one (both all-zero bytes). Null entries count as empty, and so do the `spare`
  entries after the array's.
  """
  if array.null_count:
    array = array.fill_null("")
  offsets, data = string_buffers(array)
  offsets = np.concatenate([offsets, np.full(spare, offsets[-1])])
  out = np.empty((len(offsets) - 1, ADDRESS_BYTES), np.uint8)
  family = np.empty(len(offsets) - 1, np.int8)
  if len(out):
    _parse_all(offsets, data, out, family)
  return out, family
