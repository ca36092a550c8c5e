"""A JSON array (the RIPE Atlas results API's default format) as newline-delimited JSON.

`ArrayToLines` is fed the array in pieces and returns blocks of whole elements, one element a
line, which `ingest` reads as it reads JSON lines. `_split` is one compiled pass over a piece
(numba): it tracks strings, escapes and nesting byte by byte and turns each comma that ends a
top-level object into a newline. Our own code because no kept JSON library streams a large
array's elements as text; the numpy version it replaced (marks from `bytes.translate`, quote
parity by an xor scan, depth by a cumulative sum) spent 1.6 µs a 430-byte result, 4x the
scanner that reads the lines.
"""

from __future__ import annotations

import numba
import numpy as np

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

_MALFORMED = -2  # `_split`'s close position for a closing brace or bracket with nothing open
_IN_STRING = np.ones(256, np.bool_)  # bytes that neither end a string nor need a change there
_IN_STRING[[NEWLINE, CARRIAGE_RETURN, QUOTE, BACKSLASH]] = False
_PLAIN = np.ones(256, np.bool_)  # bytes outside strings that change no state but "after an object"
_PLAIN[[TAB, NEWLINE, CARRIAGE_RETURN, SPACE, QUOTE, COMMA]] = False
_PLAIN[[LEFT_BRACKET, RIGHT_BRACKET, LEFT_BRACE, RIGHT_BRACE]] = False


@numba.njit(cache=True, nogil=True)
def _split(buf, out):
  """Copy `buf` (which starts at the array's top level, outside any string) into `out`, raw
  newlines and carriage returns as spaces, the comma after each top-level object as a newline.

  Returns (the last such comma, -1 if none; the array's closing bracket, -1 if not in `buf`,
  `_MALFORMED` for a `}` at the top level). The copy is whole, then patched: the walk only
  reads, and a string's bytes are passed over in a loop of their own.
  """
  n = len(buf)
  out[:] = buf
  depth, after_object, cut, i = 0, False, -1, 0
  while i < n:
    c = buf[i]
    if _PLAIN[c]:  # numbers, literals, colons: nothing to track
      after_object = False
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
      after_object = False
      i += 1
      continue
    if c == NEWLINE or c == CARRIAGE_RETURN:  # a line break between tokens
      out[i] = SPACE
    elif c == SPACE or c == TAB:
      pass
    elif c == LEFT_BRACE or c == LEFT_BRACKET:
      depth += 1
      after_object = False
    elif c == RIGHT_BRACE or c == RIGHT_BRACKET:
      if depth == 0:
        return cut, (i if c == RIGHT_BRACKET else _MALFORMED)
      depth -= 1
      after_object = depth == 0 and c == RIGHT_BRACE
    elif c == COMMA and depth == 0 and after_object:
      out[i] = NEWLINE
      cut = i
      after_object = False
    else:
      after_object = False
    i += 1
  return cut, -1


class ArrayToLines:
  """A JSON array, fed in pieces, as newline-delimited JSON: one element per line.

  Each piece returned ends after a complete element (and a newline); the rest waits for the
  next piece, so every piece starts outside any string at the array's top level. Raw
  newlines cannot occur inside JSON strings, so they become spaces (pretty-printed arrays
  turn into one element a line). A top-level element that is not an object shares the line
  of the element after it (that line is then not a result: a bad line).
  """

  def __init__(self, path: str):
    self.path = path
    self.started = False
    self.closed = False
    self.carry = b""

  def feed(self, piece: bytes, last: bool) -> bytes | bytearray:
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
    out = bytearray(len(buf))
    cut, close = _split(np.frombuffer(buf, np.uint8), np.frombuffer(out, np.uint8))
    if close == _MALFORMED:
      raise DataError(f"{self.path}: not a well-formed JSON array")
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
    out[end] = NEWLINE  # the closing bracket or the last comma: the block's last newline
    del out[end + 1 :]
    return out
