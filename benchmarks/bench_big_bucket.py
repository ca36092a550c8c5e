"""Benchmark of prepare's sort of buckets larger than one sort may hold.

    python benchmarks/bench_big_bucket.py [--rows 16000000] [--shards 64] [--data DIR]
        [--buckets 2] [--anchor-files K] [--memory-mb 1024] [--modes whole,sliced]

A bucket holds whole probes and probes differ in size, so at RIPE Atlas's scale some buckets
hold more rows than the memory budget can sort at once (an anchor alone has ~9M rows a
month; `data/prepare/bucket_sort.py`, `Slicer`). No generated dump of a test's size makes such
a bucket by itself, so this forces `--buckets` buckets on `--rows` generated rows (reused from
`--data`): with 2, each holds ~8M rows, over the 6.4M that one sort may hold at the default
1024 MiB. Or, with `--anchor-files K` (and `--buckets 0`: prepare's own count), the IPv4 rows
of the first K files are given one source address, one probe of that many rows (~175k a
file), as an anchor's would be. Each mode prepares the same rows from scratch in a fresh child process:
- `whole`: every bucket sorted at once whatever its size (the sort as it was before slices);
- `sliced`: a bucket over the budget cut into slices of at most 2M rows, each sorted alone.
It prints wall time, CPU microseconds per row, prepare's peak RSS, the largest sort and
whether the stores are byte-identical.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

CHILD = """
import json, os, resource, sys, time
from maxtext_netdata import config
from maxtext_netdata.data.prepare import bucket_sort, partition, prepare, row_kernels
mode, buckets, memory_mb, data, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], *sys.argv[4:]
if buckets:
  partition.num_buckets = lambda rows, memory_mb: buckets
if mode == "whole":
  partition.sort_rows = lambda memory_mb: 1 << 40
sorts = []
order_bucket = bucket_sort.order_bucket
def counted(chunks):
  ordered = order_bucket(chunks)
  sorts.append(ordered.num_rows)
  return ordered
bucket_sort.order_bucket = counted
row_kernels.compile_seconds()
cfg = config.load(None, [f"grain_train_files={data}/*.parquet", f"network_prepared_dir={out}",
                         f"network_prepare_memory_mb={memory_mb}"])
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu, start = usage.ru_utime + usage.ru_stime, time.perf_counter()
splits = prepare.prepare(cfg, progress=False, force=True)
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"seconds": time.perf_counter() - start,
                  "cpu": usage.ru_utime + usage.ru_stime - cpu,
                  "rows": splits.summary["rows_read"], "path": splits.summary["path"],
                  "peak_rss": prepare.peak_rss_bytes(), "sorts": sorts}))
"""


def _digest(path: str) -> str:
  """One hash of the files of a store's splits (names and bytes; not the top summary, which
  holds timings)."""
  digest = hashlib.sha256()
  for folder, dirs, names in sorted(os.walk(path)):
    dirs.sort()
    for name in sorted(names) if folder != path else ():
      digest.update(os.path.relpath(os.path.join(folder, name), path).encode())
      with open(os.path.join(folder, name), "rb") as f:
        for block in iter(lambda f=f: f.read(1 << 24), b""):
          digest.update(block)
  return digest.hexdigest()


def _anchor(data: str, files: int) -> str:
  """A copy of the raw files of `data` where the IPv4 rows of the first `files` files come
  from one source address (the others linked); its folder."""
  import pyarrow.compute as pc  # noqa: PLC0415
  import pyarrow.parquet as pq  # noqa: PLC0415

  out = f"{data.rstrip('/')}-anchor{files}"
  if glob.glob(os.path.join(out, "*.parquet")):
    return out
  os.makedirs(out, exist_ok=True)
  for i, path in enumerate(sorted(glob.glob(os.path.join(data, "*.parquet")))):
    target = os.path.join(out, os.path.basename(path))
    if i >= files:
      os.symlink(path, target)
      continue
    table = pq.read_table(path)
    v4 = pc.equal(table["ip_version"], 4)
    src = pc.if_else(v4, "192.0.2.1", table["src_addr"])
    pq.write_table(table.set_column(table.schema.get_field_index("src_addr"), "src_addr", src),
                   target)  # fmt: skip
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--rows", type=int, default=16_000_000)
  parser.add_argument("--shards", type=int, default=64)
  parser.add_argument("--data", help="raw files' folder (generated there when empty)")
  parser.add_argument("--buckets", type=int, default=2, help="0: prepare's own count")
  parser.add_argument("--anchor-files", type=int, default=0)
  parser.add_argument("--memory-mb", type=int, default=1024)
  parser.add_argument("--modes", default="whole,sliced")
  args = parser.parse_args()

  from maxtext_netdata.data.synthetic.generate import generate  # noqa: PLC0415

  data = args.data or tempfile.mkdtemp(prefix="bench-big-bucket-raw-")
  if not glob.glob(os.path.join(data, "*.parquet")):
    generate(data, rows=args.rows, shards=args.shards, seed=0, progress=True)
  if args.anchor_files:
    data = _anchor(data, args.anchor_files)
  work = tempfile.mkdtemp(prefix="bench-big-bucket-")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
  buckets = f"{args.buckets} buckets forced" if args.buckets else "prepare's own bucket count"
  print(f"{buckets}; network_prepare_memory_mb={args.memory_mb}; {data}")
  print(f"{'mode':>7} {'wall s':>7} {'CPU us/row':>11} {'peak RSS MiB':>13} {'largest sort':>13}")
  digests = {}
  for mode in args.modes.split(","):
    out = os.path.join(work, mode)
    command = [sys.executable, "-c", CHILD, mode, str(args.buckets), str(args.memory_mb), data, out]
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode:
      sys.exit(f"{mode}: prepare failed:\n{result.stderr[-3000:]}")
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    digests[mode] = _digest(figures["path"])
    print(
      f"{mode:>7} {figures['seconds']:>7.1f} {figures['cpu'] / figures['rows'] * 1e6:>11.3f}"
      f" {figures['peak_rss'] / 2**20:>13,.0f} {max(figures['sorts']):>13,}"
    )
  print(f"stores byte-identical: {len(set(digests.values())) == 1}")
  shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
  main()
