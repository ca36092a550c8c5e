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
Then the `1 packet` results as a JSON array, and bz2- and gzip-compressed (`--bz2-rows` of
them): decompression alone by the decompressor ingest uses (`data.ripe.decompress`: for bz2
indexed_bzip2's parallel reader, on 1 and 2 threads and every usable core), by Python's
module and by the command-line tool (and rapidgzip, when installed, for gzip), then the whole
`ingest` with `--decompress-threads` 1, 2 and every usable core.

Per core = results / CPU seconds (user + system, all threads; for `bzip2 -dc` its own), so
the figure holds whatever the machine's core count; wall-clock rates are printed beside it:
the parallel decompressor trades some CPU per result for wall time.

  .venv/bin/python benchmarks/bench_ingest.py [--rows 300000] [--bz2-rows 300000]
      [--parts plain,array,bz2,gz] [--repeat 1]
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time

import bench_decompress  # this folder's: the decompression timing both benchmarks share
import pyarrow as pa
import pyarrow.json as pj

from maxtext_netdata.data import remote
from maxtext_netdata.data.prepare import prepare
from maxtext_netdata.data.ripe import blocks, decompress, ingest, reference, scan
from maxtext_netdata.data.synthetic.generate import generate

# The reader ingest used first, for comparison: pyarrow's, with the fields the mapping needs.
_PYARROW_PARSE = pj.ParseOptions(
  explicit_schema=reference.RESULT_SCHEMA, unexpected_field_behavior="ignore"
)
_ONE_REPLY = re.compile(rb'"result":\[\{"rtt":([0-9.]+)\}\],"dup":0,"rcvd":1,"sent":1')


def _timed(call, who=resource.RUSAGE_SELF):
  return bench_decompress.timed(call, who)


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


_drain = bench_decompress.drain  # 16 MB at a time, as ingest reads (ingest.BLOCK_BYTES)


def _compressed(
  label: str, codec: str, path: str, text: bytes, results: int, work: str, repeat: int
) -> None:
  """Decompression alone (ingest's decompressor, Python's module, the tool), then ingest;
  each the fastest of `repeat` runs (on a shared machine the others' load only slows)."""

  def _timed(call, who=resource.RUSAGE_SELF):
    return bench_decompress.timed(call, who, repeat)

  threads = sorted({1, 2, decompress.usable_cores()})
  with open(path, "rb") as f:
    packed = f.read()
  module, tool = {"bz2": (bz2, "bzip2"), "gzip": (gzip, "gzip")}[codec]
  size = f", {len(text) / 1e6:.0f} MB of text, {len(packed) / 1e6:.1f} MB {codec}"
  print(f"{label}: {results:,} results{size}", flush=True)
  _, wall, cpu = _timed(lambda: module.decompress(packed))
  _print(label, f"Python {module.__name__} alone", results, wall, cpu)
  if shutil.which(tool):
    _, wall, cpu = _timed(
      lambda: subprocess.run([tool, "-dc", path], stdout=subprocess.DEVNULL, check=True),
      resource.RUSAGE_CHILDREN,
    )
    _print(label, f"{tool} -dc alone", results, wall, cpu)
  if codec == "gzip":
    try:
      import rapidgzip  # noqa: PLC0415 (not a dependency: for comparison only)
    except ImportError:
      rapidgzip = None
    for n in threads if rapidgzip else []:
      _, wall, cpu = _timed(lambda n=n: _drain(rapidgzip.open(path, parallelization=n)))
      _print(label, f"rapidgzip alone, {n} thread{'s' if n > 1 else ''}", results, wall, cpu)
  if codec == "bz2":  # ingest's decompressor before: Arrow's, one thread
    _, wall, cpu = _timed(lambda: _drain(decompress._ArrowStream(pa.OSFile(path), codec)))
    _print(label, "Arrow's bz2 stream alone", results, wall, cpu)
  for n in threads if codec == "bz2" else [1]:
    done, wall, cpu = _timed(lambda n=n: _drain(decompress.open_stream(pa.OSFile(path), codec, n)))
    assert done == len(text)
    what = f"ingest's decompressor, {n} thread{'s' if n > 1 else ''}"
    _print(label, what, results, wall, cpu, f", {len(text) / wall / 1e6:.0f} MB/s wall")
  for n in threads if codec == "bz2" else [1]:
    summary, wall, cpu = _timed(
      lambda n=n: ingest.ingest(
        [path], os.path.join(work, "out"), progress=False, decompress_threads=n
      )
    )
    what = f"ingest, decompress on {n} thread{'s' if n > 1 else ''}"
    _print(label, what, results, wall, cpu, f", {summary.counts.rows:,} rows")


def _three_packets(match: re.Match) -> bytes:
  rtt = match.group(1)
  return b'"result":[{"rtt":%s},{"rtt":%s},{"x":"*"}],"dup":0,"rcvd":2,"sent":3' % (rtt, rtt)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=int, default=300_000, help="results for the plain runs")
  parser.add_argument(
    "--bz2-rows", type=int, default=300_000, help="results for bz2 and gzip (at most --rows)"
  )
  parser.add_argument(
    "--parts",
    default="plain,array,bz2,gz",
    help="which inputs: plain (1 and 3 packets), array, bz2, gz (comma-separated)",
  )
  parser.add_argument(
    "--repeat", type=int, default=1, help="bz2 and gz: print the fastest of this many runs"
  )
  args = parser.parse_args()
  parts = set(args.parts.split(","))
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
      f" {os.cpu_count()} CPUs on this machine, {decompress.usable_cores()} usable"
    )
    reference._read(b'{"msm_id": 1}\n')  # DuckDB's one-off start (its JSON extension) untimed
    started = time.perf_counter()  # the scanner's machine code, compiled on first use ever
    scan.rows_of_block(
      reference.Block(lines[: lines.index(b"\n") + 1], 1, 1, "line"), path, reference.Counts(), True
    )
    print(
      f"scanner ready in {time.perf_counter() - started:.1f} s (compiled, or loaded from cache)"
    )
    for label, file in (("1 packet", path), ("3 packets", three)) if "plain" in parts else ():
      _readers(label, file, args.rows)
      _report(label, file, work, one_reader=True)
    os.remove(three)

    if "array" in parts:
      array = os.path.join(work, "array.json")
      with open(array, "wb") as f:
        f.write(b"[" + b",".join(lines.splitlines()) + b"]")
      _report("JSON array", array, work)
      os.remove(array)

    cut = 0
    for _ in range(min(args.bz2_rows, args.rows)):
      cut = lines.index(b"\n", cut) + 1
    text = lines[:cut]
    for part, codec, name, pack in (
      ("bz2", "bz2", "dump.json.bz2", bz2.compress),
      ("gz", "gzip", "dump.json.gz", gzip.compress),
    ):
      if part in parts:
        compressed = os.path.join(work, name)
        with open(compressed, "wb") as f:
          f.write(pack(text))
        _compressed(part, codec, compressed, text, min(args.bz2_rows, args.rows), work, args.repeat)
        os.remove(compressed)
  peak = prepare.peak_rss_bytes() / 2**20
  print(
    f"peak RSS of this process (generate and the input held in memory included): {peak:.0f} MiB"
  )


if __name__ == "__main__":
  main()
