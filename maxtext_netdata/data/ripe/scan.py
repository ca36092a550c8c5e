"""A compiled scanner for RIPE Atlas ping results as JSON lines: the fast path of `ingest`.

`rows_of_block` reads a block of newline-delimited results with `ripe_scan_kernel`, a
numba-compiled pass over the bytes that writes the rows (docs/spec.md §1) of the results it can map
with certainty straight into columnar arrays (what it takes: that module's docstring); every
other line is handed to `reference.rows_of_block` (DuckDB's reader and Arrow), which stays
the reference and the error reporter. Kept as our own code because no kept JSON library
reached 1M results/s per core (DuckDB's reader alone 0.6M, pyarrow's 0.4M, msgspec and
polars no faster): this one parses only the fields the mapping needs and skips the rest.
Floats are converted in the kernel where an exact fast path applies (`_decimal`: a
mantissa under 2**53 and a power of ten up to 22, as RIPE's rtts are) and by Arrow's cast
otherwise, both correctly rounded as DuckDB's reader is, so every value is the reference's.

Lines handed over go to the reference a run of consecutive lines at a time (their line
numbers and row order kept); a block with more than `_MAX_RUNS` runs goes to it whole.

The first run on a machine (an empty numba cache) does not wait for the kernels' compile
(~55-60 s for the scanner, ~15 s for the address parser and the line screen): `load` starts
it on a thread (`kernels.warmup`) and `ingest_rows_of_block` maps the blocks that come
meanwhile with the reference path and the kernels' uncompiled stand-ins, then hands over to
the scanner. Both paths give the same rows, counts and errors, so the output does not depend
on which block each one mapped (tests/data/ripe/test_cold_start.py).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from maxtext_netdata.data.raw import ip_text
from maxtext_netdata.data.ripe import json_array, reference
from maxtext_netdata.data.ripe.sample import Sample
from maxtext_netdata.data.ripe.scanner import json_scan
from maxtext_netdata.data.ripe.scanner.kernel import (
  BLANK,
  DST,
  DST_OK,
  HANDED,
  MSM,
  OTHER,
  PING,
  PRB,
  PRB_OK,
  SRC,
  SRC_OK,
  TS,
  VER,
  scan_block,
)
from maxtext_netdata.kernels import warmup
from maxtext_netdata.kernels.ascii import NEWLINE

__all__ = [
  "BLANK",
  "HANDED",
  "OTHER",
  "PING",
  "ingest_rows_of_block",
  "load",
  "rows_of_block",
  "scan",
]
_MAX_RUNS = 8
_TIME = reference.ROW_SCHEMA.field("event_time").type


def _newline_ended(data):
  """`data`, with a newline added if it has none at its end (the scanner's contract: only a
  file's last block may lack one, so the copy is rare)."""
  if len(data) and memoryview(data)[-1] == NEWLINE:
    return data
  return bytes(data) + b"\n"


def _bytes_of(data) -> np.ndarray:
  """A read-only uint8 view of a block: one compiled variant of the scanner for every kind of
  block (bytes, bytearray, Arrow buffer), where a writable view would compile a second."""
  buf = np.frombuffer(data, np.uint8)
  buf.flags.writeable = False
  return buf


def _bitmap(valid: np.ndarray) -> pa.Buffer | None:
  return None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))


def _rtts(buf: np.ndarray, rtt: np.ndarray, rtt_text: np.ndarray) -> np.ndarray:
  """`rtt` with the values the kernel left as NaN (texts beyond its exact fast path) converted
  from their texts by Arrow's cast, as every rtt was before the kernel converted them."""
  slow = np.flatnonzero(np.isnan(rtt))
  if len(slow):
    texts = [buf[s : s + n].tobytes() for s, n in rtt_text[:, slow].T.tolist()]
    rtt[slow] = pc.cast(pa.array(texts, pa.string()), pa.float64()).to_numpy()
  return rtt


def _table(buf: np.ndarray, scanned: tuple) -> pa.Table:
  """ROW_SCHEMA rows of a `scan_block` result; Arrow takes the kernel's columns as they are
  (no copy, no cast)."""
  m, ints, valid, rtt, rtt_text, offsets, texts = scanned[4:]
  # int32 string offsets: a column's texts fit in its block (`rows_of_block` keeps it small).
  assert texts.shape[1] < 2**31, texts.shape
  strings = [
    pa.StringArray.from_buffers(
      m,
      pa.py_buffer(offsets[c, : m + 1]),
      pa.py_buffer(texts[c, : offsets[c, m]]),
      _bitmap(valid[ok, :m]),
    )
    for c, ok in ((SRC, SRC_OK), (DST, DST_OK))
  ]
  return pa.table(
    [
      pa.Array.from_buffers(pa.int64(), m, [None, pa.py_buffer(ints[MSM, :m])]),
      pa.Array.from_buffers(_TIME, m, [None, pa.py_buffer(ints[TS, :m])]),
      strings[0],
      strings[1],
      pa.Array.from_buffers(pa.int64(), m, [None, pa.py_buffer(ints[VER, :m])]),
      pa.array(_rtts(buf, rtt[:m], rtt_text), pa.float64()),
      pa.Array.from_buffers(
        pa.int64(), m, [_bitmap(valid[PRB_OK, :m]), pa.py_buffer(ints[PRB, :m])]
      ),
    ],
    schema=reference.ROW_SCHEMA,
  )


_SAMPLE = (
  b'{"type":"ping","af":4,"from":"192.0.2.1","src_addr":"10.0.0.1","dst_addr":"198.51.100.1",'
  b'"timestamp":1700000000,"msm_id":1,"prb_id":1,"result":[{"rtt":1.5},{"x":"*"}]}\n'
)


# Input mapped before the scanner's first compile on a machine starts (~55-60 s of a core).
# Warm, the scanner maps 82 MB in 0.6 s where the reference path takes 3.7 s (2-core
# development machine): worth its one-off compile for any sizeable input, not for a smaller
# one, which the reference path reads in a few seconds without a compile.
COMPILE_AFTER_BYTES = 64 << 20
_SCANNER = "ingest scanner"  # its `warmup` step


def _warm_ip_text() -> None:
  reference.addresses_fit(pa.array(["10.0.0.1", None]), np.full(2, 4))


def _warm_json_array() -> None:
  json_array.ArrayToLines("(sample)").feed(b"[" + _SAMPLE.strip() + b"," + _SAMPLE.strip(), False)


def _warm_object_lines() -> None:
  json_scan.object_lines(_bytes_of(_SAMPLE))


def _warm_scanner() -> None:
  # Started to compile (a load is waited for where it starts: `load`), after the helpers:
  # numba compiles one kernel at a time, and the helpers serve every block.
  warmup.compiling()
  warmup.wait(ip_text.WARMUP)
  warmup.wait(json_scan.WARMUP)
  scan(_SAMPLE)


class _Loading:
  """When `rows_of_block` takes the scanner: once it is compiled, compiled only once
  `compile_after_bytes` of input have come (or at once when numba's cache holds it)."""

  def __init__(self, compile_after_bytes: int, notice_after_s: float):
    self.lock = threading.Lock()
    self.seen, self.compile_after_bytes = 0, compile_after_bytes
    self.notice_after_s = notice_after_s
    self.takes = _takes
    self.failed = False  # a block raised (a bad line): the run ends with an error

  def start_scanner(self) -> None:
    if warmup.start(
      [(_SCANNER, _warm_scanner, _NOTICE.format("the JSON scanner"))],
      self.notice_after_s,
      "ingest-compile-scanner",
    ):
      atexit.register(_finish_scanner, self)

  def scanner_takes(self, block: reference.Block) -> bool:
    if self.takes is not None:
      return self.takes(block)
    if not warmup.started(_SCANNER):
      with self.lock:
        self.seen += len(block.data)
        start = self.seen >= self.compile_after_bytes
      if start:
        self.start_scanner()
    return warmup.started(_SCANNER) and not warmup.pending(_SCANNER)


def _finish_scanner(loading: _Loading) -> None:
  """At exit, after a run that mapped its input while the scanner compiled: waits for the
  compile to end, so that it is cached and later runs use the scanner (not after a failed
  run, which has nothing more to do). The output is written by then; Ctrl-C or SIGTERM ends
  the wait at once (a later run compiles again), with one line rather than a traceback."""
  if not loading.failed:
    warmup.finish(
      _SCANNER,
      "ingest: output written; finishing the JSON scanner's compile (its first use on this"
      " machine) so that later runs use it; Ctrl-C skips it",
      "ingest: compile skipped; the next run compiles it",
    )


_NOTICE = "ingest: compiled {} on a thread (its first use on this machine; cached for later runs)"
_loading: _Loading | None = None
# Tests force the handover with it: whether the scanner takes a block (else the reference)
# in place of whether it is compiled yet (it is compiled on the spot for the blocks it takes).
_takes: Callable[[reference.Block], bool] | None = None


def load(notice_after_s: float = 2.0, compile_after_bytes: int = COMPILE_AFTER_BYTES) -> None:
  """Makes the kernels `rows_of_block` uses ready without waiting for their first compile.

  Loaded from numba's cache (a later run on a machine, ~0.5 s), they are loaded here. Not in
  the cache (the first run), they compile on a thread while the blocks are mapped without
  them: a JSON array's splitter, the address parser and the line screen (`json_array.split`,
  `ip_text`, `json_scan.object_lines`: ~3-10 s and ~15 s cold, needed by both paths) by their
  uncompiled equivalents, and the results by the
  reference path until the scanner is compiled; that compile (~55-60 s) starts only once
  `compile_after_bytes` of input have been read, so a smaller input never waits for it or
  pays for it; a run that ends before it waits for it at exit, its output written, so that
  later runs have it. Either path gives the same rows, counts and errors (tests/data/ripe). Each
  compile that takes more than `notice_after_s` says so on stderr, with its time.
  """
  global _loading
  loading = _Loading(compile_after_bytes, notice_after_s)
  helpers = [
    # First: the quickest to compile (~2-7 s), and its stand-in is the slowest (~20 ms a MB).
    (json_array.WARMUP, _warm_json_array, _NOTICE.format("the JSON array splitter")),
    (ip_text.WARMUP, _warm_ip_text, _NOTICE.format("the address parser")),
    (json_scan.WARMUP, _warm_object_lines, _NOTICE.format("the line screen")),
  ]
  if all(map(warmup.cached, (json_array._split, ip_text._parse_all, json_scan._object_lines))):
    for _, warm, _ in helpers:  # a load: faster than the stand-ins on the first blocks
      warm()
  else:
    warmup.start(helpers, notice_after_s, "ingest-compile")
  if warmup.cached(scan_block):  # a load (~0.3-0.8 s): faster than the reference's first blocks
    loading.start_scanner()
    warmup.wait(_SCANNER)
  elif compile_after_bytes <= 0:
    loading.start_scanner()
  _loading = loading


def _scanned(buf: np.ndarray, lines: int, sample: Sample | None = None):
  """(kinds, starts, first_rows, dups, rows, left_out): `scan_block`'s, its rows as one
  ROW_SCHEMA table, with the ping results whose addresses are not of their version handed
  over, and the rows of those outside `sample` dropped (`left_out` of them).

  The kernel does not parse addresses; they are checked here by `prepare`'s own parser, on
  each result's first row (every result the kernel maps has one), and the lines of the
  results that fail go to the reference, which names them.
  """
  scanned = scan_block(buf, lines)
  kinds, starts, first_rows, dups = scanned[:4]
  rows = _table(buf, scanned)
  ping = np.flatnonzero(kinds == PING)
  if not len(ping):
    return kinds, starts, first_rows, dups, rows, 0
  first = rows.select(["src_addr", "dst_addr", "ip_version", "event_time"])
  if len(ping) < rows.num_rows:  # else each result has one row: its first rows are all rows
    first = first.take(pa.array(first_rows[ping]))
  version = first.column("ip_version").to_numpy()
  keep = reference.addresses_fit(first.column("src_addr"), version)
  keep &= reference.addresses_fit(first.column("dst_addr"), version)
  kinds[ping[~keep]] = HANDED
  left_out = 0
  if sample is not None:
    seconds = first.column("event_time").cast(pa.int64()).to_numpy()
    outside = keep & ~sample.keeps(first.column("src_addr"), version, seconds)
    left_out = int(outside.sum())
    keep &= ~outside
  if keep.all():
    return kinds, starts, first_rows, dups, rows, 0
  dropped = ping[~keep]
  dups[dropped] = 0
  line_rows = np.diff(first_rows)
  kept_lines = np.ones(len(kinds), bool)
  kept_lines[dropped] = False
  rows = rows.filter(pa.array(np.repeat(kept_lines, line_rows)))
  line_rows[dropped] = 0
  first_rows = np.concatenate(([0], np.cumsum(line_rows)))
  return kinds, starts, first_rows, dups, rows, left_out


def scan(data) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, pa.Table]:
  """(kinds, starts, first_rows, dups, rows) of a block of newline-delimited results: each
  line's kind, start, first row and duplicates dropped, and the rows as one ROW_SCHEMA table."""
  buf = _bytes_of(_newline_ended(data))
  return _scanned(buf, reference.count_newlines(buf))[:5]


def rows_of_block(
  block: reference.Block,
  path: str,
  counts: reference.Counts,
  skip_bad: bool,
  sample: Sample | None = None,
) -> pa.Table:
  """`reference.rows_of_block`'s rows and counts, the lines the scanner takes read by it."""
  data = block.data
  if len(data) >= 2**31:  # `_table`'s int32 offsets: a block of lines over 2 GiB goes whole
    return reference.rows_of_block(block, path, counts, skip_bad, sample)
  lines = block.newlines + (len(data) == 0 or memoryview(data)[-1] != NEWLINE)
  data = _newline_ended(data)
  buf = _bytes_of(data)
  kinds, starts, first_rows, dups, rows, left_out = _scanned(buf, lines, sample)
  handed = kinds == HANDED
  # Runs of handed-over lines: [begin, end) line ranges.
  edges = np.flatnonzero(np.diff(np.concatenate(([0], handed.view(np.int8), [0]))))
  runs = edges.reshape(-1, 2)
  if len(runs) > _MAX_RUNS:
    return reference.rows_of_block(block, path, counts, skip_bad, sample)
  counts.results += int(np.count_nonzero((kinds == PING) | (kinds == OTHER)))
  counts.other_types += int(np.count_nonzero(kinds == OTHER))
  counts.duplicates += int(dups.sum())
  counts.kept += int(np.count_nonzero(kinds == PING)) - left_out
  counts.left_out += left_out
  counts.rows += rows.num_rows
  if not len(runs):
    return rows
  tables, line = [], 0
  for begin, end in [*runs.tolist(), [len(kinds), len(kinds)]]:
    if begin > line:
      tables.append(rows.slice(int(first_rows[line]), int(first_rows[begin] - first_rows[line])))
    if end > begin:
      piece = bytes(memoryview(data)[starts[begin] : starts[end]])
      newlines = piece.count(b"\n")
      run = reference.Block(piece, block.first_line + begin, newlines, block.unit)
      tables.append(reference.rows_of_block(run, path, counts, skip_bad, sample))
    line = end
  if not tables:
    return reference.ROW_SCHEMA.empty_table()
  return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def ingest_rows_of_block(
  block: reference.Block,
  path: str,
  counts: reference.Counts,
  skip_bad: bool,
  sample: Sample | None = None,
) -> pa.Table:
  """`ingest`'s mapping of a block: by `rows_of_block` once the scanner is compiled (`load`),
  by `reference.rows_of_block` before; the same rows, counts and errors either way."""
  loading = _loading
  try:
    if loading is not None and not loading.scanner_takes(block):
      return reference.rows_of_block(block, path, counts, skip_bad, sample)
    return rows_of_block(block, path, counts, skip_bad, sample)
  except Exception:
    if loading is not None:
      loading.failed = True
    raise
