"""How fast `ingest` turns RIPE Atlas ping results into raw parquet.

Two inputs of JSON lines:
- `1 packet`: `generate --format ripe-json` as written (one ~410-byte line per result,
  firmware 5080 style, one packet each);
- `3 packets`: the same results as real ping results mostly are, three packets each (two
  replies and a timeout, ~430 bytes a line, three rows a result).
For each it times, in this one process and back to back:
- the JSON reader alone over the file's blocks: pyarrow's `read_json` with an explicit schema
  (the reader ingest used first) and DuckDB's `read_json` (the one it uses, `reference._read`);
- `read+map`: blocks of the file mapped to rows, the part that scales with the input, by
  the compiled scanner (`scan.rows_of_block`, what ingest uses) and by the reference
  path alone (`reference.rows_of_block`: DuckDB's reader and Arrow, ingest's path before);
- `ingest`: the whole command (read, map, sort, write the parquet shards) with the scanner,
  with one mapping thread and with its default (one a core, at most `ingest.READERS`), and
  with the reference path (`scan=False`) and its default threads.
Then the `1 packet` results as a JSON array and bz2-compressed, with bz2 decompression
alone (Python's `bz2` and the `bzip2 -dc` tool) as the ceiling.

Per core = results / CPU seconds (user + system, all threads; for `bzip2 -dc` its own), so
the figure holds whatever the machine's core count; wall-clock rates are printed beside it.

  .venv/bin/python benchmarks/bench_ingest.py [--rows 300000] [--bz2-rows 100000]
"""

from __future__ import annotations

import argparse
import bz2
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time

import pyarrow as pa
import pyarrow.json as pj

from maxtext_netdata.data import remote
from maxtext_netdata.data.prepare import prepare
from maxtext_netdata.data.ripe import blocks, ingest, reference, scan
from maxtext_netdata.data.synthetic.generate import generate

# The reader ingest used first, for comparison: pyarrow's, with the fields the mapping needs.
_PYARROW_PARSE = pj.ParseOptions(
  explicit_schema=reference.RESULT_SCHEMA, unexpected_field_behavior="ignore"
)
_ONE_REPLY = re.compile(rb'"result":\[\{"rtt":([0-9.]+)\}\],"dup":0,"rcvd":1,"sent":1')


def _cpu(who=resource.RUSAGE_SELF) -> float:
  usage = resource.getrusage(who)
  return usage.ru_utime + usage.ru_stime


def _timed(call, who=resource.RUSAGE_SELF):
  wall, cpu = time.perf_counter(), _cpu(who)
  result = call()
  return result, time.perf_counter() - wall, _cpu(who) - cpu


def _print(label: str, what: str, results: int, wall: float, cpu: float, extra: str = "") -> None:
  print(
    f"{label:<11} {what:<32} {results / cpu / 1e6:5.2f}M results/s per core"
    f" ({results / wall / 1e6:.2f}M/s wall){extra}",
    flush=True,
  )


def _blocks(path: str):
  entry = remote.expand(path, ingest.storage_options())[0]
  return blocks.iter_blocks(entry, ingest.storage_options(), ingest.BLOCK_BYTES, None)


def _read_and_map(path: str, rows_of_block) -> int:
  counts = reference.Counts()
  for block in _blocks(path):
    rows_of_block(block, path, counts, skip_bad=False)
  return counts.results


def _readers(label: str, path: str, results: int) -> None:
  blocks = [block.data for block in _blocks(path)]
  size = sum(len(b) for b in blocks)
  for what, read in (
    (
      "pyarrow read_json alone",
      lambda b: pj.read_json(pa.BufferReader(b), parse_options=_PYARROW_PARSE),
    ),
    ("duckdb read_json alone", reference._read),
  ):
    _, wall, cpu = _timed(lambda read=read: [read(b) for b in blocks])
    _print(label, what, results, wall, cpu, f", {size / cpu / 1e6:.0f} MB/s per core")


def _report(label: str, path: str, work: str, one_reader: bool = False) -> None:
  for what, rows_of_block in (
    ("read+map, scanner", scan.rows_of_block),
    ("read+map, DuckDB path", reference.rows_of_block),
  ):
    results, wall, cpu = _timed(lambda f=rows_of_block: _read_and_map(path, f))
    _print(label, what, results, wall, cpu)
  readers = min(ingest.READERS, os.cpu_count() or 1)
  runs = [(n, True) for n in ([1] if one_reader and readers > 1 else []) + [readers]]
  for n, scanner in [*runs, (readers, False)]:
    summary, wall, cpu = _timed(
      lambda n=n, scanner=scanner: ingest.ingest(
        [path], os.path.join(work, "out"), progress=False, readers=n, scan=scanner
      )
    )
    what = f"ingest, {n} thread{'s' if n > 1 else ''}, {'scanner' if scanner else 'DuckDB path'}"
    _print(label, what, results, wall, cpu, f", {summary.counts.rows:,} rows")


def _three_packets(match: re.Match) -> bytes:
  rtt = match.group(1)
  return b'"result":[{"rtt":%s},{"rtt":%s},{"x":"*"}],"dup":0,"rcvd":2,"sent":3' % (rtt, rtt)


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
    three = os.path.join(work, "three.json")
    with open(three, "wb") as f:
      f.write(_ONE_REPLY.sub(_three_packets, lines))
    print(
      f"{args.rows:,} results, {len(lines) / args.rows:.0f} bytes a line"
      f" ({os.path.getsize(three) / args.rows:.0f} with 3 packets),"
      f" {os.cpu_count()} CPUs on this machine"
    )
    reference._read(b'{"msm_id": 1}\n')  # DuckDB's one-off start (its JSON extension) untimed
    started = time.perf_counter()  # the scanner's machine code, compiled on first use ever
    scan.rows_of_block(
      reference.Block(lines[: lines.index(b"\n") + 1], 1, 1, "line"), path, reference.Counts(), True
    )
    print(
      f"scanner ready in {time.perf_counter() - started:.1f} s (compiled, or loaded from cache)"
    )
    for label, file in (("1 packet", path), ("3 packets", three)):
      _readers(label, file, args.rows)
      _report(label, file, work, one_reader=True)
    os.remove(three)

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
    with open(compressed, "rb") as f:
      packed = f.read()
    _, wall, cpu = _timed(lambda: bz2.decompress(packed))
    _print("bz2", "Python bz2 alone", args.bz2_rows, wall, cpu, f", {cut / cpu / 1e6:.0f} MB/s")
    if shutil.which("bzip2"):
      _, wall, cpu = _timed(
        lambda: subprocess.run(["bzip2", "-dc", compressed], stdout=subprocess.DEVNULL),
        resource.RUSAGE_CHILDREN,
      )
      _print("bz2", "bzip2 -dc alone", args.bz2_rows, wall, cpu)
    _report("bz2", compressed, work)
  peak = prepare.peak_rss_bytes() / 2**20
  print(
    f"peak RSS of this process (generate and the input held in memory included): {peak:.0f} MiB"
  )


if __name__ == "__main__":
  main()
