"""A plain per-measurement netdata-v1 tokenizer, written line by line from docs/spec.md §2.

It is the oracle of the vectorized `maxtext_netdata.format.tokenizer`: slow, obvious, and sharing no
code with it (addresses are parsed with `ipaddress`, not the project's parser).
"""

from __future__ import annotations

import hashlib
import ipaddress
import random

MEASUREMENT_START = 0
SRC_IPV4, SRC_IPV6, DST_IPV4, DST_IPV6 = 1, 2, 3, 4
TIMESTAMP_ABS, TIMESTAMP_DELTA1, TIMESTAMP_DELTA4 = 5, 6, 7
RTT_START, FAILED = 8, 10
BYTE = 11

SRC, DST, RESULT, TIMESTAMP = "src", "dst", "result", "timestamp"
FIXED_ORDER = [SRC, DST, RESULT, TIMESTAMP]


def byte_tokens(data: bytes) -> list[int]:
  return [BYTE + b for b in data]


def address_bytes(text: str | None, version: int) -> bytes:
  if not text:
    return bytes(4 if version == 4 else 16)
  address = ipaddress.ip_address(text)
  if address.version != version:
    raise ValueError(f"{text} is not IPv{version}")
  return address.packed


def rtt_payload(rtt_ms: float) -> list[int]:
  """RTT_START + 2 bytes, or FAILED for a negative RTT."""
  if rtt_ms != rtt_ms or rtt_ms in (float("inf"), float("-inf")):
    raise ValueError("RTT must be finite")
  if rtt_ms < 0:
    return [FAILED]
  us = max(1.0, rtt_ms * 1000)
  e = 0
  while us >= 2048 and e < 31:
    us /= 2
    e += 1
  m = int(min(us, 2047))  # us may be infinite (rtt_ms past ~1.8e305)
  return [RTT_START, BYTE + ((e << 3) | (m >> 8)), BYTE + (m & 0xFF)]


def timestamp_tokens(kind: str | None, value: int) -> list[int]:
  """kind: None, "abs" (value = Unix seconds) or "delta" (value = seconds since previous)."""
  if kind is None:
    return []
  if kind == "abs":
    return [TIMESTAMP_ABS] + byte_tokens(value.to_bytes(8, "big"))
  delta = max(0, value)
  if delta <= 255:
    return [TIMESTAMP_DELTA1, BYTE + delta]
  return [TIMESTAMP_DELTA4] + byte_tokens(min(delta, 2**32 - 1).to_bytes(4, "big"))


def hashed_order(src_text: str | None, dst_text: str | None, seconds: int, has_ts: bool):
  """The original format's per-measurement block order."""
  key = f"{src_text or ''}|{dst_text or ''}|{seconds}"
  seed = int.from_bytes(hashlib.md5(key.encode()).digest()[:4], "big")
  blocks = [SRC, DST, RESULT, TIMESTAMP] if has_ts else [SRC, DST, RESULT]
  random.Random(seed).shuffle(blocks)
  return blocks if has_ts else blocks + [TIMESTAMP]


def encode_measurement(
  src_text: str | None,
  dst_text: str | None,
  version: int,
  rtt_ms: float,
  ts_kind: str | None,
  ts_value: int,
  order: list[str],
) -> list[int]:
  """Tokens of one measurement; `order` names the four blocks (timestamp skipped if absent)."""
  src_tag = SRC_IPV4 if version == 4 else SRC_IPV6
  dst_tag = DST_IPV4 if version == 4 else DST_IPV6
  blocks = {
    SRC: [src_tag] + byte_tokens(address_bytes(src_text, version)),
    DST: [dst_tag] + byte_tokens(address_bytes(dst_text, version)),
    RESULT: rtt_payload(rtt_ms),
    TIMESTAMP: timestamp_tokens(ts_kind, ts_value),
  }
  tokens = [MEASUREMENT_START]
  for name in order:
    tokens += blocks[name]
  return tokens


def timestamp_plan(seconds: list[int], has_ts: list[bool], starts: list[bool]):
  """(kind, value) per row: rows laid end to end, `starts` True where a sequence begins."""
  plan = []
  previous = None
  for t, has, start in zip(seconds, has_ts, starts, strict=True):
    if start:
      previous = None
    if not has:
      plan.append((None, 0))
    elif previous is None:
      plan.append(("abs", t))
    else:
      plan.append(("delta", t - previous))
    if has:
      previous = t
  return plan
