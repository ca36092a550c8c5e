"""A compiled scanner for RIPE Atlas ping results as JSON lines: the fast path of `ingest`.

`rows_of_block` reads a block of newline-delimited results with `ripe_scan_kernel`, a
numba-compiled pass over the bytes that writes the rows (SPEC §1) of the results it can map
with certainty straight into columnar arrays (what it takes: that module's docstring); every
other line is handed to `ripe_json.rows_of_block` (DuckDB's reader and Arrow), which stays
the reference and the error reporter. Kept as our own code because no kept JSON library
reached 1M results/s per core (DuckDB's reader alone 0.6M, pyarrow's 0.4M, msgspec and
polars no faster): this one parses only the fields the mapping needs and skips the rest.
Floats are converted from their text in bulk by Arrow's cast (correctly rounded, as DuckDB's
reader is), so every value is the reference's.

Lines handed over go to the reference a run of consecutive lines at a time (their line
numbers and row order kept); a block with more than `_MAX_RUNS` runs goes to it whole.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from maxtext_netdata.data import ripe_json
from maxtext_netdata.data.ripe_scan_kernel import (
  BLANK,
  HANDED,
  OTHER,
  PING,
  columns_of,
  scan_block,
)

__all__ = ["BLANK", "HANDED", "OTHER", "PING", "load", "rows_of_block", "scan"]
_MAX_RUNS = 8
_TIME = ripe_json.ROW_SCHEMA.field("event_time").type


def _bytes_of(data) -> np.ndarray:
  """A read-only uint8 view of a block: one compiled variant of the scanner for every kind of
  block (bytes, bytearray, Arrow buffer), where a writable view would compile a second."""
  buf = np.frombuffer(data, np.uint8)
  buf.flags.writeable = False
  return buf


def _bitmap(valid: np.ndarray) -> pa.Buffer | None:
  return None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))


def _table(texts: np.ndarray, rows: np.ndarray) -> pa.Table:
  """ROW_SCHEMA rows of a `scan_block` rows array and its texts.

  Arrow takes `columns_of`'s arrays as they are (no copy, no cast of offsets).
  """
  # int32 string offsets: a column's texts fit in its block (`rows_of_block` keeps it small).
  assert texts.shape[1] < 2**31, texts.shape
  msm, ts, prb, prb_ok, version, offsets, data, valid = columns_of(texts, rows)
  m, data = len(rows), pa.py_buffer(data)
  strings, start = [], 0
  for c in range(3):
    end = start + int(offsets[c, m])
    strings.append(
      pa.StringArray.from_buffers(
        m, pa.py_buffer(offsets[c]), data.slice(start, end - start), _bitmap(valid[c])
      )
    )
    start = end
  return pa.table(
    [
      pa.array(msm),
      pa.Array.from_buffers(_TIME, m, [None, pa.py_buffer(ts)]),
      strings[0],
      strings[1],
      pa.array(version),
      pc.cast(strings[2], pa.float64()),
      pa.Array.from_buffers(pa.int64(), m, [_bitmap(prb_ok), pa.py_buffer(prb)]),
    ],
    schema=ripe_json.ROW_SCHEMA,
  )


_SAMPLE = (
  b'{"type":"ping","af":4,"from":"192.0.2.1","src_addr":"10.0.0.1","dst_addr":"198.51.100.1",'
  b'"timestamp":1700000000,"msm_id":1,"prb_id":1,"result":[{"rtt":1.5},{"x":"*"}]}\n'
)


def load(notice_after_s: float = 2.0) -> None:
  """Compiles or loads the scanner's kernels before the first block is read.

  The first use on a machine compiles them (about a minute; numba caches the result), which
  would otherwise look like a stalled progress bar: when this takes longer than
  `notice_after_s`, one line on stderr says why.
  """
  notice = threading.Timer(
    notice_after_s,
    print,
    (
      "ingest: compiling the JSON scanner (its first use on this machine, about a minute;"
      " cached for later runs)",
    ),
    {"file": sys.stderr, "flush": True},
  )
  notice.daemon = True
  notice.start()
  try:
    rows_of_block(ripe_json.Block(_SAMPLE, 1, 1, "line"), "(sample)", ripe_json.Counts(), False)
  finally:
    notice.cancel()


def scan(data) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, np.ndarray]:
  """`scan_block` of a block of newline-delimited results (see there)."""
  buf = _bytes_of(data)
  lines = ripe_json.count_newlines(data) + (len(buf) > 0 and buf[-1] != 10)
  return scan_block(buf, max(lines, 1))


def rows_of_block(
  block: ripe_json.Block, path: str, counts: ripe_json.Counts, skip_bad: bool
) -> pa.Table:
  """`ripe_json.rows_of_block`'s rows and counts, the lines the scanner takes read by it."""
  data = block.data
  buf = _bytes_of(data)
  if len(buf) >= 2**31:  # `_table`'s int32 offsets: a block of lines over 2 GiB goes whole
    return ripe_json.rows_of_block(block, path, counts, skip_bad)
  lines = block.newlines + (len(buf) > 0 and buf[-1] != 10)
  scanned = scan_block(buf, max(lines, 1))
  kinds, starts, first_rows, rows, dups, texts = scanned
  handed = kinds == HANDED
  # Runs of handed-over lines: [begin, end) line ranges.
  edges = np.flatnonzero(np.diff(np.concatenate(([0], handed.view(np.int8), [0]))))
  runs = edges.reshape(-1, 2)
  if len(runs) > _MAX_RUNS:
    return ripe_json.rows_of_block(block, path, counts, skip_bad)
  counts.results += int(np.count_nonzero((kinds == PING) | (kinds == OTHER)))
  counts.other_types += int(np.count_nonzero(kinds == OTHER))
  counts.duplicates += int(dups)
  counts.rows += len(rows)
  tables, line = [], 0
  for begin, end in [*runs.tolist(), [len(kinds), len(kinds)]]:
    if begin > line:
      tables.append(_table(texts, rows[first_rows[line] : first_rows[begin]]))
    if end > begin:
      piece = bytes(memoryview(data)[starts[begin] : starts[end]])
      newlines = piece.count(b"\n")
      run = ripe_json.Block(piece, block.first_line + begin, newlines, block.unit)
      tables.append(ripe_json.rows_of_block(run, path, counts, skip_bad))
    line = end
  if not tables:
    return ripe_json.ROW_SCHEMA.empty_table()
  return pa.concat_tables(tables) if len(tables) > 1 else tables[0]
