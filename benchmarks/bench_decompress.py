"""How `ingest`'s bz2 decompression scales with threads on this machine's cores.

One hourly RIPE Atlas dump is one bz2 file; ingest reads it through `data.ripe.decompress`
(indexed_bzip2's parallel reader, `--decompress-threads`). This times decompression alone,
the part ingest cannot spread over files, on `--threads` threads (default 1, 2, 4, ... up to
the usable cores) beside Python's `bz2` module and `bzip2 -dc`, over `generate --format
ripe-json` results compressed as one bz2 stream (what `bzip2` writes). It needs neither
DuckDB nor the compiled scanner, so it also runs on an accelerator host that has only the
wheels of `scripts/accelerator_wheels.sh`; `benchmarks/bench_ingest.py --parts bz2` times
the whole ingest beside it.

Per core = results / CPU seconds of this process (all threads; for `bzip2 -dc` its own);
speed-up = one thread's wall time / this wall time.

  .venv/bin/python benchmarks/bench_decompress.py [--rows 200000] [--threads 1,2,4,8,16]
"""

from __future__ import annotations

import argparse
import bz2
import os
import resource
import shutil
import subprocess
import tempfile
import time

import pyarrow as pa

from maxtext_netdata.data.ripe import decompress
from maxtext_netdata.data.synthetic.generate import generate


def cpu_seconds(who: int) -> float:
  usage = resource.getrusage(who)
  return usage.ru_utime + usage.ru_stime


def timed(call, who: int = resource.RUSAGE_SELF, repeat: int = 1):
  """(result, wall s, CPU s) of the fastest of `repeat` calls (shared with bench_ingest.py)."""
  best = None
  for _ in range(repeat):
    wall, cpu = time.perf_counter(), cpu_seconds(who)
    result = call()
    timed = (result, time.perf_counter() - wall, cpu_seconds(who) - cpu)
    best = timed if best is None or timed[1] < best[1] else best
  return best


def drain(stream) -> int:
  """Bytes of text read, a block at a time as ingest reads them."""
  try:
    return sum(len(piece) for piece in iter(lambda: stream.read(16 * 2**20), b""))
  finally:
    stream.close()


def _thread_counts(text: str | None) -> list[int]:
  cores = decompress.usable_cores()
  if text:
    return [int(n) for n in text.split(",")]
  counts, n = [], 1
  while n < cores:
    counts.append(n)
    n *= 2
  return [*counts, cores]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=int, default=200_000, help="results in the bz2 file")
  parser.add_argument(
    "--threads", help="comma-separated thread counts (default 1, 2, 4, ... and every core)"
  )
  parser.add_argument("--repeat", type=int, default=2, help="print the fastest of this many runs")
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as work:
    [path] = generate(
      os.path.join(work, "json"), rows=args.rows, shards=1, progress=False, fmt="ripe-json"
    )
    with open(path, "rb") as f:
      text = f.read()
    packed_path = os.path.join(work, "dump.json.bz2")
    with open(packed_path, "wb") as f:
      f.write(bz2.compress(text))
    rows, size = args.rows, len(text)
    print(
      f"{rows:,} results, {size / 1e6:.0f} MB of text, "
      f"{os.path.getsize(packed_path) / 1e6:.1f} MB bz2; {os.cpu_count()} CPUs, "
      f"{decompress.usable_cores()} usable",
      flush=True,
    )

    def line(what: str, wall: float, cpu: float, speedup: str = "") -> None:
      print(
        f"{what:<34} {rows / cpu / 1e6:5.2f}M results/s per core, "
        f"{rows / wall / 1e6:6.2f}M/s wall, {size / wall / 1e6:6.0f} MB/s wall{speedup}",
        flush=True,
      )

    with open(packed_path, "rb") as f:
      packed = f.read()
    _, wall, cpu = timed(lambda: bz2.decompress(packed), repeat=args.repeat)
    line("Python bz2", wall, cpu)
    if shutil.which("bzip2"):
      command = ["bzip2", "-dc", packed_path]
      _, wall, cpu = timed(
        lambda: subprocess.run(command, stdout=subprocess.DEVNULL, check=True),
        resource.RUSAGE_CHILDREN,
        args.repeat,
      )
      line("bzip2 -dc", wall, cpu)
    one = None
    for n in _thread_counts(args.threads):
      done, wall, cpu = timed(
        lambda n=n: drain(decompress.open_stream(pa.OSFile(packed_path), "bz2", n)),
        repeat=args.repeat,
      )
      assert done == size, f"{n} threads gave {done} bytes of {size}"
      one = one or wall
      what = f"ingest's reader, {n} thread{'s' if n > 1 else ''}"
      line(what, wall, cpu, f", {one / wall:4.1f}x one thread")


if __name__ == "__main__":
  main()
