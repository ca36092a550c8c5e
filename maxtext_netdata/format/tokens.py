"""The netdata-v1 vocabulary: token ids and per-measurement token counts.

Ids 0-266 are those of the original ping-LLM format; 267 is padding.
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
