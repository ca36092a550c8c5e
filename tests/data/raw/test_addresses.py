"""Vectorized address parsing: IPv4, IPv6, empty and null, invalid text, version mismatch."""

import ipaddress

import numpy as np
import pyarrow as pa
import pytest

from maxtext_netdata.data.raw import addresses, schema
from maxtext_netdata.errors import DataError


def _parse(texts, versions, column=None):
  column = pa.array(texts, pa.string()) if column is None else column
  return addresses.parse_addresses(
    column, np.asarray(versions), source="f.parquet", column_name="src_addr"
  )


def test_ipv4_and_ipv6_bytes():
  texts = [
    "192.0.2.1",
    "8.8.8.8",
    "2001:db8::1",
    "::",
    "::1",
    "FE80::1:2",
    "::ffff:1.2.3.4",
    "2a00:1450:4001:0829:0000:0000:0000:200e",
    "255.255.255.255",
  ]
  versions = [4, 4, 6, 6, 6, 6, 6, 6, 4]
  parsed, bad = _parse(texts, versions)
  assert parsed.dtype == np.uint8 and parsed.shape == (len(texts), 16)
  assert not bad.any()
  for row, text, version in zip(parsed, texts, versions, strict=True):
    packed = ipaddress.ip_address(text).packed
    assert bytes(row[: len(packed)]) == packed
    assert not row[len(packed) :].any()
    assert ipaddress.ip_address(addresses.format_address(row, version)).packed == packed


def test_empty_and_null_are_the_zero_address_of_either_version():
  parsed, bad = _parse(["", None, "", None], [4, 4, 6, 6])
  assert not bad.any() and not parsed.any()
  assert addresses.format_address(parsed[2], 6) == "::"
  assert addresses.format_address(parsed[0], 4) == "0.0.0.0"


@pytest.mark.parametrize(
  "text",
  [
    "1.2.3",
    "1.2.3.4.5",
    "256.1.1.1",
    "abc",
    "::g",
    "1.2.3.4/24",
    " 1.2.3.4",
    "2001:db8:::1",
    "01.2.3.4x",
  ],
)
def test_invalid_text_is_bad(text):
  _, bad = _parse(["10.0.0.1", text, "10.0.0.2"], [4, 4, 4])
  assert bad.tolist() == [False, True, False]


def test_version_mismatch_is_bad():
  _, bad = _parse(
    ["10.0.0.1", "2001:db8::1", "10.0.0.1", "::ffff:1.2.3.4", "2001:db8::1"], [6, 4, 4, 4, 6]
  )
  assert bad.tolist() == [True, True, False, True, False]


def test_arrow_column_kinds():
  texts = ["10.0.0.1", None, "2001:db8::1", "10.0.0.1"]
  versions = [4, 4, 6, 4]
  expected, _ = _parse(texts, versions)
  for column in (
    pa.chunked_array([pa.array(texts[:2]), pa.array(texts[2:])]),
    pa.array(texts, pa.large_string()),
    pa.array(texts).dictionary_encode(),
    pa.array(texts, pa.string_view()),
  ):
    parsed, bad = _parse(None, versions, column)
    assert not bad.any() and (parsed == expected).all()


def test_non_string_column_is_an_error():
  with pytest.raises(DataError, match="f.parquet: column 'src_addr' has type int64"):
    _parse(None, [4, 4], pa.array([1, 2]))


def test_first_bad_message_names_file_row_value_and_reason():
  column = pa.array(["10.0.0.1", "10.0.0.2", "nonsense", "2001:db8::1"])
  versions = np.array([4, 4, 4, 4])
  _, bad = addresses.parse_addresses(column, versions, source="f.parquet", column_name="dst_addr")
  message = addresses.first_bad_message(
    column, versions, bad, source="f.parquet", column_name="dst_addr", row_offset=1000
  )
  assert message == (
    "f.parquet: row 1002: dst_addr='nonsense' is not a valid IPv4 or IPv6 address"
    " (2 bad rows in this file)"
  )
  only_mismatch = bad & (np.arange(4) == 3)
  message = addresses.first_bad_message(
    column, versions, only_mismatch, source="f.parquet", column_name="dst_addr"
  )
  assert message == "f.parquet: row 3: dst_addr='2001:db8::1' is not an IPv4 address (ip_version=4)"


def test_many_rows_few_distinct():
  rng = np.random.default_rng(0)
  pool = [str(ipaddress.IPv4Address(int(x))) for x in rng.integers(0, 2**32, 50)]
  choice = rng.integers(0, 50, 100_000)
  parsed, bad = _parse([pool[i] for i in choice], np.full(100_000, 4))
  assert not bad.any()
  as_int = parsed[:, :4].astype(np.uint32)
  values = (as_int[:, 0] << 24) | (as_int[:, 1] << 16) | (as_int[:, 2] << 8) | as_int[:, 3]
  assert values.tolist() == [int(ipaddress.IPv4Address(pool[i])) for i in choice]


def test_dictionary_indices_past_the_dictionary_are_a_data_error():
  column = pa.DictionaryArray.from_arrays(
    pa.array([0, 1, 2], pa.int32()), pa.array(["192.0.2.1", "192.0.2.2"]), safe=False
  )
  with pytest.raises(DataError, match=r"f\.parquet: column 'src_addr' is corrupt"):
    addresses.parse_addresses(column, np.full(3, 4), source="f.parquet", column_name="src_addr")


def test_validate_table_rejects_dictionary_indices_past_the_dictionary():
  column = pa.DictionaryArray.from_arrays(
    pa.array([0, 7], pa.int32()), pa.array(["192.0.2.1", "192.0.2.2"]), safe=False
  )
  table = pa.table(
    {
      "event_time": pa.array([1, 2], pa.timestamp("s")),
      "src_addr": column,
      "dst_addr": pa.array(["192.0.2.9"] * 2),
      "ip_version": pa.array([4, 4], pa.int8()),
      "rtt": pa.array([1.0, 2.0]),
    }
  )
  with pytest.raises(DataError, match=r"f\.parquet: corrupt data in rows 10-11 .*out of bounds"):
    schema.validate_table(table, source="f.parquet", row_offset=10)
