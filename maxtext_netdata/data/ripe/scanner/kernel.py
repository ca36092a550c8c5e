"""The compiled line kernel of `data.ripe.scan`: RIPE Atlas ping results (JSON lines) → rows.

`scan_block` reads every line of a block (a uint8 view, no Python per line) with the strict
JSON pieces of `json_scan`, reads only the fields the mapping needs, skips the rest, and
writes the rows of the results it can map with certainty; it says of every other line that
it is handed over (to `data.ripe.reference`). What it maps itself is a strict subset of
what both the reference and `json.loads` accept, so it never gives a row the reference
would not:
- a line is one JSON object in `json_scan`'s strict grammar, nested at most
  `json_scan.MAX_DEPTH` deep, with no backslash in any key;
- the needed keys (`_TOP`, and `rtt` / `dup` in a packet) appear at most once an object;
- the text fields are strings without escapes (or null), the integer fields integers of at
  most 18 digits (or null), `avg` a number (or null), `result` a list of objects, `rtt` a
  number of at most `_MAX_NUMBER` characters with an exponent of at most two digits (or
  null), `dup` an integer (or null);
- a `ping` result (or one without `type`) has a `result` list that gives at least one row,
  `msm_id`, a `timestamp` from `FIRST_SECOND` to `LAST_SECOND`, and an `af` of 4 or 6 or an
  address that tells the version.
Whether its addresses are addresses of that version is checked after the scan, by
`data.ripe.scan` with the raw contract's parser (outside this room), on the first row of
each result: hence at least one row.
A valid JSON object whose `type` is another string is counted as another type whatever its
other fields hold, as the reference does. The mapping of the rest is `reference.map_batch`'s.

Compiled by numba with `cache=True`: the first use ever compiles it (55-62 s measured on the
shared 2-vCPU development machine, most of it the inlined `json_scan` pieces), later
processes load the machine code from the cache (0.3-0.8 s), keyed on this file's and
`json_scan`'s text (`kernel_cache`).
"""

from __future__ import annotations

import numba
import numpy as np

from maxtext_netdata.data.ripe.scanner import json_scan as js
from maxtext_netdata.kernels import kernel_cache
from maxtext_netdata.kernels.ascii import (
  COLON,
  COMMA,
  DIGIT_0,
  DIGIT_9,
  DOT,
  LEFT_BRACE,
  LEFT_BRACKET,
  LOWER_N,
  MINUS,
  NEWLINE,
  NON_ASCII,
  PLUS,
  QUOTE,
  RIGHT_BRACE,
  RIGHT_BRACKET,
)

kernel_cache.install()  # the cache keyed on json_scan's text too

BLANK, PING, OTHER, HANDED = 0, 1, 2, 3  # what `scan_block` says of each line
# The timestamps a row may have (docs/data_format.md): from 1970 (the token format's Unix
# seconds are unsigned) to 2106-02-07 06:28:15 UTC, the last a store's uint32 seconds keep
# (`data.raw.schema.LAST_SECOND`, which `prepare` checks; this room imports no other).
FIRST_SECOND, LAST_SECOND = 0, 2**32 - 1
_MAX_NUMBER = 32
# Needed top-level keys, in `_TOP` order; their index is the bit in an object's seen-mask.
_TOP = (
  "type",
  "msm_id",
  "prb_id",
  "timestamp",
  "af",
  "from",
  "src_addr",
  "dst_addr",
  "addr",
  "result",
  "avg",
  "rcvd",
)
_TYPE, _MSM, _PRB, _TS, _AF, _FROM, _SRC, _DST, _ADDR, _RESULT, _AVG, _RCVD = range(len(_TOP))
_KEY_BYTES = np.zeros((len(_TOP), 16), np.uint8)
# By length and first byte (ASCII: `js.string` refuses any other), unique for these keys.
_SLOTS = np.full((16, NON_ASCII), -1, np.int64)
for _k, _name in enumerate(_TOP):
  _KEY_BYTES[_k, : len(_name)] = np.frombuffer(_name.encode(), np.uint8)
  _SLOTS[len(_name), ord(_name[0])] = _k
assert len({(len(k), k[0]) for k in _TOP}) == len(_TOP)
_N_KEYS = len(_TOP)
# What `scan_block` fills, a column per row of these arrays (every column's first m entries
# are its rows, in line order, for Arrow to take as they are):
# - `ints` int64 rows MSM, TS, PRB, VER (prb_id 0 where null);
# - `valid` bool rows PRB_OK, SRC_OK, DST_OK (False: null);
# - `rtt` float64 (-1 for a failed packet); NaN where the text is beyond `_decimal`'s exact
#   fast path, its (start, length) in the block then in `rtt_text` for the caller to convert;
# - `offsets` int32 rows SRC, DST: Arrow string offsets into `texts` rows SRC, DST, where
#   each column's texts follow one another in row order (a result's src and dst are copied
#   for each of its rows).
MSM, TS, PRB, VER = range(4)
PRB_OK, SRC_OK, DST_OK = range(3)
SRC, DST = range(2)
# Powers of ten exact in float64: `_decimal`'s fast path.
_POWERS = np.array([10.0**k for k in range(23)])
# Texts matched whole: a packet's keys, the `type` of a ping result.
_RTT, _DUP, _PING = (np.frombuffer(word, np.uint8) for word in (b"rtt", b"dup", b"ping"))


@js.inline
def _which(buf, start, length):
  """Index in `_TOP` of the key at `start`, or -1 (a table by length and first byte)."""
  if length >= _KEY_BYTES.shape[1] or length == 0:
    return -1
  k = _SLOTS[length, buf[start]]
  if k < 0:
    return -1
  for j in range(1, length):
    if buf[start + j] != _KEY_BYTES[k, j]:
      return -1
  return k


@js.inline
def _spells(buf, start, length, word):
  """Whether the `length` bytes at `start` are `word` (uint8 codes; any length may come)."""
  return length == len(word) and js.literal(buf, start, len(buf), word) >= 0


@js.helper
def _version(buf, start, length):
  """6 for text with a colon, 4 for text with a dot, else 0 (reference._version_of)."""
  dot = False
  for j in range(start, start + max(length, 0)):
    if buf[j] == COLON:
      return 6
    if buf[j] == DOT:
      dot = True
  return 4 if dot else 0


_FULL = -2  # `_packets` / `_line`: the row arrays are full (grown, then the line read again)
_FULL_TEXTS = -3  # `_line`: `texts` is full (grown, then the line read again)
_TWO_53 = 1 << 53


@js.inline
def _decimal(buf, i, end):
  """The float64 of the JSON number text `buf[i:end]`, correctly rounded, or NaN.

  Clinger's fast path: a decimal of at most 18 significant digits whose integer mantissa is
  below 2**53, scaled by at most 10**22, is one exact IEEE multiplication or division of two
  exact operands, so it is correctly rounded (as Arrow's and DuckDB's parsers round). NaN for
  any other text: the caller converts it with Arrow.
  """
  negative = buf[i] == MINUS
  if negative:
    i += 1
  mantissa, digits, scale = 0, 0, 0
  while i < end and DIGIT_0 <= buf[i] <= DIGIT_9:
    digits += digits > 0 or buf[i] > DIGIT_0  # significant digits: not the leading zeros
    mantissa = mantissa * 10 + (buf[i] - DIGIT_0)
    i += 1
  if i < end and buf[i] == DOT:
    i += 1
    while i < end and DIGIT_0 <= buf[i] <= DIGIT_9:
      digits += digits > 0 or buf[i] > DIGIT_0
      mantissa = mantissa * 10 + (buf[i] - DIGIT_0)
      scale -= 1
      i += 1
  if i < end:  # an exponent: `_packets` took at most two digits
    i += 1
    sign = 1
    if buf[i] == MINUS or buf[i] == PLUS:
      sign = COMMA - buf[i]  # '+' and '-' sit either side of ',': 1 and -1
      i += 1
    exponent = 0
    while i < end:
      exponent = exponent * 10 + (buf[i] - DIGIT_0)
      i += 1
    scale += sign * exponent
  if mantissa == 0 and not negative:
    return 0.0
  # Past 18 digits the mantissa may have wrapped around; -0 is left to Arrow as well.
  if digits > 18 or mantissa == 0 or mantissa >= _TWO_53 or scale < -22 or scale > 22:
    return np.nan
  value = mantissa / _POWERS[-scale] if scale < 0 else mantissa * _POWERS[scale]
  return -value if negative else value


@js.helper
def _packets(buf, i, n, rtt, rtt_text, m, stack):
  """Parse a `result` list at `i` into rtts of rows from m on: (end, new m, duplicates).

  End -1: not a list of packets the scanner takes (the caller skips it as any value);
  `_FULL`: `rtt` has no room left.
  """
  dups = 0
  i = js.space(buf, i + 1, n)
  if i < n and buf[i] == RIGHT_BRACKET:
    return i + 1, m, 0
  while True:
    if i >= n or buf[i] != LEFT_BRACE:
      return -1, m, 0
    rtt_s, rtt_l, dup, seen = 0, -1, False, 0
    i = js.space(buf, i + 1, n)
    if i < n and buf[i] == RIGHT_BRACE:
      i += 1
    else:
      while True:
        i, start, length = js.key(buf, i, n)
        if i < 0:
          return -1, m, 0
        if _spells(buf, start, length, _RTT):
          if seen & 1:
            return -1, m, 0
          seen |= 1
          if buf[i] == LOWER_N:
            i = js.literal(buf, i, n, js.NULL)
          else:
            end, _, exponent = js.number(buf, i, n)
            if end < 0 or exponent > 2 or end - i > _MAX_NUMBER:
              return -1, m, 0
            rtt_s, rtt_l, i = i, end - i, end
        elif _spells(buf, start, length, _DUP):
          if seen & 2:
            return -1, m, 0
          seen |= 2
          if buf[i] == LOWER_N:
            i = js.literal(buf, i, n, js.NULL)
          else:
            i = js.integer(buf, i, n)[0]
            dup = True
        else:
          i = js.value(buf, i, n, stack)
        if i < 0:
          return -1, m, 0
        i, more = js.after_value(buf, i, n, RIGHT_BRACE)
        if i < 0:
          return -1, m, 0
        if not more:
          break
    if dup:
      dups += 1
    else:
      if m == rtt.shape[0]:
        return _FULL, m, 0
      value = -1.0 if rtt_l < 0 else _decimal(buf, rtt_s, rtt_s + rtt_l)
      if value != value:
        rtt_text[0, m], rtt_text[1, m] = rtt_s, rtt_l
      rtt[m] = value
      m += 1
    i, more = js.after_value(buf, i, n, RIGHT_BRACKET)
    if i < 0:
      return -1, m, 0
    if not more:
      return i, m, dups


@js.helper
def _line(buf, p, n, m, stack, fields, spans, out_ints, valid, rtt, rtt_text, offsets, texts):
  """Read the line at `p`: (kind, new m, duplicates, a position in the line past which
  only its newline may come); `_FULL` or `_FULL_TEXTS` as kind if an output array is full.

  A ping result's texts are copied into `texts` while the line is in cache (gathering them
  from the block later missed the cache on every row: 3x slower).
  """
  for k in range(_N_KEYS):
    spans[k, 1] = -1
    fields[k] = 0
  first = m
  if p >= n:
    return BLANK, m, 0, p
  i = js.space(buf, p, n)
  if buf[i] == NEWLINE:
    return BLANK, m, 0, i
  if buf[i] != LEFT_BRACE:
    return HANDED, m, 0, p
  odd, seen, dups, has_list = False, 0, 0, False
  i = js.space(buf, i + 1, n)
  if i < n and buf[i] == RIGHT_BRACE:
    i += 1
  else:
    while True:
      i, start, length = js.key(buf, i, n)
      if i < 0:
        break
      k = _which(buf, start, length)
      value = i
      if k >= 0:
        if seen & (1 << k):
          i = -1
          break
        seen |= 1 << k
        c = buf[i]
        if c == LOWER_N:  # null: the field is absent
          i = js.literal(buf, i, n, js.NULL)
        elif k == _RESULT:
          i, m2, d = (
            _packets(buf, i, n, rtt, rtt_text, m, stack) if c == LEFT_BRACKET else (-1, m, 0)
          )
          if i == _FULL:
            return _FULL, first, 0, p
          if i >= 0:
            m, dups, has_list = m2, d, True
        elif k == _AVG:
          i = js.number(buf, i, n)[0]
        elif k <= _TS or k == _AF or k == _RCVD:
          if k != _TYPE:
            i, number = js.integer(buf, i, n)
            fields[k] = number
            spans[k, 1] = 0
        if k == _TYPE or _FROM <= k <= _ADDR:
          if c == QUOTE:
            i, escaped = js.string(buf, i, n)
            if escaped:
              i = -1
            spans[k, 0] = value + 1
            spans[k, 1] = i - value - 2
          elif c != LOWER_N:
            i = -1
        if i < 0:  # a value the scanner does not take: skipped, the line handed over
          odd = True
          spans[k, 1] = -1
          i = js.skip(buf, value, n, stack)
      else:
        i = js.value(buf, i, n, stack)
      if i < 0:
        break
      i, more = js.after_value(buf, i, n, RIGHT_BRACE)
      if not more:
        break
  if i >= 0:
    i = js.space(buf, i, n)
    if i < n and buf[i] != NEWLINE:
      i = -1
  if i < 0:
    return HANDED, first, 0, p
  t_start, t_length = spans[_TYPE, 0], spans[_TYPE, 1]
  if t_length >= 0 and not _spells(buf, t_start, t_length, _PING):
    return OTHER, first, 0, i
  if odd or not has_list or m == first or spans[_MSM, 1] < 0 or spans[_TS, 1] < 0:
    return HANDED, first, 0, i
  if fields[_TS] < FIRST_SECOND or fields[_TS] > LAST_SECOND:
    return HANDED, first, 0, i
  dst = _DST if spans[_DST, 1] > 0 else (_ADDR if spans[_ADDR, 1] > 0 else _DST)
  src = _FROM if spans[_FROM, 1] > 0 else _SRC
  version = fields[_AF]
  if spans[_AF, 1] < 0:
    version = _version(buf, spans[dst, 0], spans[dst, 1])
    if version == 0:
      version = _version(buf, spans[src, 0], spans[src, 1])
  if version != 4 and version != 6:
    return HANDED, first, 0, i
  src_s, src_l, dst_s, dst_l = spans[src, 0], spans[src, 1], spans[dst, 0], spans[dst, 1]
  src_at, dst_at, room = offsets[SRC, first], offsets[DST, first], texts.shape[1]
  packets = m - first
  if src_at + packets * max(src_l, 0) > room or dst_at + packets * max(dst_l, 0) > room:
    return _FULL_TEXTS, first, 0, p
  src_row, dst_row = texts[SRC], texts[DST]
  for r in range(first, m):
    out_ints[MSM, r] = fields[_MSM]
    out_ints[TS, r] = fields[_TS]
    out_ints[PRB, r] = fields[_PRB]
    out_ints[VER, r] = version
    valid[PRB_OK, r] = spans[_PRB, 1] >= 0
    valid[SRC_OK, r] = src_l >= 0
    valid[DST_OK, r] = dst_l >= 0
    if src_l > 0:
      js.copy(buf, src_s, src_l, src_row, src_at)
      src_at += src_l
    if dst_l > 0:
      js.copy(buf, dst_s, dst_l, dst_row, dst_at)
      dst_at += dst_l
    offsets[SRC, r + 1] = src_at
    offsets[DST, r + 1] = dst_at
  return PING, m, dups, i


@js.helper
def _lines(buf, line, p, lines, m, kinds, starts, first_rows, dups, stack, fields, spans,
           out_ints, valid, rtt, rtt_text, offsets, texts):  # fmt: skip
  """`_line` over the lines from `line` (at `p`) on: (line, p, m, full) where it stopped; each
  line's kind, start, first row and duplicates into `kinds`, `starts`, `first_rows`, `dups`.

  It stops at the end (`full` 0), or where an output array is full (`full` says which:
  `_FULL`, the row arrays, or `_FULL_TEXTS`). Its own function, compiled without
  reference counting, because each call passing arrays from `scan_block` counts references
  to every one.
  """
  n = len(buf)
  while line < lines and p <= n:
    starts[line], first_rows[line] = p, m
    kind, m, d, p = _line(
      buf, p, n, m, stack, fields, spans, out_ints, valid, rtt, rtt_text, offsets, texts
    )
    if kind == _FULL or kind == _FULL_TEXTS:
      return line, p, m, kind
    kinds[line] = kind
    dups[line] = d
    while p < n and buf[p] != NEWLINE:  # the next line (`_line` may stop anywhere in a bad one)
      p += 1
    p, line = p + 1, line + 1
  return line, p, m, 0


@numba.njit(cache=True, nogil=True)
def scan_block(buf, lines):
  """Each line's kind (BLANK, PING, OTHER, HANDED), its start, its first row, its duplicates
  dropped, and the rows of `buf`, `lines` newline-ended lines (its last byte a newline:
  `json_scan`'s contract).

  Returns (kinds[lines], starts[lines + 1], first_rows[lines + 1], dups[lines], m, ints,
  valid, rtt, rtt_text, offsets, texts): the m rows in the first m entries of the columns
  described at `MSM` (offsets m + 1).
  """
  n = len(buf)
  if n == 0 or buf[n - 1] != NEWLINE:
    raise ValueError("scan_block: the block must end with a newline")
  kinds = np.zeros(lines, np.int8)
  starts = np.empty(lines + 1, np.int64)
  first_rows = np.empty(lines + 1, np.int64)
  dups = np.zeros(lines, np.int64)
  # Room for three rows a line (RIPE's default packets), grown when more come. A line's texts
  # are parts of it: the block's size bounds them unless results of many packets repeat long
  # ones (then they grow too, on their own: grown with the rows, a 20,000-packet result's
  # block took 546 MB of texts for 270 KB of them). Pages never written are not mapped in.
  rows = lines * 3 + 16
  out_ints = np.empty((4, rows), np.int64)
  valid = np.empty((3, rows), np.bool_)
  rtt = np.empty(rows, np.float64)
  rtt_text = np.empty((2, rows), np.int64)
  offsets = np.empty((2, rows + 1), np.int32)
  offsets[:, 0] = 0
  texts = np.empty((2, max(n, 64)), np.uint8)
  stack = np.empty(js.MAX_DEPTH, np.uint8)
  fields = np.zeros(_N_KEYS, np.int64)  # integer fields, by key index
  spans = np.zeros((_N_KEYS, 2), np.int64)  # text fields: (start, length), -1: null
  m, p, line = 0, 0, 0
  while True:
    line, p, m, full = _lines(
      buf, line, p, lines, m, kinds, starts, first_rows, dups, stack, fields, spans, out_ints,
      valid, rtt, rtt_text, offsets, texts,
    )  # fmt: skip
    if line >= lines or p > n:
      break
    if full == _FULL_TEXTS:  # grown, the line read again
      wider = np.empty((2, 2 * texts.shape[1]), np.uint8)
      wider[:, : texts.shape[1]] = texts
      texts = wider
      continue
    rows *= 2
    out_ints = _grown(out_ints, m, rows)
    valid = _grown(valid, m, rows)
    rtt = _grown(rtt.reshape(1, -1), m, rows)[0]
    rtt_text = _grown(rtt_text, m, rows)
    offsets = _grown(offsets, m + 1, rows + 1)
  starts[lines], first_rows[lines] = min(p, n), m
  return kinds, starts, first_rows, dups, m, out_ints, valid, rtt, rtt_text, offsets, texts


@numba.njit(cache=True)
def _grown(array, used, size):
  bigger = np.empty((array.shape[0], size), array.dtype)
  bigger[:, :used] = array[:, :used]
  return bigger
