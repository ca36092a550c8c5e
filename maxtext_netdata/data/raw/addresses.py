"""Vectorized IPv4/IPv6 text → bytes for whole Arrow columns.

A column is dictionary-encoded (parquet stores it so, and it is read so), each dictionary
entry is parsed by the compiled `ip_text.parse` (exactly `socket.inet_pton`), and the bytes
are gathered by index. Nothing is kept between row groups: in a large dump a row group's
dictionary is nearly as long as the row group (every destination differs), so looking its
entries up among those seen before cost more than parsing them again (see `ip_text`).
Addresses are stored as 16 bytes per row; IPv4 uses the first 4.
"""

from __future__ import annotations

import socket

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from maxtext_netdata.data.raw import ip_text
from maxtext_netdata.errors import DataError

ADDRESS_BYTES = ip_text.ADDRESS_BYTES


def _as_string_array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
  """One string array, or a dictionary array of strings (kept: its dictionary is reused)."""
  if isinstance(column, pa.ChunkedArray):
    column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
  if pa.types.is_dictionary(column.type):
    value_type = column.type.value_type
    if pa.types.is_string(value_type):
      return column
    column = column.cast(value_type)
  if (
    pa.types.is_large_string(column.type)
    or pa.types.is_string_view(column.type)
    or pa.types.is_null(column.type)  # all null (pandas writes an all-None column so)
  ):
    column = column.cast(pa.string())
  return column


def parse_addresses(
  column: pa.Array | pa.ChunkedArray,
  versions: np.ndarray,
  *,
  source: str,
  column_name: str,
) -> tuple[np.ndarray, np.ndarray]:
  """Parse one address column against the rows' `ip_version`.

  Returns `(bytes [N, 16] uint8, bad [N] bool)`: `bad` marks unparsable text and addresses
  whose family differs from `versions`. Null and empty text give the all-zero address of the
  row's version. The caller decides whether a bad row is an error or is skipped;
  `first_bad_message` words the error.
  """
  array = _as_string_array(column)
  if pa.types.is_dictionary(array.type):
    encoded = array  # as read from parquet with `read_dictionary`: no re-encoding
  elif pa.types.is_string(array.type):
    encoded = pc.dictionary_encode(array)
  else:
    raise DataError(f"{source}: column {column_name!r} has type {array.type}, expected string")
  indices = encoded.indices
  indices = (indices.fill_null(-1) if indices.null_count else indices).to_numpy()
  # Row -1 (null) maps to an extra all-zero, either-version entry: the array's last.
  unique_bytes, unique_family = ip_text.parse(encoded.dictionary, spare=1)
  # A corrupted file can hold indices past its dictionary, which the parquet reader does not
  # check; the gather checks each index it reads.
  rows = ip_text.gather_rows(indices, unique_bytes, unique_family, versions)
  if rows is None:
    raise DataError(
      f"{source}: column {column_name!r} is corrupt: dictionary indices past its"
      f" {len(encoded.dictionary)} entries"
    )
  return rows


def first_bad_message(
  column: pa.Array | pa.ChunkedArray,
  versions: np.ndarray,
  bad: np.ndarray,
  *,
  source: str,
  column_name: str,
  row_offset: int = 0,
) -> str:
  """The error for the first bad row of `parse_addresses`: file, row, value and why."""
  row = int(np.flatnonzero(bad)[0])
  text = column[row].as_py()
  try:
    socket.inet_pton(socket.AF_INET6 if ":" in text else socket.AF_INET, text)
    why = f"is not an IPv{int(versions[row])} address (ip_version={int(versions[row])})"
  except (OSError, TypeError):
    why = "is not a valid IPv4 or IPv6 address"
  count = int(bad.sum())
  more = f" ({count} bad rows in this file)" if count > 1 else ""
  return f"{source}: row {row_offset + row}: {column_name}={text!r} {why}{more}"


def format_address(address: np.ndarray, version: int) -> str:
  """Text of a 16-byte stored address of `version` 4 or 6."""
  raw = bytes(np.asarray(address, dtype=np.uint8)[: 4 if version == 4 else 16])
  return socket.inet_ntop(socket.AF_INET if version == 4 else socket.AF_INET6, raw)
