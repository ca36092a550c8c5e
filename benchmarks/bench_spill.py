"""Benchmark of prepare's bucket spill at the bucket counts of a large dump.

    python benchmarks/bench_spill.py [--rows 16000000] [--shards 64] [--data DIR]
        [--buckets 8,100,1000,17500] [--repeat 2]

The built-in runner partitions the rows by probe bucket into one spill file per bucket, then
reads each bucket's file back to sort it (`data/prepare/local_runner.py`). The bucket count
follows the row count (2M rows a bucket at the default memory): RIPE Atlas's month, ~35
billion rows, is ~17,500 buckets, which no test data reaches. This runs the spill and the
read-back alone on `--rows` generated rows (reused from `--data`) with each bucket count
forced, in this process, and prints per row: CPU microseconds to spill (read, validate,
partition, write), CPU microseconds to read every bucket back, spill bytes; and the spill
files written (the fastest of `--repeat` runs each, prepare's kernels loaded first).

Only `local_runner.spill(config, options, files, metadata, buckets=, folder=, progress=)` and
`SpillWriter.read(bucket)` are called, so the same command runs on an older checkout
(`PYTHONPATH=<checkout>`) for a before/after comparison.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import tempfile
import time


def _folder_bytes(folder: str) -> int:
  return sum(os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--rows", type=int, default=16_000_000)
  parser.add_argument("--shards", type=int, default=64)
  parser.add_argument("--data", help="raw files' folder (generated there when empty)")
  parser.add_argument("--buckets", default="8,100,1000,17500")
  parser.add_argument("--repeat", type=int, default=2)
  args = parser.parse_args()

  from maxtext_netdata import config  # noqa: PLC0415
  from maxtext_netdata.data import remote  # noqa: PLC0415
  from maxtext_netdata.data.prepare import local_runner, row_kernels  # noqa: PLC0415
  from maxtext_netdata.data.raw import reader  # noqa: PLC0415
  from maxtext_netdata.data.synthetic.generate import generate  # noqa: PLC0415

  data = args.data or tempfile.mkdtemp(prefix="bench-spill-raw-")
  if not glob.glob(os.path.join(data, "*.parquet")):
    generate(data, rows=args.rows, shards=args.shards, seed=0, progress=True)
  cfg = config.load(None, [f"grain_train_files={data}/*.parquet"])
  options = remote.StorageOptions.from_config(cfg)
  files = remote.expand_all(cfg.grain_train_files, options)
  metadata = reader.check_files(files, options)
  rows = sum(m.num_rows for m in metadata)
  row_kernels.compile_seconds()  # kernels loaded (or compiled) before any timing
  work = tempfile.mkdtemp(prefix="bench-spill-")
  print(f"{rows:,} rows in {len(files)} files; times are CPU seconds of this process per row")
  print(f"{'buckets':>8} {'spill us/row':>13} {'read us/row':>12} {'bytes/row':>10} {'files':>7}")
  try:
    for buckets in [int(b) for b in args.buckets.split(",")]:
      best = None
      for attempt in range(args.repeat):
        folder = os.path.join(work, f"spill-{buckets}-{attempt}")
        start = time.process_time()
        writer, report = local_runner.spill(
          cfg, options, files, metadata, buckets=buckets, folder=folder, progress=False
        )
        spilled = time.process_time()
        size, count = _folder_bytes(folder), len(os.listdir(folder))
        spilled_at = time.process_time()
        for bucket in range(buckets):
          writer.read(bucket)
        read = time.process_time() - spilled_at
        shutil.rmtree(folder)
        figures = ((spilled - start) / report.rows_read * 1e6, read / report.rows_read * 1e6)
        if best is None or sum(figures) < sum(best[:2]):
          best = (*figures, size / report.rows_read, count)
      print(f"{buckets:>8} {best[0]:>13.3f} {best[1]:>12.3f} {best[2]:>10.1f} {best[3]:>7}")
  finally:
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
  main()
