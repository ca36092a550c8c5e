"""The netdata-v1 vocabulary: token ids and per-measurement token counts.

Ids 0-266 are those of the original ping-LLM format; 267 is padding. Every token count of a
measurement (docs/spec.md §2) is derived here, and only here, from its blocks.
"""

MEASUREMENT_START = 0
SRC_IPV4 = 1
SRC_IPV6 = 2
DST_IPV4 = 3
DST_IPV6 = 4
TIMESTAMP_ABS = 5
TIMESTAMP_DELTA1 = 6
TIMESTAMP_DELTA4 = 7
RTT_START = 8
THROUGHPUT_START = 9  # reserved: never emitted
FAILED = 10
BYTE_OFFSET = 11  # token of byte b is BYTE_OFFSET + b
PAD = 267
VOCAB_SIZE = 268
FORMAT = "netdata-v1"

# Timestamp kinds of one measurement inside a sequence.
TS_NONE = 0
TS_ABS = 1
TS_DELTA1 = 2
TS_DELTA4 = 3

# Field blocks, in the order of the `fixed` field order.
BLOCK_SRC = 0
BLOCK_DST = 1
BLOCK_RESULT = 2
BLOCK_TIMESTAMP = 3

DELTA4_MAX = 2**32 - 1

# Tokens of each block: tag + payload bytes.
ADDRESS_BLOCK_LENGTH = {4: 1 + 4, 6: 1 + 16}
RESULT_BLOCK_LENGTH = {False: 1 + 2, True: 1}  # by `failed`
TS_BLOCK_LENGTH = (0, 1 + 8, 1 + 1, 1 + 4)  # by TS_* kind


def measurement_length(version: int, failed: bool, ts_kind: int) -> int:
  """Tokens of one measurement: MEASUREMENT_START, src, dst, result and timestamp blocks."""
  address = ADDRESS_BLOCK_LENGTH[version]
  return 1 + 2 * address + RESULT_BLOCK_LENGTH[bool(failed)] + TS_BLOCK_LENGTH[ts_kind]


# Shortest (failed, no timestamp) and longest (RTT, absolute timestamp) measurement per IP
# version: what bounds how many measurements a sequence holds, and the shortest sequence.
SHORTEST_MEASUREMENT = {v: measurement_length(v, True, TS_NONE) for v in (4, 6)}
LONGEST_MEASUREMENT = measurement_length(6, False, TS_ABS)

NAMES = {
  MEASUREMENT_START: "MEASUREMENT_START",
  SRC_IPV4: "SRC_IPV4",
  SRC_IPV6: "SRC_IPV6",
  DST_IPV4: "DST_IPV4",
  DST_IPV6: "DST_IPV6",
  TIMESTAMP_ABS: "TIMESTAMP_ABS",
  TIMESTAMP_DELTA1: "TIMESTAMP_DELTA1",
  TIMESTAMP_DELTA4: "TIMESTAMP_DELTA4",
  RTT_START: "RTT_START",
  THROUGHPUT_START: "THROUGHPUT_START",
  FAILED: "FAILED",
  PAD: "PAD",
}


def token_name(token: int) -> str:
  """Readable name of one token id (`BYTE_42` for byte tokens)."""
  if BYTE_OFFSET <= token < BYTE_OFFSET + 256:
    return f"BYTE_{token - BYTE_OFFSET}"
  return NAMES.get(token, f"INVALID_{token}")
