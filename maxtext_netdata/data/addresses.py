"""Vectorized IPv4/IPv6 text → bytes for whole Arrow columns.

Ping dumps repeat few addresses over many rows (~175k distinct in 200M rows), so a column is
dictionary-encoded, each distinct text is parsed once with `socket.inet_pton`, and the bytes
are gathered by index. Addresses are stored as 16 bytes per row; IPv4 uses the first 4.
"""

from __future__ import annotations

import socket

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from maxtext_netdata.errors import DataError

ADDRESS_BYTES = 16


def _parse_one(text: str | None) -> tuple[bytes, int]:
  """(16 bytes, family: 4, 6, 0 if unparsable, -1 if empty) of one address text."""
  if not text:
    return bytes(16), -1  # empty: valid for either version, all-zero address
  # The family is told by the text's shape; IPv4-in-IPv6 ("::ffff:1.2.3.4") has a colon.
  try:
    if ":" in text:
      return socket.inet_pton(socket.AF_INET6, text), 6
    return socket.inet_pton(socket.AF_INET, text) + bytes(12), 4
  except (OSError, ValueError):
    return bytes(16), 0


def _parse_unique(texts: list[str | None]) -> tuple[np.ndarray, np.ndarray]:
  """Bytes [U, 16] and family [U] (4, 6, 0 for unparsable, -1 for empty) of address texts."""
  parsed = [_parse_one(text) for text in texts]
  out = np.frombuffer(b"".join(p[0] for p in parsed), dtype=np.uint8)
  return out.reshape(len(texts), ADDRESS_BYTES).copy(), np.array([p[1] for p in parsed], np.int8)


class _ParsedAddresses:
  """Addresses parsed so far in this process, looked up by Arrow's hash join.

  A dump's few distinct addresses (~175k in 200M rows) recur in every row group, so each is
  parsed once; a row group's dictionary is then matched in C++, not Python per entry. Reset
  when it holds `limit` addresses, which bounds its memory.
  """

  def __init__(self, limit: int = 1_000_000):
    self.limit = limit
    self.texts = pa.array([], pa.string())
    self.bytes = np.zeros((0, ADDRESS_BYTES), np.uint8)
    self.family = np.zeros(0, np.int8)

  def lookup(self, dictionary: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Bytes [U, 16] and family [U] of each entry of a string array (nulls as empty)."""
    dictionary = dictionary.fill_null("")
    found = pc.index_in(dictionary, value_set=self.texts)
    if found.null_count:
      if len(self.texts) + found.null_count > self.limit:
        self.__init__(self.limit)
        return self.lookup(dictionary)
      new = pc.unique(dictionary.filter(found.is_null()))
      new_bytes, new_family = _parse_unique(new.to_pylist())
      known = len(self.texts)
      self.texts = pa.concat_arrays([self.texts, new])
      self.bytes = np.concatenate([self.bytes, new_bytes])
      self.family = np.concatenate([self.family, new_family])
      # Only the new texts are matched again, not every known one.
      found = pc.coalesce(found, pc.add(pc.index_in(dictionary, value_set=new), known))
    index = found.to_numpy(zero_copy_only=False)
    return self.bytes[index], self.family[index]


# One cache per column: sources and destinations are mostly different addresses, and each
# lookup hashes all of its cache's texts (Arrow's `index_in` builds its set on every call).
_PARSED: dict[str, _ParsedAddresses] = {}


def _as_string_array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
  """One string array, or a dictionary array of strings (kept: its dictionary is reused)."""
  if isinstance(column, pa.ChunkedArray):
    column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
  if pa.types.is_dictionary(column.type):
    value_type = column.type.value_type
    if pa.types.is_string(value_type):
      return column
    column = column.cast(value_type)
  if pa.types.is_large_string(column.type) or pa.types.is_string_view(column.type):
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
  indices = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
  # A corrupted file can hold indices past its dictionary, which the parquet reader does not
  # check; two reductions here cost far less than the gather they protect.
  if len(indices) and (indices.min() < -1 or indices.max() >= len(encoded.dictionary)):
    raise DataError(
      f"{source}: column {column_name!r} is corrupt: dictionary indices past its"
      f" {len(encoded.dictionary)} entries"
    )
  parsed = _PARSED.setdefault(column_name, _ParsedAddresses())
  unique_bytes, unique_family = parsed.lookup(encoded.dictionary)
  # Row -1 (null) maps to an extra all-zero, either-version entry.
  unique_bytes = np.concatenate([unique_bytes, np.zeros((1, ADDRESS_BYTES), np.uint8)])
  unique_family = np.concatenate([unique_family, np.array([-1], np.int8)])
  # Whole 16-byte rows as two words: numpy gathers 2-D uint8 rows byte by byte, far slower.
  row_bytes = np.take(unique_bytes.view(np.uint64), indices, axis=0).view(np.uint8)
  row_family = unique_family[indices]
  bad = (row_family == 0) | ((row_family > 0) & (row_family != versions))
  return row_bytes, bad


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
