"""`ingest` of a synthetic day of 16 hourly dumps, by the built-in runner and on Beam.

The day is `generate --format ripe-json`'s results in 16 time-ordered files (as RIPE's hourly
dumps), each result given three packets (two replies and a timeout, as real ping results
mostly are; `bench_ingest.py`'s rewrite), as plain JSON lines and as `.bz2` (the dumps' own
compression). Each set of files is ingested, back to back in this process:
- `builtin`: `ingest` without `--runner` (blocks mapped in threads, one run sorted in
  memory, or runs merged);
- `beam 1 worker`: `--runner beam` on Beam's DirectRunner in this process, one file at a time
  (what one worker of a distributed runner does, plus the merge);
- `beam N workers`: DirectRunner in multi-processing mode, `--workers` worker processes.
Each Beam run's files and `.complete` marker are compared with the built-in runner's, byte for
byte. Times are wall-clock seconds; results/s is over all of the day's results. First each
variant ingests one file of 1,000 results: its fixed cost (the DirectRunner's start, and in
multi-processing mode its worker processes' start and imports), paid once a run.

  .venv/bin/python benchmarks/bench_ingest_beam.py [--results-per-file 20000] [--workers 2]
      [--repeat 1] [--no-bz2]
"""

from __future__ import annotations

import argparse
import bz2
import os
import re
import shutil
import tempfile
import time

from maxtext_netdata.data.ripe import beam_runner, ingest, scan
from maxtext_netdata.data.synthetic.generate import generate

FILES = 16  # hourly dumps of a synthetic "day"
_ONE_REPLY = re.compile(rb'"result":\[\{"rtt":([0-9.]+)\}\],"dup":0,"rcvd":1,"sent":1')


def _three_packets(match: re.Match) -> bytes:
  rtt = float(match.group(1))
  return b'"result":[{"rtt":%.3f},{"rtt":%.3f},{"x":"*"}],"dup":0,"rcvd":2,"sent":3' % (
    rtt,
    rtt * 1.01,
  )


def _day(work: str, results_per_file: int, compress: bool) -> tuple[list[str], list[str]]:
  """The day's 16 files of JSON lines, and the same compressed with bz2 (when asked)."""
  paths = generate(
    os.path.join(work, "generated"),
    rows=FILES * results_per_file,
    shards=FILES,
    seed=7,
    progress=False,
    fmt="ripe-json",
  )
  plain, packed = [], []
  os.makedirs(os.path.join(work, "day"))
  for hour, path in enumerate(paths):
    with open(path, "rb") as f:
      lines = _ONE_REPLY.sub(_three_packets, f.read())
    plain.append(os.path.join(work, "day", f"ping-2025-07-01T{hour:02d}00.json"))
    with open(plain[-1], "wb") as f:
      f.write(lines)
    if compress:
      packed.append(plain[-1] + ".bz2")
      with open(packed[-1], "wb") as f:
        f.write(bz2.compress(lines, 6))
  shutil.rmtree(os.path.join(work, "generated"))
  return plain, packed


def _files(folder: str) -> dict[str, bytes]:
  return {
    name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))
  }


def _time(label: str, results: int, call) -> float:
  started = time.perf_counter()
  call()
  seconds = time.perf_counter() - started
  print(f"  {label:<18} {seconds:7.2f} s  {results / seconds / 1e3:7.1f}k results/s", flush=True)
  return seconds


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--results-per-file", type=int, default=20_000)
  parser.add_argument("--workers", type=int, default=2, help="DirectRunner worker processes")
  parser.add_argument("--repeat", type=int, default=1, help="times each variant runs")
  parser.add_argument("--no-bz2", action="store_true", help="plain JSON lines only")
  args = parser.parse_args()
  results = FILES * args.results_per_file
  with tempfile.TemporaryDirectory(prefix="bench-ingest-beam-") as work:
    plain, packed = _day(work, args.results_per_file, not args.no_bz2)
    scan.load()  # the scanner's machine code compiled or loaded, untimed
    print(
      f"a day of {FILES} hourly files, {results:,} results ({3 * results:,} rows),"
      f" {sum(map(os.path.getsize, plain)) / 1e6:.0f} MB of JSON lines"
      + (f", {sum(map(os.path.getsize, packed)) / 1e6:.0f} MB as bz2" if packed else "")
      + f"; {os.cpu_count()} CPUs"
    )
    direct = ["--runner=DirectRunner"]
    variants = [
      ("builtin", lambda files, out: ingest.ingest(files, out, progress=False)),
      (
        "beam 1 worker",
        lambda files, out: beam_runner.ingest(
          files, out, beam_args=[*direct, "--direct_num_workers=1"]
        ),
      ),
      (
        f"beam {args.workers} workers",
        lambda files, out: beam_runner.ingest(
          files,
          out,
          beam_args=[
            *direct,
            f"--direct_num_workers={args.workers}",
            "--direct_running_mode=multi_processing",
          ],
        ),
      ),
    ]
    tiny = os.path.join(work, "tiny.json")  # the fixed cost: starting the runner and workers
    with open(plain[0], "rb") as f, open(tiny, "wb") as t:
      t.writelines(line for _, line in zip(range(1_000), f, strict=False))
    print("fixed cost (1 file of 1,000 results):")
    for label, call in variants:
      _time(label, 1_000, lambda call=call: call([tiny], os.path.join(work, "out", "tiny")))
    for kind, files in (("JSON lines", plain), ("bz2", packed)):
      if not files:
        continue
      print(f"{kind}:")
      outputs = {}
      for _ in range(args.repeat):
        for label, call in variants:
          out = os.path.join(work, "out", label.replace(" ", "-"))
          _time(label, results, lambda call=call, out=out, files=files: call(files, out))
          outputs[label] = out
      builtin = _files(outputs["builtin"])
      for label, out in outputs.items():
        if label != "builtin":
          same = _files(out) == builtin
          print(f"  {label}: {len(builtin)} files and marker byte-identical to builtin: {same}")


if __name__ == "__main__":
  main()
