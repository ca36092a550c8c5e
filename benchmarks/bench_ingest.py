"""How fast `ingest` turns RIPE Atlas ping results into raw parquet.

Generates ping results with `generate --format ripe-json` (one ~410-byte JSON line per
result, firmware 5080 style, like the daily dumps), then times, for each input form:
- `read+map`: the JSON reader and the mapping to rows alone (`ripe_json.rows_of_block` over
  the file's blocks), the part that scales with the input;
- `ingest`: the whole command (read, map, sort, write the parquet shards);
and, for JSON lines, pyarrow's JSON reader alone on the same file (the ceiling).

Per core = results / CPU seconds of this process (user + system, all threads), so the figure
holds whatever the machine's core count and load; wall-clock rates are printed beside it.

  .venv/bin/python benchmarks/bench_ingest.py [--rows 300000] [--bz2-rows 100000]
"""

from __future__ import annotations

import argparse
import bz2
import os
import resource
import tempfile
import time

import pyarrow.json as pj

from maxtext_netdata.data import ingest, remote, ripe_json
from maxtext_netdata.data.generate import generate


def _cpu() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def _timed(call):
  wall, cpu = time.perf_counter(), _cpu()
  result = call()
  return result, time.perf_counter() - wall, _cpu() - cpu


def _read_and_map(path: str) -> int:
  counts = ripe_json.Counts()
  entry = remote.expand(path, ingest.storage_options())[0]
  for data, line, unit in ingest.iter_blocks(
    entry, ingest.storage_options(), ingest.BLOCK_BYTES, None
  ):
    ripe_json.rows_of_block(data, line, path, unit, counts, skip_bad=False)
  return counts.results


def _report(label: str, path: str, work: str) -> None:
  size = os.path.getsize(path)
  results, wall, cpu = _timed(lambda: _read_and_map(path))
  print(
    f"{label:<12} read+map: {results / cpu / 1e6:5.2f}M results/s per core"
    f" ({results / wall / 1e6:.2f}M/s wall, {size / cpu / 1e6:4.0f} MB/s of input per core)"
  )
  summary, wall, cpu = _timed(
    lambda: ingest.ingest([path], os.path.join(work, "out"), progress=False)
  )
  print(
    f"{label:<12} ingest:   {results / cpu / 1e6:5.2f}M results/s per core"
    f" ({results / wall / 1e6:.2f}M/s wall), {summary.counts.rows:,} rows"
  )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=int, default=300_000, help="results for the plain runs")
  parser.add_argument("--bz2-rows", type=int, default=100_000, help="results for bz2")
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as work:
    [path] = generate(
      os.path.join(work, "json"), rows=args.rows, shards=1, progress=False, fmt="ripe-json"
    )
    with open(path, "rb") as f:
      lines = f.read()
    print(
      f"{args.rows:,} results, {len(lines) / args.rows:.0f} bytes a line,"
      f" {os.cpu_count()} CPUs on this machine"
    )
    _, wall, cpu = _timed(lambda: pj.read_json(path, parse_options=ripe_json._PARSE))
    print(
      f"{'JSON lines':<12} pyarrow.json.read_json alone (the parser's ceiling):"
      f" {args.rows / cpu / 1e6:.2f}M results/s per core ({len(lines) / cpu / 1e6:.0f} MB/s)"
    )
    _report("JSON lines", path, work)
    array = os.path.join(work, "array.json")
    with open(array, "wb") as f:
      f.write(b"[" + b",".join(lines.splitlines()) + b"]")
    _report("JSON array", array, work)
    os.remove(array)
    cut = 0
    for _ in range(args.bz2_rows):
      cut = lines.index(b"\n", cut) + 1
    compressed = os.path.join(work, "dump.json.bz2")
    with open(compressed, "wb") as f:
      f.write(bz2.compress(lines[:cut]))
    _report("bz2 lines", compressed, work)
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  print(
    f"peak RSS of this process (generate and the input held in memory included): {peak:.0f} MiB"
  )


if __name__ == "__main__":
  main()
