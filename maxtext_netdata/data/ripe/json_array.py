"""A JSON array (the RIPE Atlas results API's default format) as newline-delimited JSON.

`ArrayToLines` is fed the array in pieces and returns blocks of whole elements, one element a
line, which `ingest` reads as it reads JSON lines. `_split` is one compiled pass over a piece
(numba): it tracks strings, escapes and nesting byte by byte and turns each comma between
top-level elements into a newline. Our own code because no kept JSON library streams a large
array's elements as text; the numpy version it replaced (marks from `bytes.translate`, quote
parity by an xor scan, depth by a cumulative sum) spent 1.6 µs a 430-byte result, 4x the
scanner that reads the lines.
"""

from __future__ import annotations

import numba
import numpy as np
import pyarrow as pa

from maxtext_netdata.errors import DataError
from maxtext_netdata.kernels import kernel_cache
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
      buf = buf.lstrip()
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
    cut, close, elements = _split(np.frombuffer(buf, np.uint8), out, self.elements > 0)
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
