"""Benchmark: train from a store read in place, or copy it to local disk first?

    python benchmarks/bench_store_access.py --store PREPARED/FINGERPRINT [--copy-to DIR]
        [--steps 200]

For a store on a mount (shared or local), the pipeline can map it where it is or copy it to a
local folder once (what `prepare` does for gs:// and s3://). This loads `--steps` batches of
`configs/latency_network.yml` (8 sequences, in-process) from the store in place with its pages
dropped from page cache first (`posix_fadvise(DONTNEED)` on its files only, so nothing else on
the machine is disturbed), then copies it (`pyarrow.fs.copy_files`, as `data.store.remote_copy`
does) to `--copy-to` and loads from the copy, warm (as it is right after copying) and cold.
It prints the copy's time and the first batch and batches/s of each.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time


def _drop_cache(folder: str) -> int:
  """Drop `folder`'s files from page cache; their total bytes."""
  total = 0
  for parent, _, names in os.walk(folder):
    for name in names:
      path = os.path.join(parent, name)
      fd = os.open(path, os.O_RDONLY)
      try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        total += os.fstat(fd).st_size
      finally:
        os.close(fd)
  return total


def _load(cfg, root: str, steps: int) -> tuple[float, float]:
  """(first batch seconds, batches/s after it) from the store at `root`, plans not cached."""
  from maxtext_netdata.data.store import store  # noqa: PLC0415
  from maxtext_netdata.input_pipeline import epoch_plan, network_grain  # noqa: PLC0415
  from maxtext_netdata.input_pipeline.sequences import BatchBuilder  # noqa: PLC0415

  shutil.rmtree(os.path.join(root, "train", epoch_plan.PLANS_DIR), ignore_errors=True)
  start = time.perf_counter()
  builder = BatchBuilder.from_config(cfg, store.PreparedStore(os.path.join(root, "train")), 8)
  iterator = network_grain.make_iterator(cfg, builder, 0, 8, builder.num_steps, in_process=True)
  next(iterator)
  first = time.perf_counter() - start
  start = time.perf_counter()
  for _ in range(steps - 1):
    next(iterator)
  rate = (steps - 1) / (time.perf_counter() - start)
  iterator.close()
  return first, rate


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--store", required=True, help="a prepared store: PREPARED_DIR/FINGERPRINT")
  parser.add_argument("--copy-to", help="folder for the copy (default: a temporary folder)")
  parser.add_argument("--steps", type=int, default=200, help="batches to load (default 200)")
  args = parser.parse_args()

  import pyarrow.fs as pafs  # noqa: PLC0415

  from maxtext_netdata import config  # noqa: PLC0415

  root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
  cfg = config.load(
    os.path.join(root, "configs", "latency_network.yml"),
    ["grain_worker_count=0", "global_batch_size_to_load=8", "grain_train_files=unused"],
  )
  _load(cfg, args.store, 3)  # compiles the batch kernel outside the timings
  size = _drop_cache(args.store)
  in_place = _load(cfg, args.store, args.steps)
  work = tempfile.mkdtemp(dir=args.copy_to)
  try:
    copy = os.path.join(work, os.path.basename(args.store.rstrip("/")))
    _drop_cache(args.store)
    start = time.perf_counter()
    local = pafs.LocalFileSystem()
    pafs.copy_files(args.store, copy, source_filesystem=local, destination_filesystem=local)
    copy_s = time.perf_counter() - start
    warm = _load(cfg, copy, args.steps)
    _drop_cache(copy)
    cold = _load(cfg, copy, args.steps)
  finally:
    shutil.rmtree(work, ignore_errors=True)
  print(f"store                 {size / 2**20:,.0f} MiB at {args.store}")
  print(f"copy                  {copy_s:.2f} s ({size / 2**20 / copy_s:,.0f} MiB/s)")
  for name, (first, rate) in (
    ("in place, cold", in_place),
    ("copy, warm", warm),
    ("copy, cold", cold),
  ):
    print(f"{name:<21} first batch {first:.2f} s, {rate:,.0f} batches/s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
