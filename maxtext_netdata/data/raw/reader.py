"""The one reader of raw parquet: footers and schemas first, then validated row batches.

`prepare` reads through `check_files` and `read_batches` (footers of every file before any
long work); `read_raw` and `iter_columns` are the same path for one file or folder at a time
(`tokenize`, tests, benchmarks).

Every file is opened through `data.remote` (local, `s3://`, `gs://`); the storage SDKs retry
what is transient, each ranged read on its own, so a read that fails part-way resumes inside
the SDK and what reaches this module is final: a one-line `DataError` naming the file and the
row where reading stopped. Corruption is caught here too: page checksums where the file
stores them and Arrow's full validation of every decoded batch (`schema.check_decoded`),
before dictionaries are unified.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from maxtext_netdata.data import remote
from maxtext_netdata.data.raw import schema
from maxtext_netdata.errors import DataError

BATCH_ROWS = 1 << 18  # rows validated at a time: bounds memory whatever the row-group size


@dataclasses.dataclass
class FileReport:
  """One file's rows read and skipped (by reason), and the first and last second of its valid
  rows (None without one): what a store keeps of each train file, so that a file can later
  be taken out of the store without reading it (`data.prepare.append`)."""

  rows_read: int = 0
  skipped: schema.SkipReport = dataclasses.field(default_factory=schema.SkipReport)
  first: int | None = None
  last: int | None = None

  def add(self, rows: int, skipped: schema.SkipReport, seconds) -> None:
    """Count a batch: `rows` read, `skipped`, the valid rows' `seconds`."""
    self.rows_read += rows
    self.skipped.merge(skipped)
    if len(seconds):
      low, high = int(seconds.min()), int(seconds.max())
      self.first = low if self.first is None else min(self.first, low)
      self.last = high if self.last is None else max(self.last, high)

  def to_json(self) -> list:
    return [self.rows_read, dict(sorted(self.skipped.reasons.items())), self.first, self.last]

  @classmethod
  def from_json(cls, value: list) -> FileReport:
    rows_read, skipped, first, last = value
    report = cls(rows_read=rows_read, first=first, last=last)
    for reason, count in skipped.items():
      report.skipped.add(reason, count)
    return report


@dataclasses.dataclass
class ReadReport:
  """Rows read and rows skipped (by reason) over some files, and each file's `FileReport`
  (by URI)."""

  rows_read: int = 0
  skipped: schema.SkipReport = dataclasses.field(default_factory=schema.SkipReport)
  files: dict[str, FileReport] = dataclasses.field(default_factory=dict)

  def add_file(self, uri: str, file: FileReport) -> None:
    """Count a whole file's report."""
    self.rows_read += file.rows_read
    self.skipped.merge(file.skipped)
    self.files[uri] = file


def one_line(error: BaseException) -> str:
  return " ".join(str(error).split())


def open_parquet(
  entry: remote.FileEntry, options: remote.StorageOptions, metadata=None
) -> pq.ParquetFile:
  """The parquet file of `entry`; with its `metadata` known, the footer is not read again.

  Its address columns are read as dictionaries (`schema.PARQUET_READ_OPTIONS`) where each is
  there once and no row group stores it in an encoding Arrow cannot decode into one
  (`schema.NO_DICTIONARY_ENCODINGS`)."""
  handle = remote.open_input_file(entry, options)
  try:
    if metadata is None:
      metadata = pq.read_metadata(handle)
    dictionary = _dictionary_columns(metadata) or None
    return pq.ParquetFile(
      handle, metadata=metadata, read_dictionary=dictionary, **schema.PARQUET_READ_OPTIONS
    )
  except (OSError, pa.ArrowException) as e:
    raise DataError(f"{entry.uri}: not a readable parquet file ({one_line(e)})") from None


def _dictionary_columns(metadata: pq.FileMetaData) -> list[str]:
  """The address columns of a file to read as dictionaries (`open_parquet`)."""
  paths = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
  out = []
  for name in schema.ADDRESS_COLUMNS:
    if paths.count(name) != 1:  # missing or twice: `schema.check_schema` says so
      continue
    k = paths.index(name)
    encodings = (
      set(metadata.row_group(g).column(k).encodings) for g in range(metadata.num_row_groups)
    )
    if not any(e & schema.NO_DICTIONARY_ENCODINGS for e in encodings):
      out.append(name)
  return out


def check_files(files, options) -> list:
  """The parquet footer of each file, every schema checked before any long work starts."""
  metadata = []
  for entry in files:
    parquet = open_parquet(entry, options)
    schema.check_schema(parquet.schema_arrow, entry.uri)
    metadata.append(parquet.metadata)
  return metadata


def _tables(entry: remote.FileEntry, metadata, options: remote.StorageOptions):
  """(table, first row number) of each batch of one file, one row group at a time."""
  parquet = open_parquet(entry, options, metadata)
  row = 0
  try:
    for group in range(metadata.num_row_groups):
      batches = parquet.iter_batches(
        batch_size=BATCH_ROWS, row_groups=[group], columns=list(schema.REQUIRED_COLUMNS)
      )
      for batch in batches:
        # Checked before `_coalesced` unifies dictionaries, which trusts their indices.
        schema.check_decoded(batch, source=entry.uri, row_offset=row)
        yield pa.Table.from_batches([batch]), row
        row += batch.num_rows
  except OSError as e:
    raise DataError(f"{entry.uri}: read failed at row {row}: {one_line(e)}") from None
  except pa.ArrowException as e:
    raise DataError(f"{entry.uri}: corrupt parquet data at row {row} ({one_line(e)})") from None


def _coalesced(tables):
  """(table, first row) of about `BATCH_ROWS` rows each, joined from consecutive tables.

  Each parquet row group comes with its own dictionaries; joining small row groups keeps the
  fixed cost per table off files written with small row groups. Dictionaries are joined by
  concatenation (`_joined`), not unified: unifying hashed every entry of every dictionary,
  which at 200M rows (row groups of 32k rows with ~25k distinct destinations) cost more
  than all the reading.
  """
  pending, pending_rows, first = [], 0, 0
  for table, first_row in tables:
    if not pending:
      first = first_row
    pending.append(table)
    pending_rows += table.num_rows
    if pending_rows >= BATCH_ROWS:
      yield _joined(pending), first
      pending, pending_rows = [], 0
  if pending:
    yield _joined(pending), first


def _joined(tables: list[pa.Table]) -> pa.Table:
  """The rows of `tables` as one table of one chunk per column; a dictionary column's
  dictionary is the tables' dictionaries one after another (entries may repeat)."""
  if len(tables) == 1:
    return tables[0].combine_chunks()
  columns = []
  for name in tables[0].column_names:
    chunks = [chunk for table in tables for chunk in table.column(name).chunks]
    if pa.types.is_dictionary(chunks[0].type):
      offset, indices = 0, []
      for chunk in chunks:
        indices.append(pc.add(chunk.indices.cast(pa.int32()), pa.scalar(offset, pa.int32())))
        offset += len(chunk.dictionary)
      columns.append(
        pa.DictionaryArray.from_arrays(
          pa.concat_arrays(indices), pa.concat_arrays([c.dictionary for c in chunks])
        )
      )
    else:
      columns.append(pa.concat_arrays(chunks))
  return pa.table(columns, names=tables[0].column_names)


def read_batches(
  entry: remote.FileEntry, metadata, options: remote.StorageOptions, *, skip_bad: bool
) -> Iterator[tuple[schema.RawColumns, schema.SkipReport, int]]:
  """(valid columns, skipped rows, rows read) of each batch of about `BATCH_ROWS` rows of one
  file, in file order; `metadata` is its footer from `check_files`."""
  for table, first_row in _coalesced(_tables(entry, metadata, options)):
    # Every batch of `table` passed `check_decoded` in `_tables`, and `_joined` keeps
    # indices within the joined dictionary, so the joined table is not validated again.
    columns, skipped = schema.validate_table(
      table, source=entry.uri, row_offset=first_row, skip_bad=skip_bad, decoded_checked=True
    )
    yield columns, skipped, table.num_rows


def iter_columns(
  path: str, options: remote.StorageOptions | None = None, *, skip_bad: bool = False
) -> Iterator[tuple[schema.RawColumns, schema.SkipReport]]:
  """Valid columns and skipped rows of each batch of `path` (a file, a folder of parquet or a
  glob; local, `gs://` or `s3://`), file after file."""
  options = options or remote.StorageOptions()
  files = remote.expand(path, options)
  for entry, metadata in zip(files, check_files(files, options), strict=True):
    for columns, skipped, _ in read_batches(entry, metadata, options, skip_bad=skip_bad):
      yield columns, skipped


def read_raw(
  path: str, options: remote.StorageOptions | None = None, *, skip_bad: bool = False
) -> tuple[schema.RawColumns, schema.SkipReport]:
  """All valid columns of `path` (as `iter_columns`) and the rows skipped."""
  report, parts = schema.SkipReport(), []
  for columns, skipped in iter_columns(path, options, skip_bad=skip_bad):
    parts.append(columns)
    report.merge(skipped)
  return (schema.concat_columns(parts) if parts else schema.empty_columns(path)), report
