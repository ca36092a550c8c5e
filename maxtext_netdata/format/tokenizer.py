"""The netdata-v1 tokenizer: measurements as numpy columns -> token ids, and back.

Everything here works on whole columns at once: the input pipeline calls `encode` once per
batch of sequences, so the cost is a few dozen numpy operations per call, never Python per
row. A measurement is `MEASUREMENT_START` followed by four field blocks (source, destination,
result, timestamp) in one of the 24 orders of `PERMUTATIONS`; a measurement without a
timestamp simply has an empty timestamp block.
"""

from __future__ import annotations

import datetime
import itertools
import socket
from collections.abc import Iterable, Sequence

import numpy as np

from maxtext_netdata.format import hashed_order
from maxtext_netdata.format import tokens as tk

PERMUTATIONS = np.array(
  list(itertools.permutations((tk.BLOCK_SRC, tk.BLOCK_DST, tk.BLOCK_RESULT, tk.BLOCK_TIMESTAMP))),
  dtype=np.uint8,
)

# Tokens of the timestamp block per TS_* kind (tag + payload bytes).
_TS_LENGTH = np.array(tk.TS_BLOCK_LENGTH, dtype=np.int64)
_TS_TAG = np.array([0, tk.TIMESTAMP_ABS, tk.TIMESTAMP_DELTA1, tk.TIMESTAMP_DELTA4], np.int32)
_BLOCK_NAMES = {
  tk.BLOCK_SRC: "src",
  tk.BLOCK_DST: "dst",
  tk.BLOCK_RESULT: "result",
  tk.BLOCK_TIMESTAMP: "timestamp",
}
_B = tk.BYTE_OFFSET


def rtt_bytes(rtt_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(uint8 [N, 2] RTT payload bytes, bool [N] failed) of RTTs in milliseconds.

  The payload is a 5-bit exponent and an 11-bit mantissa of microseconds (docs/spec.md §2):
  `m * 2**e` us, truncated, at least 1 us. rtt < 0 is a failed probe (bytes 0). NaN or
  infinite RTTs raise ValueError.
  """
  rtt_ms = np.asarray(rtt_ms, dtype=np.float64)
  if not np.isfinite(rtt_ms).all():
    row = int(np.flatnonzero(~np.isfinite(rtt_ms))[0])
    raise ValueError(f"RTT at index {row} is {rtt_ms[row]}; RTTs must be finite")
  failed = rtt_ms < 0
  # Capped first: past ~1.8e305 ms the product is infinite, whose exponent frexp gives as 0
  # (1e306 ms was coded as 2.047 ms); anything past the largest code (2047 * 2**31 us) is it.
  us = np.maximum(1.0, np.minimum(rtt_ms, 1e15) * 1000)
  # Halving is exact in binary floating point, so the exponent of the spec's halving loop is
  # the binary exponent of `us` above 2**10, capped at 31.
  _, exponent = np.frexp(us)
  e = np.clip(exponent - 11, 0, 31)
  m = np.minimum(np.ldexp(us, -e), 2047).astype(np.int64)  # clamp first: no int overflow
  out = np.empty((len(rtt_ms), 2), dtype=np.uint8)
  out[:, 0] = (e << 3) | (m >> 8)
  out[:, 1] = m & 0xFF
  out[failed] = 0
  return out, failed


def rtt_ms_of_bytes(high: int, low: int) -> float:
  """The RTT in milliseconds that payload bytes (high, low) stand for."""
  return ((high & 7) << 8 | low) * 2 ** (high >> 3) / 1000


def measurement_lengths(version, failed, ts_kind) -> np.ndarray:
  """int32 [N] tokens per measurement."""
  address = np.where(
    np.asarray(version) == 4, tk.ADDRESS_BLOCK_LENGTH[4], tk.ADDRESS_BLOCK_LENGTH[6]
  )
  result = np.where(np.asarray(failed), tk.RESULT_BLOCK_LENGTH[True], tk.RESULT_BLOCK_LENGTH[False])
  ts_length = _TS_LENGTH[np.asarray(ts_kind, dtype=np.intp)]
  return (1 + 2 * address + result + ts_length).astype(np.int32)


def timestamp_kinds(seconds, has_ts, segment_start) -> tuple[np.ndarray, np.ndarray]:
  """Timestamp kind and value of each row, for many sequences laid end to end.

  Rows with `has_ts` False get TS_NONE (value 0). The first timestamped row after each
  `segment_start` (row 0 always starts one) gets TS_ABS with value = seconds; every later
  timestamped row the delta from the previous timestamped row of its segment, clamped at
  >= 0: <= 255 is TS_DELTA1, above TS_DELTA4 saturating at 2**32 - 1.

  Returns (ts_kind uint8 [N], ts_value int64 [N]).
  """
  seconds = np.asarray(seconds, dtype=np.int64)
  has_ts = np.asarray(has_ts, dtype=bool)
  segment_start = np.asarray(segment_start, dtype=bool)
  n = len(seconds)
  index = np.arange(n)
  last_ts = np.maximum.accumulate(np.where(has_ts, index, -1))
  previous = np.empty(n, dtype=np.int64)
  previous[:1] = -1
  previous[1:] = last_ts[:-1]
  segment_first = np.maximum.accumulate(np.where(segment_start, index, 0))
  first = previous < segment_first
  delta = np.maximum(seconds - seconds[np.maximum(previous, 0)], 0)
  kind = np.where(delta <= 255, tk.TS_DELTA1, tk.TS_DELTA4).astype(np.uint8)
  value = np.minimum(delta, tk.DELTA4_MAX)
  kind[first] = tk.TS_ABS
  value[first] = seconds[first]
  kind[~has_ts] = tk.TS_NONE
  value[~has_ts] = 0
  return kind, value


def random_orders(bits: np.ndarray) -> np.ndarray:
  """uint8 [N] field-order indices (into PERMUTATIONS) from uint64 random bits."""
  return (np.asarray(bits, dtype=np.uint64) % np.uint64(len(PERMUTATIONS))).astype(np.uint8)


# The `hashed` field order (vectorized in its own module; re-exported as part of this API).
hashed_orders = hashed_order.hashed_orders
hashed_order_pairs = hashed_order.hashed_order_pairs


def _layout_tables() -> tuple[np.ndarray, ...]:
  """Per-layout tables, layout = ((order * 2 + is_ipv6) * 2 + failed) * 4 + ts_kind.

  starts [L, 4]: offset of each block's tag in the measurement, by block id; tags [L, 4]: the
  tag tokens; low [L, 3]: offsets of the two RTT bytes and of the timestamp's last byte;
  high [L, 7]: offsets of the first seven bytes of an 8-byte timestamp (the last three for
  a 4-byte delta); lengths [L]. Slots a layout does not have point at offset 0, the
  MEASUREMENT_START, which `encode` writes last, so all rows scatter with the same shape.
  """
  count = len(PERMUTATIONS) * 16
  starts = np.zeros((count, 4), dtype=np.int64)
  tags = np.zeros((count, 4), dtype=np.int32)
  low = np.zeros((count, 3), dtype=np.int64)
  high = np.zeros((count, 7), dtype=np.int64)
  lengths = np.zeros(count, dtype=np.int64)
  for order, permutation in enumerate(PERMUTATIONS):
    for is_ipv6, failed, ts_kind in itertools.product((0, 1), (0, 1), range(4)):
      layout = ((order * 2 + is_ipv6) * 2 + failed) * 4 + ts_kind
      address = tk.ADDRESS_BLOCK_LENGTH[6 if is_ipv6 else 4]
      ts_length = tk.TS_BLOCK_LENGTH[ts_kind]
      block_length = [address, address, tk.RESULT_BLOCK_LENGTH[bool(failed)], ts_length]
      offset = 1
      for block in permutation:
        starts[layout, block] = offset
        offset += block_length[block]
      lengths[layout] = offset
      tags[layout] = [
        tk.SRC_IPV6 if is_ipv6 else tk.SRC_IPV4,
        tk.DST_IPV6 if is_ipv6 else tk.DST_IPV4,
        tk.FAILED if failed else tk.RTT_START,
        _TS_TAG[ts_kind],
      ]
      if not failed:
        low[layout, :2] = starts[layout, tk.BLOCK_RESULT] + np.arange(1, 3)
      ts_end = starts[layout, tk.BLOCK_TIMESTAMP] + ts_length  # one past the last byte
      if ts_kind == tk.TS_NONE:
        starts[layout, tk.BLOCK_TIMESTAMP] = 0
      else:
        low[layout, 2] = ts_end - 1
      if ts_kind in (tk.TS_ABS, tk.TS_DELTA4):
        width = ts_length - 2  # payload bytes before the last one
        high[layout, 7 - width :] = ts_end - 1 - width + np.arange(width)
  return starts, tags, low, high, lengths


_LAYOUT_STARTS, _LAYOUT_TAGS, _LAYOUT_LOW, _LAYOUT_HIGH, _LAYOUT_LENGTHS = _layout_tables()
_ADDRESS_OFFSETS = {4: np.arange(1, 5), 16: np.arange(1, 17)}


def _check_ranges(version, order, ts_kind, is_ipv6) -> None:
  bad = ~(is_ipv6 | (version == 4)) | (order >= len(PERMUTATIONS)) | (ts_kind > tk.TS_DELTA4)
  if bad.any():
    row = int(bad.nonzero()[0][0])
    raise ValueError(
      f"measurement {row}: ip version {version[row]}, field order {order[row]}, timestamp kind"
      f" {ts_kind[row]}: one is out of range (4 or 6; < {len(PERMUTATIONS)}; <= {tk.TS_DELTA4})"
    )


def encode(
  *,
  src,
  dst,
  version,
  rtt_bytes,
  failed,
  ts_kind,
  ts_value,
  order,
  out=None,
  positions=None,
) -> tuple[np.ndarray, np.ndarray]:
  """Tokens of N measurements.

  Args:
    src, dst: uint8 [N, 16] addresses (IPv4 in the first 4 bytes).
    version: uint8 [N], 4 or 6.
    rtt_bytes, failed: as returned by `rtt_bytes`.
    ts_kind, ts_value: as returned by `timestamp_kinds`.
    order: uint8 [N] index into PERMUTATIONS; the timestamp block is empty for TS_NONE.
    out: optional int32 1-D buffer to write into (with `positions`).
    positions: int64 [N] start of each measurement in `out`; the caller guarantees the
      measurements fit (see `measurement_lengths`) and do not overlap.

  Returns:
    Without `out`: (int32 tokens of all measurements back to back, int64 offsets [N + 1]).
    With `out`: (out, positions), written in place; tokens outside the measurements are
    left untouched.
  """
  src, dst = np.asarray(src), np.asarray(dst)
  version = np.asarray(version)
  failed = np.asarray(failed, dtype=bool)
  ts_kind = np.asarray(ts_kind)
  order = np.asarray(order)
  ts_value = np.asarray(ts_value, dtype=np.int64)
  is_ipv6 = version == 6
  _check_ranges(version, order, ts_kind, is_ipv6)
  layout = ((order.astype(np.intp) * 2 + is_ipv6) * 2 + failed) * 4 + ts_kind
  if out is None:
    offsets = np.zeros(len(version) + 1, dtype=np.int64)
    np.cumsum(_LAYOUT_LENGTHS.take(layout), out=offsets[1:])
    positions = offsets[:-1]
    out = np.empty(int(offsets[-1]), dtype=np.int32)
    result = (out, offsets)
  else:
    positions = np.asarray(positions, dtype=np.int64)
    result = (out, positions)
  column = positions[:, None]
  starts = _LAYOUT_STARTS.take(layout, axis=0)  # absolute tag position of each block
  starts += column
  out[starts] = _LAYOUT_TAGS.take(layout, axis=0)

  # RTT bytes and the timestamp's last byte (every timestamp kind has one).
  low_at = _LAYOUT_LOW.take(layout, axis=0)
  low_at += column
  low = np.empty((len(layout), 3), dtype=np.int32)
  low[:, :2] = rtt_bytes
  np.bitwise_and(ts_value, 0xFF, out=low[:, 2], casting="unsafe")
  low += _B
  out[low_at] = low
  # The other timestamp bytes: only absolute (TS_ABS) and 4-byte deltas (TS_DELTA4).
  rows = (ts_kind & 1).nonzero()[0]
  if len(rows):
    high_at = _LAYOUT_HIGH.take(layout.take(rows), axis=0)
    high_at += positions.take(rows)[:, None]
    big_endian = ts_value.take(rows).astype(">u8").view(np.uint8).reshape(-1, 8)
    out[high_at] = np.add(big_endian[:, :7], _B, dtype=np.int32)

  # Address bytes, one scatter per IP version and block; a single-version batch (the usual
  # case: one probe per sequence) skips the row gathers.
  for rows, width in ((np.flatnonzero(~is_ipv6), 4), (np.flatnonzero(is_ipv6), 16)):
    if len(rows) == len(version):
      group_starts, group_src, group_dst = starts, src, dst
    elif len(rows):
      group_starts = starts.take(rows, axis=0)
      group_src = src.take(rows, axis=0)
      group_dst = dst.take(rows, axis=0)
    else:
      continue
    byte_offsets = _ADDRESS_OFFSETS[width]
    for block, address in ((tk.BLOCK_SRC, group_src), (tk.BLOCK_DST, group_dst)):
      at = group_starts[:, block, None] + byte_offsets
      out[at] = np.add(address[:, :width], _B, dtype=np.int32)
  out[positions] = tk.MEASUREMENT_START
  return result


def _format_address(raw: Sequence[int]) -> str:
  family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
  return socket.inet_ntop(family, bytes(raw))


# Block tag -> (block id, payload bytes, IP version of an address tag).
_TAGS = {
  tk.SRC_IPV4: (tk.BLOCK_SRC, 4, 4),
  tk.SRC_IPV6: (tk.BLOCK_SRC, 16, 6),
  tk.DST_IPV4: (tk.BLOCK_DST, 4, 4),
  tk.DST_IPV6: (tk.BLOCK_DST, 16, 6),
  tk.RTT_START: (tk.BLOCK_RESULT, 2, None),
  tk.FAILED: (tk.BLOCK_RESULT, 0, None),
  tk.TIMESTAMP_ABS: (tk.BLOCK_TIMESTAMP, 8, None),
  tk.TIMESTAMP_DELTA1: (tk.BLOCK_TIMESTAMP, 1, None),
  tk.TIMESTAMP_DELTA4: (tk.BLOCK_TIMESTAMP, 4, None),
}


def _decode_one(tokens: list[int], start: int) -> tuple[dict, int]:
  """The measurement at tokens[start] (a MEASUREMENT_START) and the index after it."""
  found: dict[int, tuple[int, list[int], int]] = {}
  i = start + 1
  while i < len(tokens) and tokens[i] not in (tk.MEASUREMENT_START, tk.PAD):
    tag = tokens[i]
    if tag not in _TAGS:
      raise ValueError(f"token {i}: expected a field tag, got {tk.token_name(tag)}")
    block, width, _ = _TAGS[tag]
    if block in found:
      raise ValueError(f"token {i}: second {_BLOCK_NAMES[block]} block in one measurement")
    payload = tokens[i + 1 : i + 1 + width]
    for j, token in enumerate(payload):
      if not _B <= token < _B + 256:
        raise ValueError(f"token {i + 1 + j}: expected a byte, got {tk.token_name(token)}")
    if len(payload) < width:
      raise ValueError(f"token {len(tokens)}: stream ends inside a {tk.token_name(tag)} block")
    found[block] = (tag, [t - _B for t in payload], i)
    i += 1 + width
  for block in (tk.BLOCK_SRC, tk.BLOCK_DST, tk.BLOCK_RESULT):
    if block not in found:
      raise ValueError(f"token {start}: measurement has no {_BLOCK_NAMES[block]} block")
  src_tag, src, _ = found[tk.BLOCK_SRC]
  dst_tag, dst, _ = found[tk.BLOCK_DST]
  version = _TAGS[src_tag][2]
  if _TAGS[dst_tag][2] != version:
    raise ValueError(
      f"token {found[tk.BLOCK_DST][2]}: IPv{version} source, other-version destination"
    )
  result_tag, rtt, _ = found[tk.BLOCK_RESULT]
  measurement = {
    "position": start,
    "ip_version": version,
    "src": _format_address(src),
    "dst": _format_address(dst),
    "failed": result_tag == tk.FAILED,
    "rtt_ms": None if result_tag == tk.FAILED else rtt_ms_of_bytes(*rtt),
    "timestamp": None,
    "delta_s": None,
    "order": [_BLOCK_NAMES[b] for b in sorted(found, key=lambda b: found[b][2])],
  }
  if tk.BLOCK_TIMESTAMP in found:
    ts_tag, payload, _ = found[tk.BLOCK_TIMESTAMP]
    value = int.from_bytes(bytes(payload), "big")
    measurement["timestamp" if ts_tag == tk.TIMESTAMP_ABS else "delta_s"] = value
  return measurement, i


def decode(tokens: Iterable[int]) -> list[dict]:
  """Readable measurements of a token stream (PAD skipped between measurements).

  Each is a dict: position (index of its MEASUREMENT_START), ip_version, src, dst (text),
  failed, rtt_ms (None when failed; the encoded value, within RTT precision), timestamp
  (Unix seconds of an absolute timestamp, else None), delta_s (seconds of a delta timestamp,
  else None) and order (block names as they appear). A malformed stream raises ValueError
  naming the token position.
  """
  tokens = np.asarray(list(tokens), dtype=np.int64).tolist()
  measurements = []
  i = 0
  while i < len(tokens):
    if tokens[i] == tk.PAD:
      i += 1
    elif tokens[i] == tk.MEASUREMENT_START:
      measurement, i = _decode_one(tokens, i)
      measurements.append(measurement)
    else:
      raise ValueError(
        f"token {i}: expected MEASUREMENT_START or PAD, got {tk.token_name(tokens[i])}"
      )
  return measurements


def format_measurement(measurement: dict) -> str:
  """One readable line for a decoded measurement."""
  if measurement["failed"]:
    result = "failed"
  else:
    result = f"rtt {measurement['rtt_ms']:.3f} ms"
  if measurement["timestamp"] is not None:
    try:
      when = datetime.datetime.fromtimestamp(measurement["timestamp"], datetime.UTC)
      time_text = when.strftime(" at %Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, ValueError, OSError):  # beyond the calendar: show the number
      time_text = f" at {measurement['timestamp']} s"
  elif measurement["delta_s"] is not None:
    time_text = f" +{measurement['delta_s']} s"
  else:
    time_text = ""
  order = ",".join(measurement["order"])
  return f"{measurement['src']} -> {measurement['dst']} {result}{time_text} [{order}]"
