"""Strict JSON pieces for compiled scanners (numba): each reads one token at a byte offset.

Each function takes the bytes as a uint8 array `buf`, a position `i` and the end `n`, and
returns the position after what it read, or -1 where the text is not what it reads. They
accept a strict subset of RFC 8259 that every JSON reader the project uses (DuckDB's,
pyarrow's, Python's `json`) accepts alike: ASCII text only; no raw control character, NUL
or surrogate `\\u` escape in a string; no trailing comma, comment, NaN or leading zero; a
raw newline (byte 10) is never read, so a scanner of JSON lines stops at the line's end.
Our own code because no kept JSON library exposes a tokenizer numba can call.

The buffer must end with a newline, and `i` must not be past the first newline at or after
it: no piece reads past a newline (none is part of any token), so the inner loops test no
bound and read each byte unchecked (`_byte`, no negative-index fix-up either): the walk over
a line is ~25% faster than with `i < n` in every loop.

The cached kernel that calls these (`ripe_scan_kernel`) is keyed on this file's text too
(`kernel_cache`): an edit here compiles it again.
"""

from __future__ import annotations

import json

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from maxtext_netdata.kernels import kernel_cache, warmup
from maxtext_netdata.kernels.ascii import (
  BACKSLASH,
  CARRIAGE_RETURN,
  CASE_BIT,
  COLON,
  COMMA,
  DIGIT_0,
  DIGIT_1,
  DIGIT_9,
  DOT,
  LEFT_BRACE,
  LEFT_BRACKET,
  LOWER_A,
  LOWER_B,
  LOWER_E,
  LOWER_F,
  LOWER_N,
  LOWER_R,
  LOWER_T,
  LOWER_U,
  MINUS,
  NEWLINE,
  NON_ASCII,
  PLUS,
  QUOTE,
  RIGHT_BRACE,
  RIGHT_BRACKET,
  SLASH,
  SPACE,
  TAB,
  UPPER_A,
  UPPER_E,
  UPPER_F,
)

kernel_cache.install()  # before `_object_lines`, the one cached kernel here

MAX_DEPTH = 64  # nesting `skip` follows; deeper values are refused

# What a byte in a string is: plain text, the closing quote, an escape's start, or one the
# scanner refuses (a raw control character, which JSON forbids, or non-ASCII, left to the
# reference).
_PLAIN, _CLOSING_QUOTE, _ESCAPE, _REFUSED = range(4)
_STRING_CLASS = np.full(256, _PLAIN, np.uint8)
_STRING_CLASS[:SPACE] = _STRING_CLASS[NON_ASCII:] = _REFUSED
_STRING_CLASS[QUOTE], _STRING_CLASS[BACKSLASH] = _CLOSING_QUOTE, _ESCAPE
# A closing brace or bracket is its opening byte + 2: `skip` keeps only the opening ones.
_TO_CLOSING = RIGHT_BRACE - LEFT_BRACE
assert _TO_CLOSING == RIGHT_BRACKET - LEFT_BRACKET
_TRUE, _FALSE, NULL = (np.frombuffer(w, np.uint8) for w in (b"true", b"false", b"null"))

# The helpers are compiled without numba's reference counting (`_nrt=False`): they allocate
# nothing, and with it every call passing the block (inlined or not) counted references to it
# with two atomic calls, which took 3/4 of the scan's time (1.6M lines/s per core without).
# Most small pieces are inlined by numba where they are called (`inline`): the scan is ~15%
# faster than with calls, and its first compile 2.5x longer (measured 59 s against 23 s), a
# one-off cost. Not the smallest (`space`, `_digit`, `_hex`): as plain calls LLVM inlines them
# itself, where numba's inlining copied and re-typed their code 129 times (`_digit` 91 times,
# in each copy of `number`). On the 2-core development machine, an empty cache
# (`NUMBA_CACHE_DIR`), `scan_block` of the same 82 MB of lines: compile 70.5 -> 54.7 s, best
# pass 196-204 -> 190-198 ms. `number` as a call too: 40.7 s, but the pass 7-9% slower;
# `literal`, `copy`, `after_value`, `_spells` and `_which` on top: 47.1 s and 20% slower.
helper = numba.njit(_nrt=False)
inline = numba.njit(inline="always", _nrt=False)


def _word_access(bits: int):
  """Unaligned load and store of a `bits`-bit word at a byte offset of a 1-D uint8 array.

  numba has no unaligned word access of a byte array (`view` needs an aligned, whole array);
  the caller keeps `i + bits // 8` within the array.
  """
  word = ir.IntType(bits)

  def pointer(context, builder, array_type, array, i):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [i]), word.as_pointer())

  @intrinsic
  def load(typingctx, array, i):
    def codegen(context, builder, sig, args):
      return builder.load(pointer(context, builder, sig.args[0], *args), align=1)

    return getattr(types, f"uint{bits}")(array, i), codegen

  @intrinsic
  def store(typingctx, array, i, value):
    def codegen(context, builder, sig, args):
      value = context.cast(builder, args[2], sig.args[2], getattr(types, f"uint{bits}"))
      builder.store(value, pointer(context, builder, sig.args[0], *args[:2]), align=1)
      return context.get_dummy_value()

    return types.none(array, i, value), codegen

  return load, store


_load8, _store8 = _word_access(64)
_load4, _store4 = _word_access(32)
_byte = _word_access(8)[0]


@inline
def copy(src, start, length, dst, at):
  """`dst[at : at + length] = src[start : start + length]` for short texts (addresses), a word
  at a time: two overlapping words cover 4 to 16 bytes, where a byte loop or numpy's copy
  spent most of the scan's row writing."""
  if length >= 8:
    j = 0
    while j + 8 < length:
      _store8(dst, at + j, _load8(src, start + j))
      j += 8
    _store8(dst, at + length - 8, _load8(src, start + length - 8))
  elif length >= 4:
    _store4(dst, at, _load4(src, start))
    _store4(dst, at + length - 4, _load4(src, start + length - 4))
  else:
    for j in range(length):
      dst[at + j] = src[start + j]


@helper
def space(buf, i, n):
  c = _byte(buf, i)
  while c == SPACE or c == TAB or c == CARRIAGE_RETURN:
    i += 1
    c = _byte(buf, i)
  return i


@helper
def _hex(c):
  return (DIGIT_0 <= c <= DIGIT_9) or (UPPER_A <= c <= UPPER_F) or (LOWER_A <= c <= LOWER_F)


@inline
def string(buf, i, n):
  """(end after the closing quote, or -1 if not a string the scanner takes; has an escape)."""
  i += 1
  escaped = False
  while True:
    c = _STRING_CLASS[_byte(buf, i)]
    if c == _PLAIN:
      i += 1
    elif c == _CLOSING_QUOTE:
      return i + 1, escaped
    elif c == _ESCAPE:
      escaped = True
      i = _escape(buf, i, n)
      if i < 0:
        return -1, escaped
    else:
      return -1, escaped


@helper
def _escape(buf, i, n):
  """End of the escape at `i` (a backslash), or -1 for a bad one, a surrogate or NUL."""
  if i + 1 >= n:
    return -1
  d = buf[i + 1]
  if d == LOWER_U:  # \uXXXX
    if i + 6 > n:
      return -1
    v = 0
    for j in range(i + 2, i + 6):
      h = buf[j]
      if not _hex(h):
        return -1
      v = v * 16 + (h - DIGIT_0 if h <= DIGIT_9 else (h | CASE_BIT) - LOWER_A + 10)
    if v == 0 or 0xD800 <= v <= 0xDFFF:
      return -1
    return i + 6
  if d == QUOTE or d == BACKSLASH or d == SLASH:  # \" \\ \/
    return i + 2
  if d == LOWER_B or d == LOWER_F or d == LOWER_N or d == LOWER_R or d == LOWER_T:  # \b \f \n \r \t
    return i + 2
  return -1


@helper
def _digit(c):
  return DIGIT_0 <= c <= DIGIT_9


@inline
def number(buf, i, n):
  """(end of a JSON number at `i`, or -1; whether it is an integer; exponent digits)."""
  if _byte(buf, i) == MINUS:
    i += 1
  c = _byte(buf, i)
  if c == DIGIT_0:
    i += 1
  elif DIGIT_1 <= c <= DIGIT_9:
    i += 1
    while _digit(_byte(buf, i)):
      i += 1
  else:
    return -1, False, 0
  integer, exponent = True, 0
  if _byte(buf, i) == DOT:
    i += 1
    integer = False
    if not _digit(_byte(buf, i)):
      return -1, False, 0
    i += 1
    while _digit(_byte(buf, i)):
      i += 1
  c = _byte(buf, i)
  if c == LOWER_E or c == UPPER_E:
    i += 1
    integer = False
    c = _byte(buf, i)
    if c == PLUS or c == MINUS:
      i += 1
    start = i
    while _digit(_byte(buf, i)):
      i += 1
    exponent = i - start
    if exponent == 0:
      return -1, False, 0
  return i, integer, exponent


@inline
def literal(buf, i, n, word):
  for j in range(len(word)):  # stops at the first byte that differs: a newline at the latest
    if _byte(buf, i + j) != word[j]:
      return -1
  return i + len(word)


@inline
def scalar(buf, i, n):
  """End of a string, number or literal at `i`, or -1."""
  c = _byte(buf, i)
  if c == QUOTE:
    return string(buf, i, n)[0]
  if c == MINUS or DIGIT_0 <= c <= DIGIT_9:
    return number(buf, i, n)[0]
  if c == LOWER_T:
    return literal(buf, i, n, _TRUE)
  if c == LOWER_F:
    return literal(buf, i, n, _FALSE)
  if c == LOWER_N:
    return literal(buf, i, n, NULL)
  return -1


@inline
def key(buf, i, n):
  """(end after `"key":` and the space after it, or -1; key start; key length)."""
  if _byte(buf, i) != QUOTE:
    return -1, 0, 0
  end, escaped = string(buf, i, n)
  if end < 0 or escaped:
    return -1, 0, 0
  j = space(buf, end, n)
  if _byte(buf, j) != COLON:
    return -1, 0, 0
  return space(buf, j + 1, n), i + 1, end - i - 2


@inline
def after_value(buf, i, n, close):
  """After a member or element ending at `i`: (the next one's start, True) after a comma,
  (the position past `close`, False) after that closing byte, (-1, False) otherwise."""
  i = space(buf, i, n)
  c = _byte(buf, i)
  if c == COMMA:
    return space(buf, i + 1, n), True
  if c == close:
    return i + 1, False
  return -1, False


@helper
def skip(buf, i, n, stack):
  """End of any JSON value at `i` (objects and arrays walked with `stack`), or -1."""
  depth = 0
  while True:
    if i >= n:
      return -1
    c = buf[i]
    if c == LEFT_BRACE or c == LEFT_BRACKET:
      j = space(buf, i + 1, n)
      if j < n and buf[j] == c + _TO_CLOSING:  # {} or []
        i = j + 1
      else:
        if depth == MAX_DEPTH:
          return -1
        stack[depth] = c
        depth += 1
        if c == LEFT_BRACE:
          j = key(buf, j, n)[0]
          if j < 0:
            return -1
        i = j
        continue
    else:
      i = scalar(buf, i, n)
      if i < 0:
        return -1
    while True:  # after a value: a comma, or the close of the open object or array
      if depth == 0:
        return i
      i = space(buf, i, n)
      if i >= n:
        return -1
      c = buf[i]
      if c == COMMA:
        i = space(buf, i + 1, n)
        if stack[depth - 1] == LEFT_BRACE:
          i = key(buf, i, n)[0]
          if i < 0:
            return -1
        break
      if c == stack[depth - 1] + _TO_CLOSING:
        depth -= 1
        i += 1
      else:
        return -1


@inline
def value(buf, i, n, stack):
  """`skip`, with scalars read inline: a call passing arrays costs more than a short value."""
  c = _byte(buf, i)
  if c == LEFT_BRACE or c == LEFT_BRACKET:
    return skip(buf, i, n, stack)
  return scalar(buf, i, n)


@inline
def integer(buf, i, n):
  """(end, value) of a JSON integer of at most 18 digits at `i`; end -1 if it is not one."""
  end, integer, _ = number(buf, i, n)
  if end < 0 or not integer:
    return -1, 0
  j, sign = i, 1
  if buf[j] == MINUS:
    j, sign = j + 1, -1
  if end - j > 18:
    return -1, 0
  value = 0
  for k in range(j, end):
    value = value * 10 + (buf[k] - DIGIT_0)
  return end, sign * value


# The `warmup` step that compiles `_object_lines` (ingest's first run on a machine): until it is
# done, `object_lines` answers with `_object_lines_python`.
WARMUP = "json_scan.object_lines"


def _object_lines_python(buf) -> np.ndarray:
  """What `_object_lines` is asked for, without compiling: True for a blank line and for one
  that `json.loads` reads as an object and has at most MAX_DEPTH brackets and braces (so it
  nests no deeper). Not the strict grammar's answer: it also says True of lines only Python's
  reader takes alike (`NaN`, non-ASCII text, escaped keys). Its one caller
  (`reference._screen_refuses_a_line`) screens the other lines with those same two checks,
  so its verdict is the same; ~5 µs a line against ~20 ns compiled."""
  strict = []
  for line in buf.tobytes().split(b"\n")[:-1]:
    ok = not line.strip(b" \t\r")
    if not ok and line.count(b"{") + line.count(b"[") <= MAX_DEPTH:
      try:
        ok = isinstance(json.loads(line), dict)
      except ValueError:
        ok = False
    strict.append(ok)
  return np.array(strict, np.bool_)


def object_lines(buf):
  """`_object_lines(buf)`, or while it compiles on a thread `_object_lines_python(buf)`."""
  if warmup.pending(WARMUP):
    return _object_lines_python(buf)
  return _object_lines(buf)


@numba.njit(cache=True, nogil=True)
def _object_lines(buf):
  """bool per line of `buf` (newline-ended, the module's contract): the line is blank or one
  object in this module's grammar with nothing after it but spaces.

  Every reader the project uses takes such a line alike, as one object; a line this refuses
  may still be a JSON object to one of them and not to another (non-ASCII text, `NaN`, a
  trailing comma), or another value (`null`, which DuckDB's reader takes as a row).
  """
  n = len(buf)
  lines = 0
  for i in range(n):
    lines += buf[i] == NEWLINE
  strict = np.ones(lines, np.bool_)
  stack = np.empty(MAX_DEPTH, np.uint8)
  p = 0
  for line in range(lines):
    i = space(buf, p, n)
    if _byte(buf, i) != NEWLINE:
      i = skip(buf, i, n, stack) if _byte(buf, i) == LEFT_BRACE else -1
      if i >= 0:
        i = space(buf, i, n)
      strict[line] = i >= 0 and _byte(buf, i) == NEWLINE
    while _byte(buf, p) != NEWLINE:  # the next line (`skip` may stop anywhere in a bad one)
      p += 1
    p += 1
  return strict
