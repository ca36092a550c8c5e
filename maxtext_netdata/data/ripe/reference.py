"""RIPE Atlas ping results (JSON) → raw measurement rows (docs/spec.md §1), one block at a time.

The hot path hands a block of newline-delimited results to DuckDB's JSON reader (yyjson
inside) with explicit column types (`RESULT_SCHEMA`: only the fields the mapping needs; the
rest are skipped) and maps the resulting Arrow columns with Arrow compute and numpy: the
`result` lists are exploded with `list_flatten` / `list_parent_indices`, one row per packet.
No Python code runs per result there. DuckDB's reader is kept over pyarrow's (the first one
used) because it reads these results 1.3-1.8x as fast per core and casts as the old
firmware needs: numbers written as strings (firmware 0: `"avg": "58.042"`) become numbers.
Its casts are the mapping's (docs/data_format.md): a float where an integer belongs is
rounded to the nearest, `true`/`false` are 1/0, a number or object where text belongs is
its JSON text; a value it cannot cast (`"msm_id": "x"`) rejects the block.

A rejected block (a line that is not JSON, a value that cannot be cast, a `result` that is
not a list, as other result types have) is read again by halves until each rejected piece
is one line (`_by_halves`): every line that is kept is read by the same reader with the
same casts, so both paths give the same rows, and each bad line is found with its number.

JSON arrays (the results API's default format) are turned into the same newline-delimited
blocks by `json_array.ArrayToLines`.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
import threading
from typing import NamedTuple

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from maxtext_netdata.data.raw import addresses, ip_text
from maxtext_netdata.data.raw.layout import FAILED_RTT
from maxtext_netdata.data.ripe.sample import Sample
from maxtext_netdata.data.ripe.scanner import json_scan
from maxtext_netdata.data.ripe.scanner.kernel import FIRST_SECOND, LAST_SECOND
from maxtext_netdata.errors import DataError

# Timeouts (`x`) and errors only lack `rtt`; a duplicate is any packet whose `dup` is set.
_PACKET = pa.struct([("rtt", pa.float64()), ("dup", pa.int64())])
RESULT_SCHEMA = pa.schema(
  [
    ("type", pa.string()),
    ("msm_id", pa.int64()),
    ("prb_id", pa.int64()),
    ("timestamp", pa.int64()),
    ("af", pa.int64()),
    ("from", pa.string()),
    ("src_addr", pa.string()),
    ("dst_addr", pa.string()),
    ("addr", pa.string()),
    ("result", pa.list_(_PACKET)),
    ("avg", pa.float64()),
    ("rcvd", pa.int64()),
  ]
)
ROW_SCHEMA = pa.schema(
  [
    ("msm_id", pa.int64()),
    ("event_time", pa.timestamp("s", tz="UTC")),
    ("src_addr", pa.string()),
    ("dst_addr", pa.string()),
    ("ip_version", pa.int64()),
    ("rtt", pa.float64()),
    ("prb_id", pa.int64()),
  ]
)
_DUCKDB_TYPES = {pa.string(): "VARCHAR", pa.int64(): "BIGINT", pa.float64(): "DOUBLE"}
_DUCKDB_COLUMNS = {
  f.name: _DUCKDB_TYPES.get(f.type, "STRUCT(rtt DOUBLE, dup BIGINT)[]") for f in RESULT_SCHEMA
}
# One thread: a block read from memory is not split between DuckDB's threads, and a second
# thread measured 0.5M results/s per core against 0.7M for one.
_THREADS = 1
_local = threading.local()  # a DuckDB connection per thread, made on first use
_NULL_INT = pa.scalar(None, pa.int64())
# Nesting a line may have: Python's `json` (the screen of doubtful lines) raises
# RecursionError near 1,500 levels, DuckDB's reader has no limit; results nest 4 deep.
MAX_NESTING = 512
# A JSON string, escapes included; written as runs of plain characters between escapes: one
# alternation a character took 1.2 s and ~570 MB of the regex engine's stack for a 5 MB string.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_OPENING, _CLOSING = np.frombuffer(b"[{", np.uint8), np.frombuffer(b"]}", np.uint8)
_DUPLICATE_KEY = re.compile(r'has duplicate key "(.*)"')


@dataclasses.dataclass
class Counts:
  """What a run has seen so far."""

  results: int = 0  # JSON objects read, of any type
  rows: int = 0
  other_types: int = 0
  duplicates: int = 0  # of the results kept
  bad_lines: int = 0
  kept: int = 0  # ping results that gave their rows (none for an empty `result` list)
  left_out: int = 0  # usable ping results outside the `ingest` sample


class Block(NamedTuple):
  """Newline-delimited results of one input; `first_line` (1-based) is the first's line."""

  data: bytes | bytearray | pa.Buffer
  first_line: int
  newlines: int
  unit: str  # "line", or "array element" for a JSON array


def count_newlines(data: bytes | bytearray) -> int:
  # numpy counts a byte ~3x faster than bytes.count (15 ms for 16 MB); a slice at a time keeps
  # its mask in cache instead of a fresh 16 MB array.
  raw, step = np.frombuffer(data, np.uint8), 1 << 18
  return sum(int(np.count_nonzero(raw[i : i + step] == 10)) for i in range(0, len(raw), step))


class BadLine(DataError):
  """A line that is not a ping result the mapping can use; `line` is 1-based."""

  def __init__(self, path: str, unit: str, line: int, reason: str):
    super().__init__(f"{path}: {unit} {line}: {reason}")
    self.line = line


def _nonempty(column) -> pa.Array:
  return pc.fill_null(pc.not_equal(column, ""), False)


def _version_of(address) -> pa.Array:
  """6 for text with a colon, 4 for text with a dot, else null."""
  six = pc.if_else(pc.match_substring(address, ":"), 6, _NULL_INT)
  return pc.if_else(pc.match_substring(address, "."), pc.coalesce(six, 4), six)


def _address_problem(name: str, text: str | None, version: int) -> str | None:
  """Why address `text` of field `name` cannot be a row's of `version`, or None."""
  if not text:
    return None
  family = int(ip_text.parse(pa.array([text]))[1][0])
  if family == ip_text.INVALID:
    return f"{name}={text!r} is not an IPv4 or IPv6 address"
  if family != version:
    return f"{name}={text!r} is not an IPv{version} address (ip_version {version})"
  return None


def _problem(batch: pa.RecordBatch, i: int) -> str:
  """Why row `i` of a results batch cannot become rows (for the error message only: what
  decides is `map_batch`)."""
  row = batch.slice(i, 1).to_pylist()[0]
  missing = [k for k in ("msm_id", "timestamp") if row[k] is None]
  if row["af"] not in (None, 4, 6):
    return f"af is {row['af']}, expected 4 or 6"
  if row["af"] is None and not any(row[k] for k in ("dst_addr", "addr", "from", "src_addr")):
    missing.append("af (or an address)")
  if row["result"] is None and row["avg"] is None and row["rcvd"] != 0:
    missing.append("result (or avg)")
  if missing:
    return "not a usable ping result: no " + ", ".join(missing)
  if not FIRST_SECOND <= row["timestamp"] <= LAST_SECOND:
    return (
      f"timestamp {row['timestamp']} is not from {FIRST_SECOND} to {LAST_SECOND} (1970 to 2106)"
    )
  for k, packet in enumerate(row["result"] or [], 1):
    if packet is None:
      return f"packet {k} of the result is null, not an object"
    if packet["dup"] is None and packet["rtt"] is not None and not math.isfinite(packet["rtt"]):
      return f"packet {k}: rtt is {packet['rtt']}, not a finite number"
  avg = row["avg"]
  if row["result"] is None and row["rcvd"] != 0 and avg != FAILED_RTT and not math.isfinite(avg):
    return f"avg is {avg}, not a finite number"
  src = "from" if row["from"] else "src_addr"
  dst = "dst_addr" if row["dst_addr"] or not row["addr"] else "addr"
  version = row["af"] or _form_of(row[dst]) or _form_of(row[src])
  for name in (src, dst):
    problem = _address_problem(name, row[name], version)
    if problem:
      return problem
  return "unusable result"


def _form_of(address: str | None) -> int | None:
  """`_version_of` of one text."""
  if not address:
    return None
  return 6 if ":" in address else 4 if "." in address else None


def addresses_fit(address: pa.Array, version: np.ndarray) -> np.ndarray:
  """bool per entry: `address` is null, empty, or an address of `version` (what `prepare`
  accepts, checked by its own parser)."""
  return ~addresses.parse_addresses(address, version, source="ingest", column_name="address")[1]


def map_batch(
  batch: pa.RecordBatch, counts: Counts, sample: Sample | None = None
) -> tuple[pa.Table, np.ndarray]:
  """Rows (ROW_SCHEMA, in result order) of one batch of RESULT_SCHEMA, and its bad rows.

  A result is bad (docs/data_format.md) when it lacks what a row needs, or when a row of it
  would be one `prepare` refuses: a timestamp outside FIRST_SECOND..LAST_SECOND, a packet
  that is null or whose rtt is not finite (NaN, infinite: a duplicate's does not count), a
  non-finite `avg` that is used, or an address that is not one of the result's version.
  A usable result outside `sample` gives no row and is counted as left out. Counts results,
  other types, duplicates, results kept and left out into `counts` (rows and bad lines are
  the caller's: it decides whether bad rows are an error).
  """
  counts.results += batch.num_rows
  other = pc.fill_null(pc.not_equal(batch.column("type"), "ping"), False).to_numpy(
    zero_copy_only=False
  )
  counts.other_types += int(other.sum())
  dst = batch.column("dst_addr")
  dst = pc.if_else(
    _nonempty(dst), dst, pc.if_else(_nonempty(batch.column("addr")), batch.column("addr"), dst)
  )
  src = pc.if_else(_nonempty(batch.column("from")), batch.column("from"), batch.column("src_addr"))
  af = batch.column("af")
  version = pc.coalesce(af, _version_of(dst), _version_of(src))
  avg, rcvd = batch.column("avg"), batch.column("rcvd")
  failed_old = pc.or_(
    pc.fill_null(pc.equal(rcvd, 0), False), pc.fill_null(pc.equal(avg, -1.0), False)
  )
  old_rtt = pc.if_else(failed_old, FAILED_RTT, avg)
  packets = batch.column("result")
  has_list = packets.is_valid().to_numpy(zero_copy_only=False)
  timestamp = batch.column("timestamp")
  in_time = pc.and_(
    pc.greater_equal(timestamp, FIRST_SECOND), pc.less_equal(timestamp, LAST_SECOND)
  )
  flat = pc.list_flatten(packets)
  parent = pc.list_parent_indices(packets).to_numpy()
  dup = pc.struct_field(flat, "dup").is_valid().to_numpy(zero_copy_only=False)
  rtt = pc.fill_null(pc.struct_field(flat, "rtt"), FAILED_RTT).to_numpy()
  unusable_packet = flat.is_null().to_numpy(zero_copy_only=False) | (~dup & ~np.isfinite(rtt))
  old_values = pc.fill_null(old_rtt, FAILED_RTT).to_numpy()
  versions = pc.fill_null(version, 0).to_numpy()
  usable = (
    batch.column("msm_id").is_valid().to_numpy(zero_copy_only=False)
    & pc.fill_null(in_time, False).to_numpy(zero_copy_only=False)
    & pc.fill_null(pc.is_in(version, pa.array([4, 6])), False).to_numpy(zero_copy_only=False)
    & (has_list | old_rtt.is_valid().to_numpy(zero_copy_only=False))
    & (np.bincount(parent[unusable_packet], minlength=batch.num_rows) == 0)
    & (has_list | np.isfinite(old_values))
    & addresses_fit(src, versions)
    & addresses_fit(dst, versions)
  )
  bad = np.flatnonzero(~other & ~usable)
  good = ~other & usable
  if sample is not None:
    seconds = pc.fill_null(timestamp, 0).to_numpy()
    outside = good & ~sample.keeps(src, versions, seconds)
    counts.left_out += int(outside.sum())
    good &= ~outside
  counts.kept += int(good.sum())

  take = good[parent]
  counts.duplicates += int((take & dup).sum())
  take &= ~dup
  old = np.flatnonzero(good & ~has_list)
  index = np.concatenate([parent[take], old])
  values = np.concatenate([rtt[take], old_values[old]])
  order = np.argsort(index, kind="stable")
  index, values = pa.array(index[order]), values[order]
  table = pa.table(
    [
      batch.column("msm_id").take(index),
      pc.cast(timestamp.take(index), ROW_SCHEMA.field("event_time").type),
      src.take(index),
      dst.take(index),
      version.take(index),
      pa.array(values, pa.float64()),
      batch.column("prb_id").take(index),
    ],
    schema=ROW_SCHEMA,
  )
  return table, bad


def _read(data: bytes) -> pa.Table:
  """RESULT_SCHEMA table of newline-delimited results; duckdb.Error if any line is unusable."""
  connection = getattr(_local, "connection", None)
  if connection is None:
    connection = _local.connection = duckdb.connect(config={"threads": _THREADS})
  relation = connection.read_json(
    io.BytesIO(data), columns=_DUCKDB_COLUMNS, format="newline_delimited"
  )
  return relation.to_arrow_table().cast(RESULT_SCHEMA)


def _reason(error: duckdb.Error) -> str:
  """Why DuckDB's reader rejected a line that `json.loads` reads as an object: a value it
  cannot cast, a needed key twice, or text its parser refuses (a lone surrogate)."""
  message = str(error).split("\n")[0]
  detail = message.split(": ", 2)[-1].strip() if "in line" in message else message
  duplicate = _DUPLICATE_KEY.search(detail)
  if duplicate:
    return f"duplicate key {duplicate.group(1)!r}"
  if "Malformed JSON" in message:
    return f"not JSON ({detail.rstrip('.')})"
  return f"a field has an unusable value ({detail})"


def _by_halves(data: bytes, first_only: bool) -> tuple[pa.Table, list[int], list[tuple[int, str]]]:
  """(results, their 0-based lines, [(line, reason)] of lines that are not results).

  Lines that are not JSON objects, and results of other types, are told by `json.loads`.
  The rest is read again in halves, recursively, until each rejected piece is one line:
  the lines that are kept are read by the same reader with the same casts as the fast path,
  so both paths give the same rows. One bad line in a block costs about two more reads of
  the block; each line whose value cannot be cast costs a few small reads (~3 ms each).
  `first_only` stops at the first bad line.
  """
  raw = data.split(b"\n")
  tables, lines, bad, found = [], [], [], []

  def visit(indices: list[int]) -> None:
    if first_only and found:
      return
    try:
      table = _read(b"\n".join(raw[i] for i in indices) + b"\n")
    except duckdb.Error as e:
      if len(indices) == 1:
        found.append((indices[0], _reason(e)))
        return
      table = None
    if table is not None and table.num_rows == len(indices):
      tables.append(table)
      lines.extend(indices)
      return
    if len(indices) == 1:  # no error, yet not one result: cannot be mapped to its line
      found.append((indices[0], "not one JSON object"))
      return
    half = len(indices) // 2
    visit(indices[:half])
    visit(indices[half:])

  todo, others = [], []
  for i, line in enumerate(raw):
    if not line.strip():
      continue
    # json.loads first (~10 us a line, on rejected blocks only): lines that are not JSON
    # objects and results of other types then cost no read, so a block of them stays linear.
    reason, kind = _screen(line)
    if reason is not None:
      bad.append((i, reason))
    elif kind is not None:
      others.append({"type": kind})
      lines.append(i)
    else:
      todo.append(i)
  if others:
    tables.append(pa.Table.from_pylist(others, schema=RESULT_SCHEMA))
  if first_only and bad:  # only lines before the first bad one can hold an earlier one
    todo, bad = [i for i in todo if i < bad[0][0]], bad[:1]
  if todo:
    visit(todo)
  results = pa.concat_tables(tables).combine_chunks() if tables else RESULT_SCHEMA.empty_table()
  bad = sorted(bad + found)
  return results, lines, bad[:1] if first_only else bad


def _nesting(line: bytes) -> int:
  """How deep the arrays and objects of `line` nest (brackets in strings do not count)."""
  codes = np.frombuffer(_STRING.sub(b"", line), np.uint8)
  steps = np.isin(codes, _OPENING).astype(np.int64) - np.isin(codes, _CLOSING)
  return int(np.cumsum(steps).max(initial=0))


def _json_kind(value) -> str:
  if value is None or isinstance(value, bool):
    return json.dumps(value)
  return {str: "a string", list: "an array"}.get(type(value), "a number")


def _screen(line: bytes) -> tuple[str | None, str | None]:
  """(why `line` is not a JSON object, else None; its `type` when not ping, else None)."""
  if _nesting(line) > MAX_NESTING:
    return f"nested deeper than {MAX_NESTING} levels", None
  try:
    value = json.loads(line)
  except ValueError:
    return "not JSON", None
  if not isinstance(value, dict):
    return f"not a JSON object ({_json_kind(value)})", None
  kind = value.get("type")
  return None, None if kind in (None, "ping") else str(kind)


def _row_lines(data: bytes) -> list[int]:
  """0-based line of each result of a block read whole (blank lines hold none)."""
  return [i for i, line in enumerate(data.split(b"\n")) if line.strip()]


def _screen_refuses_a_line(data: bytes) -> bool:
  """Whether `_screen` refuses a line of `data` that DuckDB's reader may still take.

  DuckDB's reader also takes a comma before a closing bracket, `inf`/`nan` in any case, and
  `null` as a row of nulls, which `_screen` (`json.loads`) calls not JSON or not an object.
  Read whole, such a line would be a result; read by halves, a bad line that is none: the
  same line would be judged by the lines around it. Lines of one object in `json_scan`'s
  strict grammar are objects to both (one compiled pass); only the others are screened.
  """
  ended = data if data.endswith(b"\n") else data + b"\n"
  buf = np.frombuffer(ended, np.uint8)
  buf.flags.writeable = False  # the variant the ingest scanner's blocks compile
  doubtful = np.flatnonzero(~json_scan.object_lines(buf))
  if not len(doubtful):
    return False
  lines = ended.split(b"\n")
  return any(_screen(lines[i])[0] is not None for i in doubtful.tolist())


def rows_of_block(
  block: Block, path: str, counts: Counts, skip_bad: bool, sample: Sample | None = None
) -> pa.Table:
  """Rows of a block of newline-delimited results, of the results in `sample` if given.

  A bad line raises BadLine naming `path` and the line, or with `skip_bad` is counted and
  dropped.
  """
  data, first_line, unit = block.data, block.first_line, block.unit
  if not isinstance(data, bytes | bytearray):  # an Arrow buffer read straight from a file
    data = bytes(memoryview(data))
  results = None
  if not _screen_refuses_a_line(data):
    try:
      results, lines, bad_lines = _read(data), None, []
      if results.num_rows != block.newlines + (not data.endswith(b"\n")):
        lines = _row_lines(data)  # blank lines
        if results.num_rows != len(lines):
          results = None  # a line is not one JSON object
    except duckdb.Error:
      results = None
  if results is None:
    results, lines, bad_lines = _by_halves(data, first_only=not skip_bad)
  counts.bad_lines += len(bad_lines)
  tables, done = [], 0
  for batch in results.to_batches():
    table, bad = map_batch(batch, counts, sample)
    if len(bad):
      if lines is None:
        lines = _row_lines(data)
      if not skip_bad:  # an unusable result before the first line that is not one
        line = lines[done + bad[0]]
        if not bad_lines or line < bad_lines[0][0]:
          raise BadLine(path, unit, first_line + line, _problem(batch, bad[0]))
      counts.bad_lines += len(bad)
    done += batch.num_rows
    tables.append(table)
  if bad_lines and not skip_bad:
    line, reason = bad_lines[0]
    raise BadLine(path, unit, first_line + line, reason)
  table = pa.concat_tables(tables) if tables else ROW_SCHEMA.empty_table()
  counts.rows += table.num_rows
  return table
