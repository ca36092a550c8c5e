"""The compiled line kernel of `ripe_scan`: RIPE Atlas ping results (JSON lines) → rows.

`scan_block` reads every line of a block (a uint8 view, no Python per line) with the strict
JSON pieces of `json_scan`, reads only the fields the mapping needs, skips the rest, and
writes the rows of the results it can map with certainty; it says of every other line that
it is handed over (to `ripe_json`, the reference). What it maps itself is a strict subset of
what both the reference and `json.loads` accept, so it never gives a row the reference
would not:
- a line is one JSON object in `json_scan`'s strict grammar, nested at most
  `json_scan.MAX_DEPTH` deep, with no backslash in any key;
- the needed keys (`_TOP`, and `rtt` / `dup` in a packet) appear at most once an object;
- the text fields are strings without escapes (or null), the integer fields integers of at
  most 18 digits (or null), `avg` a number (or null), `result` a list of objects, `rtt` a
  number of at most `_MAX_NUMBER` characters with an exponent of at most two digits (or
  null), `dup` an integer (or null);
- a `ping` result (or one without `type`) has a `result` list, `msm_id`, `timestamp`, and
  an `af` of 4 or 6 or an address that tells the version.
A valid JSON object whose `type` is another string is counted as another type whatever its
other fields hold, as the reference does. The mapping of the rest is `ripe_json.map_batch`'s.

Compiled by numba with `cache=True`: the first use ever compiles it (59 s measured on the
shared 2-vCPU development machine, most of it the inlined `json_scan` pieces), later
processes load the machine code from the cache (0.4-0.8 s).
"""

from __future__ import annotations

import numba
import numpy as np

from maxtext_netdata.data import json_scan as js

BLANK, PING, OTHER, HANDED = 0, 1, 2, 3  # what `scan_block` says of each line
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
_SLOTS = np.full((16, 128), -1, np.int64)  # by length and first byte: unique for these keys
for _k, _name in enumerate(_TOP):
  _KEY_BYTES[_k, : len(_name)] = np.frombuffer(_name.encode(), np.uint8)
  _SLOTS[len(_name), ord(_name[0])] = _k
assert len({(len(k), k[0]) for k in _TOP}) == len(_TOP)
_N_KEYS = len(_TOP)
# Columns of the rows array `scan_block` fills: a row's integers, then (start, length) of its
# src, dst and rtt texts in rows 0, 1, 2 of its `texts` (length -1: null; an rtt of length 0
# is a failed packet, its text there "-1"). Each column's texts follow one another in row
# order with nothing between them (a result's src and dst are copied for each of its rows):
# a slice of rows has its texts in one piece of each.
MSM_C, TS_C, PRB_C, PRB_OK_C, VER_C, SRC_S, SRC_L, DST_S, DST_L, RTT_S, RTT_L = range(11)
_COLUMNS = 11


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


@js.helper
def _version(buf, start, length):
  """6 for text with a colon, 4 for text with a dot, else 0 (ripe_json._version_of)."""
  dot = False
  for j in range(start, start + max(length, 0)):
    if buf[j] == 58:
      return 6
    if buf[j] == 46:
      dot = True
  return 4 if dot else 0


_FULL = -2  # `_packets` / `_line`: the rows array is full (grown, then the line read again)


@js.helper
def _packets(buf, i, n, rows, m, stack):
  """Parse a `result` list at `i` into rows from m on: (end, new m, duplicates).

  End -1: not a list of packets the scanner takes (the caller skips it as any value);
  `_FULL`: `rows` has no room left.
  """
  dups = 0
  i = js.space(buf, i + 1, n)
  if i < n and buf[i] == 93:
    return i + 1, m, 0
  while True:
    if i >= n or buf[i] != 123:
      return -1, m, 0
    rtt_s, rtt_l, dup, seen = 0, 0, False, 0
    i = js.space(buf, i + 1, n)
    if i < n and buf[i] == 125:
      i += 1
    else:
      while True:
        i, start, length = js.key(buf, i, n)
        if i < 0:
          return -1, m, 0
        if length == 3 and buf[start] == 114 and buf[start + 1] == 116 and buf[start + 2] == 116:
          if seen & 1:
            return -1, m, 0
          seen |= 1
          if buf[i] == 110:
            i = js.literal(buf, i, n, js.NULL)
          else:
            end, _, exponent = js.number(buf, i, n)
            if end < 0 or exponent > 2 or end - i > _MAX_NUMBER:
              return -1, m, 0
            rtt_s, rtt_l, i = i, end - i, end
        elif length == 3 and buf[start] == 100 and buf[start + 1] == 117 and buf[start + 2] == 112:
          if seen & 2:
            return -1, m, 0
          seen |= 2
          if buf[i] == 110:
            i = js.literal(buf, i, n, js.NULL)
          else:
            i = js.integer(buf, i, n)[0]
            dup = True
        else:
          i = js.value(buf, i, n, stack)
        if i < 0:
          return -1, m, 0
        i = js.space(buf, i, n)
        if i < n and buf[i] == 44:
          i = js.space(buf, i + 1, n)
        elif i < n and buf[i] == 125:
          i += 1
          break
        else:
          return -1, m, 0
    if dup:
      dups += 1
    else:
      if m == rows.shape[0]:
        return _FULL, m, 0
      rows[m, RTT_S] = rtt_s
      rows[m, RTT_L] = rtt_l
      m += 1
    i = js.space(buf, i, n)
    if i < n and buf[i] == 44:
      i = js.space(buf, i + 1, n)
    elif i < n and buf[i] == 93:
      return i + 1, m, dups
    else:
      return -1, m, 0


@js.inline
def _copy(buf, start, length, texts, at, c):
  """Copy a text of the line into `texts[c]` at `at[c]` (moved on); its position there.

  A failed packet's rtt (c 2, length 0) is written as "-1".
  """
  a = at[c]
  if c == 2 and length == 0:
    texts[c, a], texts[c, a + 1] = 45, 49
    at[c] = a + 2
    return a
  for j in range(length):
    texts[c, a + j] = buf[start + j]
  at[c] = a + max(length, 0)
  return a


@js.helper
def _line(buf, p, n, rows, m, stack, ints, spans, texts, at):
  """Read the line at `p`: (kind, new m, duplicates, a position in the line past which
  only its newline may come); `_FULL` as kind if `rows` or `texts` is full.

  A ping result's texts are copied into `texts` while the line is in cache (gathering them
  from the block later missed the cache on every row: 3x slower).
  """
  for k in range(_N_KEYS):
    spans[k, 1] = -1
    ints[k] = 0
  first = m
  i = js.space(buf, p, n)
  if i >= n or buf[i] == 10:
    return BLANK, m, 0, i
  if buf[i] != 123:
    return HANDED, m, 0, p
  odd, seen, dups, has_list = False, 0, 0, False
  i = js.space(buf, i + 1, n)
  if i < n and buf[i] == 125:
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
        if c == 110:  # null: the field is absent
          i = js.literal(buf, i, n, js.NULL)
        elif k == _RESULT:
          i, m2, d = _packets(buf, i, n, rows, m, stack) if c == 91 else (-1, m, 0)
          if i == _FULL:
            return _FULL, first, 0, p
          if i >= 0:
            m, dups, has_list = m2, d, True
        elif k == _AVG:
          i = js.number(buf, i, n)[0]
        elif k <= _TS or k == _AF or k == _RCVD:
          if k != _TYPE:
            i, number = js.integer(buf, i, n)
            ints[k] = number
            spans[k, 1] = 0
        if k == _TYPE or _FROM <= k <= _ADDR:
          if c == 34:
            i, escaped = js.string(buf, i, n)
            if escaped:
              i = -1
            spans[k, 0] = value + 1
            spans[k, 1] = i - value - 2
          elif c != 110:
            i = -1
        if i < 0:  # a value the scanner does not take: skipped, the line handed over
          odd = True
          spans[k, 1] = -1
          i = js.skip(buf, value, n, stack)
      else:
        i = js.value(buf, i, n, stack)
      if i < 0:
        break
      i = js.space(buf, i, n)
      if i < n and buf[i] == 44:
        i = js.space(buf, i + 1, n)
      elif i < n and buf[i] == 125:
        i += 1
        break
      else:
        i = -1
        break
  if i >= 0:
    i = js.space(buf, i, n)
    if i < n and buf[i] != 10:
      i = -1
  if i < 0:
    return HANDED, first, 0, p
  t_start, t_length = spans[_TYPE, 0], spans[_TYPE, 1]
  ping = t_length == 4 and buf[t_start] == 112 and buf[t_start + 1] == 105
  ping = ping and buf[t_start + 2] == 110 and buf[t_start + 3] == 103
  if t_length >= 0 and not ping:
    return OTHER, first, 0, i
  if odd or not has_list or spans[_MSM, 1] < 0 or spans[_TS, 1] < 0:
    return HANDED, first, 0, i
  dst = _DST if spans[_DST, 1] > 0 else (_ADDR if spans[_ADDR, 1] > 0 else _DST)
  src = _FROM if spans[_FROM, 1] > 0 else _SRC
  version = ints[_AF]
  if spans[_AF, 1] < 0:
    version = _version(buf, spans[dst, 0], spans[dst, 1])
    if version == 0:
      version = _version(buf, spans[src, 0], spans[src, 1])
  if version != 4 and version != 6:
    return HANDED, first, 0, i
  packets, room = m - first, texts.shape[1]
  if (
    at[0] + packets * max(spans[src, 1], 0) > room or at[1] + packets * max(spans[dst, 1], 0) > room
  ):
    return _FULL, first, 0, p
  for r in range(first, m):
    rows[r, MSM_C] = ints[_MSM]
    rows[r, TS_C] = ints[_TS]
    rows[r, PRB_C] = ints[_PRB]
    rows[r, PRB_OK_C] = spans[_PRB, 1] >= 0
    rows[r, VER_C] = version
    rows[r, SRC_S] = _copy(buf, spans[src, 0], spans[src, 1], texts, at, 0)
    rows[r, SRC_L] = spans[src, 1]
    rows[r, DST_S] = _copy(buf, spans[dst, 0], spans[dst, 1], texts, at, 1)
    rows[r, DST_L] = spans[dst, 1]
    rows[r, RTT_S] = _copy(buf, rows[r, RTT_S], rows[r, RTT_L], texts, at, 2)
  return PING, m, dups, i


@js.helper
def _lines(
  buf,
  line,
  p,
  lines,
  rows,
  m,
  kinds,
  starts,
  first_rows,
  stack,
  ints,
  spans,
  texts,
  at,
):
  """`_line` over the lines from `line` (at `p`) on: (line, p, m, duplicates) where it stopped.

  It stops at the end, or where `rows` is full. Its own function, compiled without reference
  counting, because each call passing arrays from `scan_block` counts references to every one.
  """
  n = len(buf)
  dups = 0
  while line < lines and p <= n:
    starts[line], first_rows[line] = p, m
    kind, m, d, p = _line(buf, p, n, rows, m, stack, ints, spans, texts, at)
    if kind == _FULL:
      return line, p, m, dups
    kinds[line] = kind
    dups += d
    while p < n and buf[p] != 10:  # the next line (`_line` may stop anywhere in a bad one)
      p += 1
    p, line = p + 1, line + 1
  return line, p, m, dups


@numba.njit(cache=True, nogil=True)
def scan_block(buf, lines):
  """Each line's kind (BLANK, PING, OTHER, HANDED), its start, its first row, and the rows.

  Returns (kinds[lines], starts[lines + 1], first_rows[lines + 1], rows[m, _COLUMNS], dups,
  texts[3, len(buf)]): the rows' texts are (start, length) in `texts`, row 0 the src
  texts, 1 the dst texts, 2 the rtt texts (see `MSM_C`).
  """
  n = len(buf)
  kinds = np.zeros(lines, np.int8)
  starts = np.empty(lines + 1, np.int64)
  first_rows = np.empty(lines + 1, np.int64)
  rows = np.empty((lines * 2 + 16, _COLUMNS), np.int64)
  # A line's texts are parts of it: the block's size bounds the rtts (a failed packet's "-1"
  # replaces at least "{}" of it), and the src and dst texts unless results of many packets
  # repeat long ones (then it grows, as `rows` does). Pages never written are not mapped in.
  texts = np.empty((3, n), np.uint8)
  at = np.zeros(3, np.int64)
  stack = np.empty(js.MAX_DEPTH, np.uint8)
  ints = np.zeros(_N_KEYS, np.int64)  # integer fields, by key index
  spans = np.zeros((_N_KEYS, 2), np.int64)  # text fields: (start, length), -1: null
  m, dups, p, line = 0, 0, 0, 0
  while True:
    line, p, m, d = _lines(
      buf,
      line,
      p,
      lines,
      rows,
      m,
      kinds,
      starts,
      first_rows,
      stack,
      ints,
      spans,
      texts,
      at,
    )
    dups += d
    if line >= lines or p > n:
      break
    bigger = np.empty((2 * rows.shape[0], _COLUMNS), np.int64)  # full: grown, line read again
    bigger[:m] = rows[:m]
    rows = bigger
    wider = np.empty((3, max(2 * texts.shape[1], 64)), np.uint8)
    for c in range(3):
      wider[c, : at[c]] = texts[c, : at[c]]
    texts = wider
  starts[lines], first_rows[lines] = min(p, n), m
  return kinds, starts, first_rows, rows[:m], dups, texts


@numba.njit(cache=True, nogil=True)
def columns_of(texts, rows):
  """The columns of a `scan_block` rows array (or a slice of one), each contiguous, for Arrow
  to take as they are.

  Returns (msm, ts, prb, prb_ok, version, offsets, data, valid): the integer columns; for the
  src, dst and rtt texts (c = 0, 1, 2) int32 Arrow offsets[c] and validity valid[c], their
  bytes one column after another in `data`, each column's offsets counting from its own
  start. One pass over `rows` (one per column read each 88-byte row again: 11 passes cost as
  much as writing the parquet), then one copy of each column's texts, already in one piece.
  The caller keeps the texts' total under 2**31.
  """
  m = rows.shape[0]
  msm, ts, prb = np.empty(m, np.int64), np.empty(m, np.int64), np.empty(m, np.int64)
  prb_ok, version = np.empty(m, np.bool_), np.empty(m, np.int64)
  offsets = np.empty((3, m + 1), np.int32)
  valid = np.empty((3, m), np.bool_)
  firsts = np.zeros(3, np.int64)
  if m:
    firsts[0], firsts[1], firsts[2] = rows[0, SRC_S], rows[0, DST_S], rows[0, RTT_S]
  src, dst, rtt = firsts[0], firsts[1], firsts[2]  # scalars: kept in registers
  for r in range(m):
    msm[r], ts[r], prb[r] = rows[r, MSM_C], rows[r, TS_C], rows[r, PRB_C]
    prb_ok[r], version[r] = rows[r, PRB_OK_C] != 0, rows[r, VER_C]
    offsets[0, r] = rows[r, SRC_S] - src
    offsets[1, r] = rows[r, DST_S] - dst
    offsets[2, r] = rows[r, RTT_S] - rtt
    valid[0, r], valid[1, r], valid[2, r] = (
      rows[r, SRC_L] >= 0,
      rows[r, DST_L] >= 0,
      rows[r, RTT_L] >= 0,
    )
  ends = firsts.copy()
  if m:
    ends[0] = rows[m - 1, SRC_S] + max(rows[m - 1, SRC_L], 0)
    ends[1] = rows[m - 1, DST_S] + max(rows[m - 1, DST_L], 0)
    ends[2] = rows[m - 1, RTT_S] + max(rows[m - 1, RTT_L], 2 if rows[m - 1, RTT_L] == 0 else 0)
  total = 0
  for c in range(3):
    offsets[c, m] = ends[c] - firsts[c]
    total += ends[c] - firsts[c]
  data = np.empty(total, np.uint8)
  at = 0
  for c in range(3):
    length = ends[c] - firsts[c]
    data[at : at + length] = texts[c, firsts[c] : ends[c]]
    at += length
  return msm, ts, prb, prb_ok, version, offsets, data, valid
