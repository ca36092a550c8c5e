"""A JSON array (the RIPE Atlas results API's default format) as newline-delimited JSON.

`ArrayToLines` is fed the array in pieces and returns blocks of whole elements, one element a
line, which `ingest` reads as it reads JSON lines. `_split` is one compiled pass over a piece
(numba): it tracks strings, escapes and nesting byte by byte and turns each comma between
top-level elements into a newline. Our own code because no kept JSON library streams a large
array's elements as text; the numpy version it replaced (marks from `bytes.translate`, quote
parity by an xor scan, depth by a cumulative sum) spent 1.6 µs a 430-byte result, 4x the
scanner that reads the lines.

While `_split` compiles on the warm-up thread (a machine's first run: `kernels.warmup`, step
`WARMUP`, ~3-10 s), `split` takes `_split_numpy`, an uncompiled pass with the same answers
(numpy over the quotes, backslashes and brackets only), so a JSON array's first blocks do not
wait for the compile.
"""

from __future__ import annotations

import numba
import numpy as np
import pyarrow as pa

from maxtext_netdata.errors import DataError
from maxtext_netdata.kernels import kernel_cache, warmup
from maxtext_netdata.kernels.ascii import (
  BACKSLASH,
  CARRIAGE_RETURN,
  COMMA,
  LEFT_BRACE,
  LEFT_BRACKET,
  NEWLINE,
  QUOTE,
  RIGHT_BRACE,
  RIGHT_BRACKET,
  SPACE,
  TAB,
)

kernel_cache.install()  # before the kernel: its cache keyed on the imports' text too

_MALFORMED = -2  # `_split`'s close position for a closing brace with nothing open
_EMPTY = -3  # `_split`'s close position for a comma or `]` that ends an element with no value
_IN_STRING = np.ones(256, np.bool_)  # bytes that neither end a string nor need a change there
_IN_STRING[[NEWLINE, CARRIAGE_RETURN, QUOTE, BACKSLASH]] = False
_PLAIN = np.ones(256, np.bool_)  # bytes outside strings that are part of a value, nothing more
_PLAIN[[TAB, NEWLINE, CARRIAGE_RETURN, SPACE, QUOTE, COMMA]] = False
_PLAIN[[LEFT_BRACKET, RIGHT_BRACKET, LEFT_BRACE, RIGHT_BRACE]] = False

BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark, which some tools write first: not JSON, skipped


@numba.njit(cache=True, nogil=True)
def _split(buf, out, after_comma):
  """Copy `buf` (which starts at the array's top level, outside any string, after its `[` or
  after a comma as `after_comma` says) into `out`, raw newlines and carriage returns as
  spaces, each comma between top-level elements as a newline.

  Returns (the last such comma, -1 if none; the array's closing bracket, -1 if not in `buf`,
  `_MALFORMED` for a `}` at the top level, `_EMPTY` for a comma or closing bracket that ends
  an element with no value; the whole elements up to the last comma or the closing bracket,
  or before the empty one). The copy is whole, then patched: the walk only reads, and a
  string's bytes are passed over in a loop of their own.
  """
  n = len(buf)
  out[:] = buf
  depth, in_element, cut, commas, i = 0, False, -1, 0, 0
  while i < n:
    c = buf[i]
    if _PLAIN[c]:  # numbers, literals, colons: part of an element, nothing to track
      in_element = True
      i += 1
      continue
    if c == QUOTE:
      i += 1
      while i < n:
        c = buf[i]
        if _IN_STRING[c]:  # the bulk of a string: one test a byte
          i += 1
          continue
        if c == QUOTE:
          break
        if c == BACKSLASH and i + 1 < n:  # an escape: its next byte is never the string's end
          i += 1
          c = buf[i]
        if c == NEWLINE or c == CARRIAGE_RETURN:  # raw, invalid in a string: a space
          out[i] = SPACE
        i += 1
      in_element = True
      i += 1
      continue
    if c == NEWLINE or c == CARRIAGE_RETURN:  # a line break between tokens
      out[i] = SPACE
    elif c == LEFT_BRACE or c == LEFT_BRACKET:
      depth += 1
      in_element = True
    elif c == RIGHT_BRACE or c == RIGHT_BRACKET:
      if depth == 0:
        if c == RIGHT_BRACE:
          return cut, _MALFORMED, commas
        if not in_element and (after_comma or commas > 0):  # `,]`
          return cut, _EMPTY, commas
        return cut, i, commas + in_element
      depth -= 1
    elif c == COMMA and depth == 0:
      if not in_element:  # `[,` or `,,`
        return cut, _EMPTY, commas
      out[i] = NEWLINE
      cut = i
      commas += 1
      in_element = False
    i += 1
  return cut, -1, commas


WARMUP = "json_array"  # `_split`'s `warmup` step (scan.load)
_WHITESPACE = bytes([TAB, NEWLINE, CARRIAGE_RETURN, SPACE])  # the bytes that are no element
_OPEN, _CLOSE_BRACE, _CLOSE_BRACKET, _COMMA, _QUOTE, _BACKSLASH, _BREAK = 1, 2, 3, 4, 5, 6, 7
_KIND = np.zeros(256, np.uint8)  # the bytes `_split_numpy` looks at, by what they are
_KIND[[LEFT_BRACE, LEFT_BRACKET]] = _OPEN
_KIND[RIGHT_BRACE], _KIND[RIGHT_BRACKET], _KIND[COMMA] = _CLOSE_BRACE, _CLOSE_BRACKET, _COMMA
_KIND[QUOTE], _KIND[BACKSLASH] = _QUOTE, _BACKSLASH
_KIND[[NEWLINE, CARRIAGE_RETURN]] = _BREAK
_IS_WHITESPACE = np.zeros(256, np.bool_)
_IS_WHITESPACE[list(_WHITESPACE)] = True


def _split_numpy(buf, out, after_comma):
  """`_split(buf, out, after_comma)`, uncompiled: the same return and the same `out`.

  The walk's state at each bracket and comma from positions alone: a quote ends or starts a
  string unless a run of an odd number of backslashes comes just before it; a bracket or
  comma is outside strings when an even number of such quotes come before it; its depth is
  a cumulative sum of the brackets outside strings. An element is empty when only
  `_WHITESPACE` lies between its top-level commas. A backslash outside a string (invalid
  JSON: for `_split` a byte of a value, not an escape) is left to `_split` itself. ~30 ms a
  MB against ~5 ms compiled, on the bytes above only (benchmarks/bench_cold_start.py).
  """
  n = len(buf)
  out[:] = buf
  kind = _KIND[buf]
  at = np.flatnonzero(kind)
  kind = kind[at]
  slashes = np.flatnonzero(kind == _BACKSLASH)
  if len(slashes):
    backslashes = at[slashes]
    run_starts = np.flatnonzero(np.diff(backslashes, prepend=-2) != 1)
    run_ends = np.append(run_starts[1:], len(backslashes))
    after = slashes[run_ends - 1] + 1  # the mark after each run of backslashes, if next
    after = after[((run_ends - run_starts) % 2 == 1) & (after < len(at))]
    escaped = after[(kind[after] == _QUOTE) & (at[after] == at[after - 1] + 1)]
    kind[escaped] = 0  # an escaped quote: part of its string
  quotes_before = np.cumsum(kind == _QUOTE)  # through each mark: its own parity if not one
  outside = quotes_before % 2 == 0
  if len(slashes) and outside[slashes].any():
    return _split(buf, out, after_comma)
  breaks = at[kind == _BREAK]
  marks = outside & (kind >= _OPEN) & (kind <= _COMMA)
  at, kind = at[marks], kind[marks]
  step = np.where(kind == _OPEN, 1, np.where(kind == _COMMA, 0, -1))
  top = (np.cumsum(step) - step == 0) & (kind != _OPEN)  # at depth 0 before it
  bounds, kind = at[top], kind[top]
  closers = np.flatnonzero(kind != _COMMA)
  if len(closers):  # the walk ends at the first one
    bounds, kind = bounds[: closers[0] + 1], kind[: closers[0] + 1]
  previous = np.concatenate(([-1], bounds[:-1]))
  before = bounds - 1
  filled = (before > previous) & ~_IS_WHITESPACE[buf[np.maximum(before, 0)]]
  for j in np.flatnonzero((before > previous) & ~filled).tolist():  # whitespace before it
    filled[j] = bool(buf[previous[j] + 1 : bounds[j]].tobytes().strip(_WHITESPACE))
  ends = np.flatnonzero((kind != _COMMA) | ~filled)
  if len(ends):
    commas = int(ends[0])
    stop = int(bounds[commas])
    if kind[commas] == _CLOSE_BRACE:
      close = _MALFORMED
    elif not filled[commas] and (kind[commas] == _COMMA or after_comma or commas > 0):
      close = _EMPTY
    else:
      close = stop
  else:
    commas, stop, close = len(bounds), n, -1
  cut = int(bounds[commas - 1]) if commas else -1
  out[breaks[: np.searchsorted(breaks, stop)]] = SPACE
  out[bounds[:commas]] = NEWLINE
  return cut, close, commas + (close >= 0 and bool(filled[commas]))


def split(buf, out, after_comma):
  """`_split`, or while it compiles on a thread `_split_numpy` (the same answers)."""
  if warmup.pending(WARMUP):
    return _split_numpy(buf, out, after_comma)
  return _split(buf, out, after_comma)


class ArrayToLines:
  """A JSON array, fed in pieces, as newline-delimited JSON: one element per line.

  Each piece returned ends after a complete element (and a newline); the rest waits for the
  next piece, so every piece starts outside any string at the array's top level. Raw
  newlines cannot occur inside JSON strings, so they become spaces (pretty-printed arrays
  turn into one element a line). Every element gets a line of its own, whatever it is: one
  that is not an object (`null`, a number) is a bad line of its own, and line N is element N.
  A comma with no element before it (`[,`, `,,`, `,]`) is an error naming the element.

  The lines are written into a numpy array and returned as an Arrow buffer over it, never
  resized: a bytearray viewed by the compiled pass could not be shortened while numba's
  first compile still held the view (`BufferError: Existing exports of data`).
  """

  def __init__(self, path: str):
    self.path = path
    self.started = False
    self.closed = False
    self.carry = b""
    self.elements = 0  # whole elements returned so far

  def feed(self, piece: bytes, last: bool) -> bytes | pa.Buffer:
    """The whole elements of the text so far not yet returned, one a line, or b"" if none."""
    buf = self.carry + piece
    if not self.started:
      buf = buf.removeprefix(BOM).lstrip()
      if not buf:
        return b""
      if buf[:1] != b"[":
        raise DataError(f"{self.path}: not a JSON array")
      buf, self.started = buf[1:], True
    if self.closed:
      if buf.strip():
        raise DataError(f"{self.path}: text after the end of the JSON array")
      return b""
    out = np.empty(len(buf), np.uint8)
    cut, close, elements = split(np.frombuffer(buf, np.uint8), out, self.elements > 0)
    if close == _MALFORMED:
      raise DataError(f"{self.path}: not a well-formed JSON array")
    if close == _EMPTY:
      raise DataError(
        f"{self.path}: array element {self.elements + elements + 1}: no value"
        " (a comma after `[` or another comma, or before `]`)"
      )
    if close >= 0:
      if buf[close + 1 :].strip():
        raise DataError(f"{self.path}: text after the end of the JSON array")
      end, self.closed, self.carry = close, True, b""
    elif last:
      raise DataError(f"{self.path}: the JSON array is not closed (truncated file?)")
    elif cut >= 0:
      end, self.carry = cut, buf[cut + 1 :]
    else:
      self.carry = buf
      return b""
    self.elements += elements
    if not elements:  # `[]`
      return b""
    out[end] = NEWLINE  # the closing bracket or the last comma: the block's last newline
    return pa.py_buffer(out[: end + 1])
