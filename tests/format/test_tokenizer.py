"""The vectorized netdata-v1 tokenizer against docs/spec.md §2's golden vectors and a per-row oracle."""

import datetime
import ipaddress
import itertools
import socket

import numpy as np
import pyarrow as pa
import pytest

from maxtext_netdata.data.raw.addresses import parse_addresses
from maxtext_netdata.format import tokenizer
from maxtext_netdata.format import tokens as tk
from tests.helpers import reference_tokenizer as ref

JULY_1_2025 = int(datetime.datetime(2025, 7, 1, tzinfo=datetime.UTC).timestamp())
BLOCK_NAMES = [ref.SRC, ref.DST, ref.RESULT, ref.TIMESTAMP]
EDGE_RTTS = [
  0.0,
  -1.0,
  -0.001,
  1e-9,
  0.0005,
  0.3,
  2.047,
  2.048,
  2.0479999,
  4.096,
  50.0,
  250.7,
  300_000.0,
  4.0e9,
  1e15,
  1e30,
  1e306,  # times 1000 is past float64's largest: infinite microseconds
  1.7976931348623157e308,
]


def _addresses(texts, versions):
  column = pa.array(texts, pa.string())
  parsed, bad = parse_addresses(column, versions, source="test", column_name="addr")
  assert not bad.any()
  return parsed


def _encode_rows(src_text, dst_text, version, rtt, seconds, has_ts, starts, order):
  """Vectorized tokens of rows given as text, one list per measurement."""
  rtt_payload, failed = tokenizer.rtt_bytes(rtt)
  ts_kind, ts_value = tokenizer.timestamp_kinds(seconds, has_ts, starts)
  flat, offsets = tokenizer.encode(
    src=_addresses(src_text, version),
    dst=_addresses(dst_text, version),
    version=version,
    rtt_bytes=rtt_payload,
    failed=failed,
    ts_kind=ts_kind,
    ts_value=ts_value,
    order=order,
  )
  return [flat[a:b].tolist() for a, b in itertools.pairwise(offsets)]


def _random_rows(n, seed):
  """Random measurements with the edge cases of docs/spec.md §2 mixed in."""
  rng = np.random.default_rng(seed)
  version = np.where(rng.random(n) < 0.58, 4, 6).astype(np.uint8)
  special = {
    4: ["", None, "0.0.0.0", "255.255.255.255"],
    6: ["", None, "::", "::ffff:1.2.3.4", "2001:db8::1", "fe80::1"],
  }
  raw = rng.integers(0, 256, (n, 2, 16), dtype=np.uint8)
  use_special = rng.random((n, 2)) < 0.05
  special_pick = rng.integers(0, 12, (n, 2))
  src, dst = [], []
  for i, v in enumerate(version.tolist()):
    family, size = (socket.AF_INET, 4) if v == 4 else (socket.AF_INET6, 16)
    for column, c in ((src, 0), (dst, 1)):
      if use_special[i, c]:
        column.append(special[v][special_pick[i, c] % len(special[v])])
      else:
        column.append(socket.inet_ntop(family, raw[i, c, :size].tobytes()))
  rtt = rng.lognormal(3.5, 1.5, n)
  rtt[rng.random(n) < 0.1] = -1.0
  edge = rng.random(n) < 0.1
  rtt[edge] = rng.choice(EDGE_RTTS, edge.sum())
  steps = rng.choice([0, 1, 60, 255, 256, 300, 2**32 - 1, 2**32, 2**33, -5, -(10**6)], n)
  seconds = JULY_1_2025 + np.cumsum(steps)
  has_ts = rng.random(n) < 0.7
  starts = rng.random(n) < 0.05
  return src, dst, version, rtt, seconds.astype(np.int64), has_ts, starts, rng


def test_permutations_are_itertools_order():
  expected = list(itertools.permutations(range(4)))
  assert tokenizer.PERMUTATIONS.dtype == np.uint8
  assert [tuple(p) for p in tokenizer.PERMUTATIONS.tolist()] == expected
  assert tokenizer.PERMUTATIONS[0].tolist() == [
    tk.BLOCK_SRC,
    tk.BLOCK_DST,
    tk.BLOCK_RESULT,
    tk.BLOCK_TIMESTAMP,
  ]


@pytest.mark.parametrize(
  "rtt, expected",
  [(50.0, [8, 57, 37]), (0.3, [8, 12, 55]), (250.7, [8, 74, 177]), (0.0, [8, 11, 12])],
)
def test_rtt_golden(rtt, expected):
  payload, failed = tokenizer.rtt_bytes(np.array([rtt]))
  assert not failed[0]
  assert [tk.RTT_START] + (payload[0] + tk.BYTE_OFFSET).tolist() == expected


def test_rtt_matches_reference_and_flags_failures():
  rtt = np.concatenate([EDGE_RTTS, np.random.default_rng(1).lognormal(3, 3, 20_000)])
  payload, failed = tokenizer.rtt_bytes(rtt)
  for value, row, fail in zip(rtt.tolist(), payload.tolist(), failed.tolist(), strict=True):
    if value < 0:
      assert fail and row == [0, 0]
    else:
      assert not fail and ref.rtt_payload(value) == [tk.RTT_START] + [b + 11 for b in row]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_rtt_not_finite_is_an_error(bad):
  with pytest.raises(ValueError, match="index 1"):
    tokenizer.rtt_bytes(np.array([1.0, bad]))


def test_timestamp_golden():
  kind, value = tokenizer.timestamp_kinds([JULY_1_2025], [True], [True])
  assert kind.tolist() == [tk.TS_ABS] and value.tolist() == [JULY_1_2025]
  assert ref.timestamp_tokens("abs", JULY_1_2025) == [5, 11, 11, 11, 11, 115, 110, 48, 11]


def test_timestamp_kinds_deltas_and_segments():
  t0 = JULY_1_2025
  seconds = [t0, t0, t0 + 255, t0 + 511, t0 + 400, t0 + 2**33, 5, t0, t0 + 7]
  has_ts = [True, True, True, True, True, True, False, True, True]
  starts = [True, False, False, False, False, False, False, True, False]
  kind, value = tokenizer.timestamp_kinds(seconds, has_ts, starts)
  assert kind.tolist() == [
    tk.TS_ABS,
    tk.TS_DELTA1,
    tk.TS_DELTA1,
    tk.TS_DELTA4,
    tk.TS_DELTA1,
    tk.TS_DELTA4,
    tk.TS_NONE,
    tk.TS_ABS,
    tk.TS_DELTA1,
  ]
  assert value.tolist() == [t0, 0, 255, 256, 0, 2**32 - 1, 0, t0, 7]


def test_timestamp_delta_skips_untimestamped_rows():
  kind, value = tokenizer.timestamp_kinds(
    [100, 500, 130], [True, False, True], [True] * 1 + [False] * 2
  )
  assert kind.tolist() == [tk.TS_ABS, tk.TS_NONE, tk.TS_DELTA1]
  assert value.tolist() == [100, 0, 30]


def test_hashed_golden():
  tokens = _encode_rows(
    ["192.0.2.1"],
    ["8.8.8.8"],
    np.array([4], np.uint8),
    np.array([50.0]),
    np.array([JULY_1_2025]),
    [True],
    [True],
    tokenizer.hashed_orders(["192.0.2.1"], ["8.8.8.8"], [JULY_1_2025], [True]),
  )
  assert tokens == [
    [0, 1, 203, 11, 13, 12, 3, 19, 19, 19, 19, 8, 57, 37, 5, 11, 11, 11, 11, 115, 110, 48, 11]
  ]


@pytest.mark.parametrize(
  "version, failed, kind, expected",
  [
    (4, False, tk.TS_NONE, 14),
    (4, True, tk.TS_NONE, 12),
    (6, False, tk.TS_NONE, 38),
    (6, True, tk.TS_NONE, 36),
    (4, False, tk.TS_DELTA1, 16),
    (4, True, tk.TS_DELTA1, 14),
    (6, False, tk.TS_DELTA1, 40),
    (6, True, tk.TS_DELTA1, 38),
    (4, False, tk.TS_DELTA4, 19),
    (4, True, tk.TS_DELTA4, 17),
    (6, False, tk.TS_DELTA4, 43),
    (6, True, tk.TS_DELTA4, 41),
    (4, False, tk.TS_ABS, 23),
    (4, True, tk.TS_ABS, 21),
    (6, False, tk.TS_ABS, 47),
    (6, True, tk.TS_ABS, 45),
  ],
)
def test_measurement_lengths(version, failed, kind, expected):
  assert tokenizer.measurement_lengths(
    np.array([version]), np.array([failed]), np.array([kind])
  ).tolist() == [expected]
  for order in range(24):
    _, offsets = tokenizer.encode(
      src=np.zeros((1, 16), np.uint8),
      dst=np.zeros((1, 16), np.uint8),
      version=np.array([version], np.uint8),
      rtt_bytes=np.zeros((1, 2), np.uint8),
      failed=np.array([failed]),
      ts_kind=np.array([kind], np.uint8),
      ts_value=np.array([300]),
      order=np.array([order], np.uint8),
    )
    assert offsets.tolist() == [0, expected]


@pytest.mark.parametrize("field_order", ["fixed", "hashed", "random"])
def test_encode_matches_reference(field_order):
  n = 34_000  # x 3 field orders: > 100k measurements
  src, dst, version, rtt, seconds, has_ts, starts, rng = _random_rows(n, seed=len(field_order))
  if field_order == "fixed":
    order = np.zeros(n, np.uint8)
  elif field_order == "hashed":
    order = tokenizer.hashed_orders(pa.array(src, pa.string()), dst, seconds, has_ts)
  else:
    order = tokenizer.random_orders(rng.integers(0, 2**64, n, dtype=np.uint64))
  got = _encode_rows(src, dst, version, rtt, seconds, has_ts, starts, order)
  plan = ref.timestamp_plan(seconds.tolist(), has_ts.tolist(), starts.tolist())
  for i in range(n):
    if field_order == "hashed":
      names = ref.hashed_order(src[i], dst[i], int(seconds[i]), bool(has_ts[i]))
    else:
      names = [BLOCK_NAMES[b] for b in tokenizer.PERMUTATIONS[order[i]]]
    expected = ref.encode_measurement(
      src[i], dst[i], int(version[i]), float(rtt[i]), *plan[i], names
    )
    assert got[i] == expected, f"row {i}"
  assert len(set(order.tolist())) == (1 if field_order == "fixed" else 24)


def test_encode_into_buffer_leaves_gaps():
  src, dst, version, rtt, seconds, has_ts, starts, _ = _random_rows(500, seed=7)
  payload, failed = tokenizer.rtt_bytes(rtt)
  kind, value = tokenizer.timestamp_kinds(seconds, has_ts, starts)
  columns = dict(
    src=_addresses(src, version),
    dst=_addresses(dst, version),
    version=version,
    rtt_bytes=payload,
    failed=failed,
    ts_kind=kind,
    ts_value=value,
    order=tokenizer.random_orders(np.arange(500, dtype=np.uint64) * 7919),
  )
  flat, offsets = tokenizer.encode(**columns)
  lengths = tokenizer.measurement_lengths(version, failed, kind)
  assert np.diff(offsets).tolist() == lengths.tolist()
  gaps = np.arange(500) % 3
  positions = offsets[:-1] + np.cumsum(gaps)
  buffer = np.full(int(positions[-1] + lengths[-1] + 5), tk.PAD, np.int32)
  returned, returned_positions = tokenizer.encode(**columns, out=buffer, positions=positions)
  assert returned is buffer and returned_positions.tolist() == positions.tolist()
  inside = np.zeros(len(buffer), bool)
  for i in range(500):
    assert (
      buffer[positions[i] : positions[i] + lengths[i]].tolist()
      == flat[offsets[i] : offsets[i + 1]].tolist()
    )
    inside[positions[i] : positions[i] + lengths[i]] = True
  assert (buffer[~inside] == tk.PAD).all()
  assert len(tokenizer.decode(buffer)) == 500


def test_decode_roundtrip():
  src, dst, version, rtt, seconds, has_ts, starts, rng = _random_rows(5_000, seed=3)
  order = tokenizer.random_orders(rng.integers(0, 2**64, 5_000, dtype=np.uint64))
  got = _encode_rows(src, dst, version, rtt, seconds, has_ts, starts, order)
  stream = [t for measurement in got for t in measurement + [tk.PAD] * (len(measurement) % 2)]
  decoded = tokenizer.decode(np.array(stream))
  kinds, values = tokenizer.timestamp_kinds(seconds, has_ts, starts)
  assert len(decoded) == 5_000
  for i, m in enumerate(decoded):
    v = int(version[i])
    for key, text in (("src", src[i]), ("dst", dst[i])):
      canonical = text or ("0.0.0.0" if v == 4 else "::")
      assert ipaddress.ip_address(m[key]).packed == ipaddress.ip_address(canonical).packed
    assert m["ip_version"] == v and m["failed"] == (rtt[i] < 0)
    if rtt[i] >= 0 and rtt[i] < 2047 * 2**31 / 1000:
      true = max(float(rtt[i]), 0.001)
      assert abs(m["rtt_ms"] - true) <= max(0.001, true / 1024)
    assert [BLOCK_NAMES.index(b) for b in m["order"]] == [
      b
      for b in tokenizer.PERMUTATIONS[order[i]].tolist()
      if b != tk.BLOCK_TIMESTAMP or kinds[i] != tk.TS_NONE
    ]
    if kinds[i] == tk.TS_ABS:
      assert m["timestamp"] == values[i] and m["delta_s"] is None
    elif kinds[i] == tk.TS_NONE:
      assert m["timestamp"] is None and m["delta_s"] is None
    else:
      assert m["delta_s"] == values[i] and m["timestamp"] is None


@pytest.mark.parametrize(
  "stream, position",
  [
    ([0, 1, 11, 11, 267, 11, 3, 11, 11, 11, 11, 8, 11, 11], 4),  # PAD inside a block
    ([0, 1, 11, 11, 11, 11, 3, 11, 11, 11, 11, 267, 8, 11, 11], 0),  # PAD before the result
    ([0, 1, 11, 11, 11, 11, 8, 11, 11], 0),  # no destination block
    ([0, 1, 11, 11, 11, 11, 3, 11, 11, 11, 11, 8, 11], 13),  # truncated RTT
    ([0, 1, 11, 11, 11, 11, 1, 11, 11, 11, 11, 8, 11, 11], 6),  # two sources
    ([0, 1, 11, 11, 11, 3, 11, 11, 11, 11, 8, 11, 11], 5),  # short address
    ([12, 0, 1, 11, 11, 11, 11, 3, 11, 11, 11, 11, 10], 0),  # byte outside a measurement
    ([0, 1, 11, 11, 11, 11, 3, 11, 11, 11, 11, 9], 11),  # reserved THROUGHPUT_START
    ([0, 1, 11, 11, 11, 11, 3, 11, 11, 11, 11, 10, 300], 12),  # not a token id
  ],
)
def test_decode_malformed_names_position(stream, position):
  with pytest.raises(ValueError, match=f"token {position}:"):
    tokenizer.decode(stream)


def test_encode_rejects_bad_columns():
  columns = dict(
    src=np.zeros((2, 16), np.uint8),
    dst=np.zeros((2, 16), np.uint8),
    version=np.array([4, 5], np.uint8),
    rtt_bytes=np.zeros((2, 2), np.uint8),
    failed=np.zeros(2, bool),
    ts_kind=np.zeros(2, np.uint8),
    ts_value=np.zeros(2, np.int64),
    order=np.zeros(2, np.uint8),
  )
  with pytest.raises(ValueError, match="measurement 1: ip version 5"):
    tokenizer.encode(**columns)
  columns["version"] = np.array([4, 4], np.uint8)
  columns["order"] = np.array([0, 24], np.uint8)
  with pytest.raises(ValueError, match="measurement 1: .*field order 24"):
    tokenizer.encode(**columns)


def test_format_measurement_beyond_the_calendar():
  stream = [0, 1, 11, 11, 11, 11, 3, 11, 11, 11, 11, 10, 5] + [266] * 8
  assert tokenizer.format_measurement(tokenizer.decode(stream)[0]) == (
    f"0.0.0.0 -> 0.0.0.0 failed at {2**64 - 1} s [src,dst,result,timestamp]"
  )


def test_format_measurement():
  measurement = tokenizer.decode(
    [0, 1, 203, 11, 13, 12, 3, 19, 19, 19, 19, 8, 57, 37, 5, 11, 11, 11, 11, 115, 110, 48, 11]
  )[0]
  assert tokenizer.format_measurement(measurement) == (
    "192.0.2.1 -> 8.8.8.8 rtt 49.984 ms at 2025-07-01T00:00:00Z [src,dst,result,timestamp]"
  )


def test_empty_inputs():
  kind, value = tokenizer.timestamp_kinds([], [], [])
  payload, failed = tokenizer.rtt_bytes([])
  none = np.zeros(0, np.uint8)
  flat, offsets = tokenizer.encode(
    src=np.zeros((0, 16), np.uint8),
    dst=np.zeros((0, 16), np.uint8),
    version=none,
    rtt_bytes=payload,
    failed=failed,
    ts_kind=kind,
    ts_value=value,
    order=none,
  )
  assert flat.tolist() == [] and offsets.tolist() == [0]
  assert tokenizer.measurement_lengths([], [], []).tolist() == []
  assert tokenizer.decode([]) == [] and tokenizer.decode([tk.PAD] * 3) == []
  assert tokenizer.hashed_orders([], [], [], []).tolist() == []
