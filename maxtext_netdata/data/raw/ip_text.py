"""Address text → bytes, compiled: glibc's `inet_pton` over a whole Arrow string array.

Prepare parses every entry of every row group's address dictionaries, and in a large dump
those dictionaries are nearly as long as the row groups (~0.86 distinct destinations a row
in generate's 200M-row world), so the parse is per-row work. Measured per entry on such
dictionaries: `socket.inet_pton` from Python ~1 µs, a lookup table kept across row groups
(`kernels.hash_table`, whose compare of the stored bytes misses the cache) ~120 ns, this compiled
parser ~90 ns with nothing kept between calls. It is a line-by-line port of glibc's
`inet_pton4`/`inet_pton6` (resolv/inet_pton.c), which `socket.inet_pton` calls on Linux, so it
accepts and rejects exactly what `socket.inet_pton` does: tests compare the two on generated
and mutated texts of every form (compressed `::`, IPv4-mapped and other embedded IPv4,
leading zeros, upper case, too many groups or digits, stray characters, NUL, non-ASCII).

A text containing ":" is parsed as IPv6, any other as IPv4 (`addresses._parse_one`'s rule).
Compiled by numba with `cache=True` (once per machine, loaded by later runs).
"""

from __future__ import annotations

import socket
import time

import numba
import numpy as np
import pyarrow as pa

from maxtext_netdata.kernels import kernel_cache, warmup

kernel_cache.install()  # cached kernels keyed on every project file imported

ADDRESS_BYTES = 16
EMPTY, INVALID = -1, 0  # family codes besides 4 and 6
# The `warmup` step that compiles the kernels here (ingest's first run on a machine): until it
# is done, `parse` and `gather_rows` take their uncompiled equivalents, `socket.inet_pton` and
# numpy, with the same results.
WARMUP = "ip_text"


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
def _close_gap(out, k, tp, colonp):
  """The end of inet_pton6: the `tp` bytes read into out[k], with "::" at byte `colonp` (-1:
  none), moved apart so the gap is zeros; whether that makes exactly 16 bytes."""
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
  return _close_gap(out, k, tp, colonp)


_HEX = np.full(256, -1, np.int64)
_HEX[list(b"0123456789")] = range(10)
_HEX[list(b"abcdef")] = range(10, 16)
_HEX[list(b"ABCDEF")] = range(10, 16)


@numba.njit(cache=True, nogil=True, inline="always")
def _fast4(data, start, stop, out, k):
  """`_pton4(data, start, stop, out, k, 0)` with its checks folded into flags, not branches.

  Address texts mix digits and dots unpredictably, so glibc's early returns cost a branch
  misprediction per octet; here every character does the same work.
  """
  dots, value, digits, bad = 0, 0, 0, False
  for i in range(start, stop):
    ch = np.int64(data[i])
    digit = ch - 48
    is_digit = (digit >= 0) & (digit <= 9)
    is_dot = ch == 46
    grown = value * 10 + digit
    bad |= ~(is_digit | is_dot)
    bad |= is_digit & (((digits > 0) & (value == 0)) | (grown > 255))  # leading zero, > 255
    bad |= is_dot & ((digits == 0) | (dots == 3))
    dots += is_dot
    value = min(grown, 256) if is_digit else 0
    digits = digits + 1 if is_digit else 0
    out[k, dots & 3] = value  # a dot writes the next octet's 0
  return not (bad | (dots != 3) | (digits == 0))


@numba.njit(cache=True, nogil=True, inline="always")
def _fast6(data, start, stop, out, k):
  """`_pton6` for a text without ".", its checks folded into flags (see `_fast4`)."""
  if data[start] == 58:
    if stop - start < 2 or data[start + 1] != 58:
      return False
    start += 1
  tp, colonp, digits, value, bad = 0, -1, 0, 0, False
  for i in range(start, stop):
    ch = np.int64(data[i])
    hex_value = _HEX[ch]
    is_hex = hex_value >= 0
    is_colon = ch == 58
    double = is_colon & (digits == 0)  # the second colon of "::"
    ends = is_colon & (digits > 0)  # a group ends
    bad |= ~(is_hex | is_colon) | (is_hex & (digits == 4))
    bad |= (double & (colonp >= 0)) | (ends & ((i == stop - 1) | (tp + 2 > 16)))
    colonp = tp if double else colonp
    tp += 2 * ends
    value = ((value << 4) | hex_value) if is_hex else 0
    digits = digits + 1 if is_hex else 0
    # The current group's bytes as far as read; past the 16th byte only in a bad text.
    at = min(tp, 14)
    out[k, at] = value >> 8
    out[k, at + 1] = value & 0xFF
  if digits > 0:
    bad |= tp + 2 > 16
    tp += 2
  if bad:
    return False
  return _close_gap(out, k, tp, colonp)


@numba.njit(cache=True, nogil=True)
def _parse_all(offsets, data, out, family):
  """Bytes and family code of each text data[offsets[k]:offsets[k+1]] into out[k], family[k]."""
  for k in range(len(offsets) - 1):
    start, stop = offsets[k], offsets[k + 1]
    for j in range(16):
      out[k, j] = 0
    if start == stop:
      family[k] = EMPTY
      continue
    colon, dot = False, False
    for i in range(start, stop):
      colon |= data[i] == 58
      dot |= data[i] == 46
    if not colon:
      ok = _fast4(data, start, stop, out, k)
      family[k] = 4 if ok else INVALID
    elif not dot:
      ok = _fast6(data, start, stop, out, k)
      family[k] = 6 if ok else INVALID
    else:  # IPv6 with an IPv4 part: glibc's own steps
      ok = _pton6(data, start, stop, out, k)
      family[k] = 6 if ok else INVALID
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
    (_parse_python if warmup.pending(WARMUP) else _parse_all)(offsets, data, out, family)
  return out, family


def _parse_python(offsets, data, out, family) -> None:
  """`_parse_all` by `socket.inet_pton` (what it ports), ~1 µs an entry: while it compiles."""
  for k in range(len(offsets) - 1):
    text = data[offsets[k] : offsets[k + 1]].tobytes()
    out[k] = 0
    if not text:
      family[k] = EMPTY
      continue
    version = 6 if b":" in text else 4
    try:
      packed = socket.inet_pton(socket.AF_INET6 if version == 6 else socket.AF_INET, text.decode())
    except (OSError, ValueError):  # not an address; NUL or non-ASCII in it
      family[k] = INVALID
      continue
    out[k, : len(packed)] = np.frombuffer(packed, np.uint8)
    family[k] = version


def compile_seconds() -> float:
  """Seconds to compile (first run on a machine) or load (later runs) the compiled parser."""
  started = time.perf_counter()
  parse(pa.array(["10.0.0.1", "2001:db8::1", "::ffff:1.2.3.4"]))
  return time.perf_counter() - started


@numba.njit(cache=True, nogil=True)
def _gather_rows(indices, parsed, family, versions, out, bad):
  """out[i] = parsed[indices[i]] (index -1: the last entry); bad[i] where the family is invalid
  or not versions[i]. Returns False, leaving the outputs partly written, if an index is
  outside [-1, len(parsed) - 1)."""
  entries = len(parsed) - 1  # the last entry is the spare that -1 selects
  words = parsed.view(np.uint64).reshape(len(parsed), 2)
  out_words = out.view(np.uint64).reshape(len(out), 2)
  for i in range(len(indices)):
    index = np.int64(indices[i])
    if index < -1 or index >= entries:
      return False
    if index < 0:
      index = entries
    out_words[i, 0] = words[index, 0]
    out_words[i, 1] = words[index, 1]
    f = family[index]
    bad[i] = (f == INVALID) | ((f > 0) & (f != versions[i]))
  return True


def gather_rows(indices: np.ndarray, parsed: np.ndarray, family: np.ndarray, versions):
  """(bytes uint8 [N, 16], bad bool [N]) of rows whose dictionary entries are `indices`, from
  `parse(dictionary, spare=1)`'s output; bad: unparsable, or not of the row's version. None
  if an index is outside the dictionary (a corrupt file). One pass, no temporaries per row.
  """
  out = np.empty((len(indices), ADDRESS_BYTES), np.uint8)
  bad = np.empty(len(indices), dtype=bool)
  versions = np.ascontiguousarray(versions, dtype=np.int64)
  if warmup.pending(WARMUP):  # `_gather_rows` in numpy while it compiles
    entries = len(parsed) - 1
    index = np.asarray(indices, np.int64)
    if len(index) and (index.min() < -1 or index.max() >= entries):
      return None
    index = np.where(index < 0, entries, index)
    out[:] = parsed[index]
    f = family[index]
    bad[:] = (f == INVALID) | ((f > 0) & (f != versions))
    return out, bad
  if not _gather_rows(indices, np.ascontiguousarray(parsed), family, versions, out, bad):
    return None
  return out, bad
