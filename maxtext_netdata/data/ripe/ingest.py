"""`maxtext-netdata ingest`: RIPE Atlas ping results (JSON) → raw parquet shards (docs/spec.md §1).

Inputs are JSON lines (the daily dumps, the results API's text format) or a JSON array (the
API's default), plain or `.bz2` / `.gz` / `.zst`, local or `gs://` / `s3://`; they are
listed and opened through `data.remote`, like `prepare`'s. The mapping from results to rows
is `data.ripe.reference`'s (docs/data_format.md); `data.ripe.scan`'s compiled scanner reads the
lines it can map with certainty and hands the rest to it.

Memory is bounded by the block and run sizes, not by the input: blocks of `block_bytes` are
mapped as they are read; rows gather into runs of at most `run_rows`, each sorted by time and
written to a temporary parquet file; the runs are then merged (an external sort, `data.ripe.shard_sort`) into
`shards` files, file k holding the k-th time range, like `generate`'s and real dumps. A
single run is sorted in memory and written directly. Shards are written under temporary
names in a folder of the run's own and then moved in place of an earlier run's files
(`layout.publish`); the `.complete` marker (JSON: counts and files) comes last. A run that
fails (bad input, a full disk) removes the shards it wrote and leaves an earlier run's files
as they were; a failed write raises OSError naming the file (`errors.WritesTo`).

Inputs are read block by block by `data.ripe.blocks`. With a `sample.Sample`, only the
results of its probes and time window give rows (both mapping paths apply it per result).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import os
import time

import pyarrow as pa
import tqdm

from maxtext_netdata.config import iso_seconds
from maxtext_netdata.config import load as load_config
from maxtext_netdata.data import remote
from maxtext_netdata.data.raw.layout import staged
from maxtext_netdata.data.ripe import reference, shard_sort
from maxtext_netdata.data.ripe import scan as ripe_scan
from maxtext_netdata.data.ripe.arguments import SHARD_ROWS
from maxtext_netdata.data.ripe.blocks import iter_blocks
from maxtext_netdata.data.ripe.sample import Sample
from maxtext_netdata.errors import DataError, UserError

BLOCK_BYTES = 16 << 20
RUN_ROWS = 2_000_000  # rows sorted in memory at once (~80 bytes a row, twice while sorting)
READERS = 4  # threads mapping blocks at most (DuckDB's reader and Arrow run without the GIL)


@dataclasses.dataclass
class Summary:
  counts: reference.Counts
  files: list[str]
  seconds: float
  sample: Sample | None = None
  probes: int = 0  # probes with a row written, counted when sampling

  def line(self) -> str:
    c = self.counts
    kept = ""
    if self.sample is not None:
      kept = (
        f" {c.kept:,} results of {self.probes:,} probes kept ({c.left_out:,} left out by the"
        " sample),"
      )
    return (
      f"ingest: {c.results:,} results read,{kept} {c.rows:,} rows written in"
      f" {len(self.files)} files, {c.other_types:,} results of other types skipped,"
      f" {c.duplicates:,} duplicates dropped, {c.bad_lines:,} bad lines ({self.seconds:.1f} s)"
    )


def storage_options() -> remote.StorageOptions:
  """The storage keys' defaults (`configs/base.yml`) and the environment, as `prepare` has."""
  return remote.StorageOptions.from_config(load_config(None))


def check_rows(counts: reference.Counts, inputs: list[str], sample: Sample | None) -> None:
  """Raises DataError when no result gave a row: no dataset to write."""
  if counts.rows == 0:
    within = " in the sample" if sample is not None else ""
    raise DataError(f"{', '.join(inputs)}: no ping result{within} gave a row")


def shard_count(shards: int, rows: int) -> int:
  """The files `rows` rows are written in: `shards`, 0 for one per SHARD_ROWS, at most `rows`."""
  return min(shards or -(-rows // SHARD_ROWS), rows)


def marker(counts, sample: Sample | None, probes: int, inputs: list[str], paths: list[str]) -> dict:
  """The `.complete` marker's content: the counts, the sample, the inputs and the files."""
  kept = {"sample": {**dataclasses.asdict(sample), "probes": probes}} if sample else {}
  return {
    **dataclasses.asdict(counts),
    **kept,
    "inputs": inputs,
    "files": [os.path.basename(p) for p in paths],
  }


def _mapped_blocks(
  entries, options, block_bytes, bar, counts, skip_bad, readers, scan=True, sample=None,
  decompress_threads=0,
):  # fmt: skip
  """Row tables of every block of every input, in input order, mapped in `readers` threads.

  Each block is mapped with its own counts, added to `counts` in order, so the first bad
  line raised is the first in the input. At most `readers` + 1 blocks are in flight.
  """
  readers = readers or min(READERS, os.cpu_count() or 1)
  pool = concurrent.futures.ThreadPoolExecutor(readers, thread_name_prefix="ingest-map")

  def mapped(block, uri):
    block_counts = reference.Counts()
    rows_of_block = ripe_scan.ingest_rows_of_block if scan else reference.rows_of_block
    return rows_of_block(block, uri, block_counts, skip_bad, sample), block_counts

  def done(future) -> pa.Table:
    table, block_counts = future.result()
    for field in dataclasses.fields(counts):
      setattr(counts, field.name, getattr(counts, field.name) + getattr(block_counts, field.name))
    return table

  pending = collections.deque()
  try:
    for entry in entries:
      blocks = iter_blocks(entry, options, block_bytes, bar, decompress_threads)
      with contextlib.closing(blocks):
        for block in blocks:
          pending.append(pool.submit(mapped, block, entry.uri))
          if len(pending) > readers:
            yield done(pending.popleft())
    while pending:
      yield done(pending.popleft())
  finally:
    pool.shutdown(wait=True, cancel_futures=True)


def ingest(
  inputs: list[str],
  out_dir: str,
  *,
  shards: int = 0,
  skip_bad: bool = False,
  block_bytes: int = BLOCK_BYTES,
  run_rows: int = RUN_ROWS,
  progress: bool = True,
  readers: int = 0,
  scan: bool = True,
  sample: Sample | None = None,
  decompress_threads: int = 0,
) -> Summary:
  """Read every input (files or globs, in name order) and write time-sorted parquet shards.

  `shards` 0 picks one file per SHARD_ROWS rows; `readers` 0 maps blocks in up to READERS
  threads (one per core); `scan` False maps every line with the reference path
  (`data.ripe.reference`) instead of the compiled scanner, for comparison; `sample` keeps the
  results of its probes and time window only (`data.ripe.sample`); `decompress_threads` 0
  decompresses a bz2 input on every usable core (`data.ripe.decompress`). Raises DataError
  for bad input (naming the file and line) and for input holding no ping row; `out_dir` then
  has no `.complete`.
  """
  started = time.perf_counter()
  if scan:
    ripe_scan.load()
  options = storage_options()
  entries = remote.expand_all(inputs, options, remote.VISIBLE_FILES)
  counts = reference.Counts()
  # the runs, then the shards, in a folder of this run's: the earlier run's files stay meanwhile
  with (
    staged(out_dir) as runs_dir,
    tqdm.tqdm(
      total=sum(e.size for e in entries),
      unit="B",
      unit_scale=True,
      desc="ingest",
      disable=not progress,
      mininterval=1.0,
    ) as bar,
  ):
    runs, probes = [], set()
    tables = _mapped_blocks(
      entries, options, block_bytes, bar, counts, skip_bad, readers, scan, sample,
      decompress_threads,
    )  # fmt: skip
    buffer = shard_sort.gather_runs(tables, runs_dir, run_rows, sample, runs, probes)
    bar.close()
    check_rows(counts, inputs, sample)
    if buffer and not runs:  # a single run: sorted in memory, written directly
      pieces = [shard_sort.sort_by_time(pa.concat_tables(buffer))]
    else:
      if buffer:
        runs.append(shard_sort.write_run(buffer, runs_dir, len(runs)))
      pieces = shard_sort.merge(runs)
    buffer = []
    paths = shard_sort.publish_shards(
      runs_dir, out_dir, pieces, counts.rows, shard_count(shards, counts.rows),
      functools.partial(marker, counts, sample, len(probes), inputs),
    )  # fmt: skip
    return Summary(counts, paths, time.perf_counter() - started, sample, len(probes))


def _seconds(text: str | None, flag: str) -> int | None:
  """Unix seconds of an ISO 8601 time (a date, or a date and time; UTC unless it says)."""
  if text is None:
    return None
  try:
    return iso_seconds(text)
  except ValueError:
    raise UserError(f"{flag}: {text!r} is not an ISO 8601 time (2025-07-01T12:00:00Z)") from None


def sample_of(args) -> Sample | None:
  """The sample `--probe-fraction`, `--since` and `--until` ask for; None when they ask none."""
  if not 0 < args.probe_fraction <= 1:
    raise UserError(f"--probe-fraction must be in (0, 1], got {args.probe_fraction}")
  since, until = _seconds(args.since, "--since"), _seconds(args.until, "--until")
  if since is not None and until is not None and until <= since:
    raise UserError(f"--until ({args.until}) must be after --since ({args.since})")
  if args.probe_fraction == 1 and since is None and until is None:
    return None
  return Sample(args.probe_fraction, since, until)


def run(args) -> int:
  if args.shards < 0:
    raise UserError(f"--shards must be >= 0, got {args.shards}")
  if args.decompress_threads < 0:
    raise UserError(f"--decompress-threads must be >= 0, got {args.decompress_threads}")
  sample, beam_args = sample_of(args), getattr(args, "passthrough", [])
  if getattr(args, "runner", "builtin") == "beam":
    try:
      from maxtext_netdata.data.ripe import beam_runner  # noqa: PLC0415 (an optional extra)
    except ImportError as e:
      raise UserError(f"--runner beam needs Apache Beam: pip install '.[beam]' ({e})") from None
    summary = beam_runner.ingest(
      args.inputs, args.out, beam_args=beam_args, shards=args.shards, skip_bad=args.skip_bad,
      sample=sample, decompress_threads=args.decompress_threads,
    )  # fmt: skip
  elif beam_args:
    raise UserError("options after `--` are Beam pipeline options: add --runner beam")
  elif remote.is_remote(args.out):
    raise UserError(f"--out {args.out}: a bucket needs --runner beam (this runner writes a folder)")
  else:
    summary = ingest(
      args.inputs, args.out, shards=args.shards, skip_bad=args.skip_bad, sample=sample,
      decompress_threads=args.decompress_threads,
    )  # fmt: skip
  print(f"{summary.line()} to {args.out}")
  return 0
