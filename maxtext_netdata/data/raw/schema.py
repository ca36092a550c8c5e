"""The raw measurement schema (docs/spec.md §1): checking decoded parquet and turning it into numpy columns
(`validate_table`); files are read by `data.raw.reader`."""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from maxtext_netdata.data.raw import addresses
from maxtext_netdata.errors import DataError

REQUIRED_COLUMNS = ("event_time", "src_addr", "dst_addr", "ip_version", "rtt")
# How every reader of raw parquet opens a file (`data.raw.reader.open_parquet`): addresses
# stay dictionary-encoded as stored (`read_dictionary`), so each distinct text is parsed once;
# page checksums are verified where the writer stored them (`write_page_checksum`), which is
# what catches a flipped bit inside a value. A file without checksums reads as before.
ADDRESS_COLUMNS = ("src_addr", "dst_addr")
PARQUET_READ_OPTIONS = {"page_checksum_verification": True}
# String encodings Arrow's reader cannot decode into a dictionary ("Not yet implemented:
# DecodeArrow of DictAccumulator for DeltaByteArrayDecoder"): a column stored in one (DuckDB's
# and Spark's format 2 writers choose them) is read as plain strings.
NO_DICTIONARY_ENCODINGS = frozenset({"DELTA_BYTE_ARRAY", "DELTA_LENGTH_BYTE_ARRAY"})
_UNITS_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
# The times a row may have, in Unix seconds: from 1970-01-01 (the token format's seconds are
# unsigned) to 2106-02-07 06:28:15 UTC, the last a store's uint32 seconds keep (`data.store`).
LAST_SECOND = 2**32 - 1


@dataclasses.dataclass
class RawColumns:
  """Validated measurements: one entry per row, addresses as 16 bytes (IPv4 in the first 4)."""

  src: np.ndarray  # uint8 [N, 16]
  dst: np.ndarray  # uint8 [N, 16]
  version: np.ndarray  # uint8 [N], 4 or 6
  seconds: np.ndarray  # int64 [N], Unix seconds (UTC, floor)
  rtt: np.ndarray  # float64 [N], milliseconds; negative = failed
  src_text: pa.Array  # address text as stored (for the `hashed` field order)
  dst_text: pa.Array
  rows: np.ndarray  # int64 [N], row numbers in the source file

  def __len__(self) -> int:
    return len(self.rtt)

  def select(self, keep: np.ndarray) -> RawColumns:
    """The rows where `keep` (bool [N]) is true, in order."""
    mask = pa.array(keep)
    return RawColumns(
      src=self.src[keep],
      dst=self.dst[keep],
      version=self.version[keep],
      seconds=self.seconds[keep],
      rtt=self.rtt[keep],
      src_text=self.src_text.filter(mask),
      dst_text=self.dst_text.filter(mask),
      rows=self.rows[keep],
    )


def in_time(seconds: np.ndarray, since: int | None, until: int | None) -> np.ndarray:
  """bool [N]: whether each time (Unix seconds) is at or after `since` and before `until`
  (None: no bound), the window of `ingest --since/--until` and of `network_since` /
  `network_until`."""
  keep = np.ones(len(seconds), bool)
  if since is not None:
    keep &= seconds >= since
  if until is not None:
    keep &= seconds < until
  return keep


@dataclasses.dataclass
class SkipReport:
  """Rows dropped under `network_skip_bad_rows`, counted by reason."""

  reasons: Counter = dataclasses.field(default_factory=Counter)

  @property
  def total(self) -> int:
    return sum(self.reasons.values())

  def add(self, reason: str, count: int) -> None:
    if count:
      self.reasons[reason] += int(count)

  def merge(self, other: SkipReport) -> None:
    self.reasons.update(other.reasons)


def check_decoded(data: pa.Table | pa.RecordBatch, *, source: str, row_offset: int = 0) -> None:
  """Raise DataError naming `source` unless `data`, as decoded from parquet, is well-formed.

  The parquet reader trusts a file's bytes more than is safe: kept dictionary-encoded, a
  corrupted page yields indices past the end of the dictionary (read out of bounds later, or
  silently remapped when Arrow unifies dictionaries), and text may be invalid UTF-8. Arrow's
  full validation checks exactly these (index bounds, offsets, UTF-8 of the values and of
  the small dictionaries) at about 4 ns a row, so every table is checked before use.
  """
  try:
    data.validate(full=True)
  except pa.ArrowException as e:
    last = row_offset + data.num_rows - 1
    raise DataError(
      f"{source}: corrupt data in rows {row_offset}-{last} ({_one_line(e)})"
    ) from None


def _one_line(error: BaseException) -> str:
  return " ".join(str(error).split())


def check_schema(schema: pa.Schema, source: str) -> None:
  """Raise DataError if a required column is missing, named twice or of the wrong type."""
  missing = [c for c in REQUIRED_COLUMNS if c not in schema.names]
  if missing:
    raise DataError(
      f"{source}: missing column(s) {', '.join(missing)} (has: {', '.join(schema.names)})"
    )
  twice = [c for c in REQUIRED_COLUMNS if schema.names.count(c) > 1]
  if twice:
    raise DataError(f"{source}: column(s) {', '.join(twice)} named more than once")
  checks = {
    "event_time": (pa.types.is_timestamp, "timestamp"),
    "src_addr": (_is_text, "string"),
    "dst_addr": (_is_text, "string"),
    "ip_version": (pa.types.is_integer, "integer"),
    "rtt": (lambda t: pa.types.is_floating(t) or pa.types.is_integer(t), "floating"),
  }
  for name, (ok, expected) in checks.items():
    column_type = schema.field(name).type
    if not ok(column_type):
      if pa.types.is_dictionary(column_type):  # as the reader asks for addresses: the values'
        column_type = column_type.value_type
      raise DataError(f"{source}: column {name!r} has type {column_type}, expected {expected}")


def _is_text(t: pa.DataType) -> bool:
  """A string type, or null: a column whose every value is null (pandas writes an all-None
  column so), which an address column may be (docs/spec.md §1)."""
  if pa.types.is_dictionary(t):
    t = t.value_type
  return (
    pa.types.is_string(t)
    or pa.types.is_large_string(t)
    or pa.types.is_string_view(t)
    or pa.types.is_null(t)
  )


def _timestamp_seconds(column: pa.ChunkedArray) -> np.ndarray:
  unit = column.type.unit
  raw = pc.cast(column, pa.int64()).to_numpy(zero_copy_only=False)
  return np.floor_divide(raw, _UNITS_PER_SECOND[unit])


def validate_table(
  table: pa.Table,
  *,
  source: str,
  row_offset: int = 0,
  skip_bad: bool = False,
  decoded_checked: bool = False,
) -> tuple[RawColumns, SkipReport]:
  """Validate and convert one table (a file or a row group of one); `check_decoded` first.

  `decoded_checked`: the caller has already passed every piece of `table` through
  `check_decoded` and built `table` from those pieces only by means that keep it well-formed
  (`raw_reader` checks each decoded batch, then joins batches); the full validation is then
  not run a second time over the same bytes.
  """
  if not decoded_checked:
    check_decoded(table, source=source, row_offset=row_offset)
  report = SkipReport()
  n = table.num_rows
  rows = np.arange(row_offset, row_offset + n, dtype=np.int64)
  # (reason, bad rows, the error naming the first bad row), in the order a row's problems are
  # named: an error names the table's first bad row, by the first of its problems.
  problems: list[tuple[str, np.ndarray, Callable[[np.ndarray], str]]] = []

  def plain(reason: str, column_name: str) -> Callable[[np.ndarray], str]:
    return lambda bad: _row_message(
      source, row_offset, bad, table.column(column_name).to_pylist(), reason
    )

  time_col = table.column("event_time")
  if time_col.null_count:
    reason = "event_time is null"
    null = time_col.is_null().to_numpy(zero_copy_only=False)
    problems.append((reason, null, plain(reason, "event_time")))
  seconds = _timestamp_seconds(_filled(time_col, 0))
  reason = "event_time is before 1970 or after 2106-02-07 06:28:15 UTC"
  outside = (seconds < 0) | (seconds > LAST_SECOND)
  # The value in Unix seconds: such a time may be past what Python's datetime holds.
  problems.append(
    (
      reason,
      outside,
      lambda bad, reason=reason: _row_message(source, row_offset, bad, seconds.tolist(), reason),
    )
  )

  version = _filled(table.column("ip_version"), 0).to_numpy(zero_copy_only=False)
  version = version.astype(np.int64)
  reason = "ip_version is not 4 or 6"
  problems.append((reason, (version != 4) & (version != 6), plain(reason, "ip_version")))

  rtt_col = table.column("rtt")
  rtt = _filled(pc.cast(rtt_col, pa.float64()), np.nan).to_numpy(zero_copy_only=False)
  reason = "rtt is NaN, infinite or null"
  problems.append((reason, ~np.isfinite(rtt), plain(reason, "rtt")))

  parsed = {}
  for name in ("src_addr", "dst_addr"):
    column = table.column(name)
    parsed[name], bad = addresses.parse_addresses(column, version, source=source, column_name=name)
    message = functools.partial(
      addresses.first_bad_message,
      column,
      version,
      source=source,
      column_name=name,
      row_offset=row_offset,
    )
    problems.append((f"{name} unparsable or not matching ip_version", bad, message))

  if not skip_bad:  # the first bad row of the table, under its first problem
    found = [(int(np.argmax(bad)), k) for k, (_, bad, _) in enumerate(problems) if bad.any()]
    if found:
      _, k = min(found)
      raise DataError(problems[k][2](problems[k][1]))
  keep = np.ones(n, dtype=bool)
  for reason, bad, _ in problems:
    bad = bad & keep  # a row is counted under its first problem only
    if bad.any():
      report.add(reason, int(bad.sum()))
      keep &= ~bad

  src_text, dst_text = _text(table.column("src_addr")), _text(table.column("dst_addr"))
  if keep.all():  # the common case: no copies
    keep = slice(None)
  else:
    mask = pa.array(keep)
    src_text, dst_text = src_text.filter(mask), dst_text.filter(mask)
  columns = RawColumns(
    src=parsed["src_addr"][keep],
    dst=parsed["dst_addr"][keep],
    version=version[keep].astype(np.uint8),
    seconds=seconds[keep],
    rtt=rtt[keep],
    src_text=src_text,
    dst_text=dst_text,
    rows=rows[keep],
  )
  return columns, report


def _filled(column: pa.ChunkedArray, value) -> pa.ChunkedArray:
  """`column.fill_null(value)`; the column itself when it has no nulls (fill_null copies it)."""
  return column.fill_null(value) if column.null_count else column


def _text(column: pa.ChunkedArray) -> pa.Array:
  """The address text as one array; dictionary-encoded text stays so (not decoded per row)."""
  if pa.types.is_dictionary(column.type) and pa.types.is_string(column.type.value_type):
    return column.combine_chunks()
  return pc.cast(column, pa.string()).combine_chunks()


def _row_message(source: str, row_offset: int, bad: np.ndarray, values, reason: str) -> str:
  row = int(np.flatnonzero(bad)[0])
  value = f" (value {values[row]!r})" if len(values) > row else ""
  count = int(bad.sum())
  more = f"; {count} such rows in this file" if count > 1 else ""
  return f"{source}: row {row_offset + row}: {reason}{value}{more}"


def empty_columns(source: str) -> RawColumns:
  """The columns of no rows (a file without row groups)."""
  table = pa.table(
    {
      "event_time": pa.array([], pa.timestamp("s")),
      "src_addr": pa.array([], pa.string()),
      "dst_addr": pa.array([], pa.string()),
      "ip_version": pa.array([], pa.int8()),
      "rtt": pa.array([], pa.float64()),
    }
  )
  return validate_table(table, source=source)[0]


def concat_columns(parts: list[RawColumns]) -> RawColumns:
  """One RawColumns of several, in order."""
  if len(parts) == 1:
    return parts[0]
  return RawColumns(
    src=np.concatenate([p.src for p in parts]),
    dst=np.concatenate([p.dst for p in parts]),
    version=np.concatenate([p.version for p in parts]),
    seconds=np.concatenate([p.seconds for p in parts]),
    rtt=np.concatenate([p.rtt for p in parts]),
    src_text=pa.concat_arrays([p.src_text for p in parts]),
    dst_text=pa.concat_arrays([p.dst_text for p in parts]),
    rows=np.concatenate([p.rows for p in parts]),
  )
