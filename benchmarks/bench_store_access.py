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

    python benchmarks/bench_store_access.py --store PREPARED/FINGERPRINT --memory-limit MIB
        [--seconds 20] [--batch 32] [--threads 0]

A store larger than memory, on a machine where it is not: loads batches for `--seconds` in a
child process held to `--memory-limit` MiB (process and page cache together) by a memory
cgroup made for it (v1 or v2; needs root), the store's pages dropped first, once with each
`network_store_access` ("normal": the kernel's read-around; "random": MADV_RANDOM; "auto":
the one it picks under that limit), and prints batches/s, real tokens/s and MiB/s read from
disk for each. "random" reads the next batches' rows ahead (`BatchBuilder.read_ahead`);
`--threads` is `grain_num_threads` (in-process read threads).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
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
  from maxtext_netdata.input_pipeline import (  # noqa: PLC0415
    batch_kernel_loading,
    epoch_plan,
    network_grain,
  )
  from maxtext_netdata.input_pipeline.sequences import BatchBuilder  # noqa: PLC0415

  shutil.rmtree(os.path.join(root, "train", epoch_plan.PLANS_DIR), ignore_errors=True)
  start = time.perf_counter()
  builder = BatchBuilder.from_config(cfg, store.PreparedStore(os.path.join(root, "train")), 8)
  iterator = network_grain.make_iterator(cfg, builder, 0, 8, builder.num_steps, in_process=True)
  next(iterator)
  first = time.perf_counter() - start
  batch_kernel_loading.wait_ready()  # the machine code is timed, not its Python stand-in
  start = time.perf_counter()
  for _ in range(steps - 1):
    next(iterator)
  rate = (steps - 1) / (time.perf_counter() - start)
  iterator.close()
  return first, rate


_LIMITED = """
import json, os, sys, time
with open(sys.argv[1], "w") as f:  # this process into the memory cgroup
  f.write(str(os.getpid()))
import numpy as np
from maxtext_netdata import config
from maxtext_netdata.data.store import store
from maxtext_netdata.input_pipeline import batch_kernel_loading, network_grain
from maxtext_netdata.input_pipeline.sequences import BatchBuilder
root, access, batch, seconds = sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
cfg = config.load(os.path.join(sys.argv[6], "configs", "latency_network.yml"),
  ["grain_worker_count=0", f"global_batch_size_to_load={batch}", "grain_train_files=unused",
   f"network_store_access={access}", f"grain_num_threads={sys.argv[7]}"])
builder = BatchBuilder.from_config(cfg, store.PreparedStore(os.path.join(root, "train")), batch)
iterator = network_grain.make_iterator(cfg, builder, 0, batch, None, in_process=True)
def read_bytes():
  with open("/proc/self/io") as f:
    return int(dict(line.split(": ") for line in f.read().splitlines())["read_bytes"])
next(iterator)
batch_kernel_loading.wait_ready()  # (a machine's first run compiles it meanwhile)
start, read, batches, tokens = time.perf_counter(), read_bytes(), 0, 0
while time.perf_counter() - start < seconds:
  tokens += int(np.count_nonzero(next(iterator)["inputs_segmentation"]))
  batches += 1
took = time.perf_counter() - start
print(json.dumps([batches / took, tokens / took, (read_bytes() - read) / took, builder.store.access]))
iterator.close()
"""


def _memory_cgroup(limit_mib: int) -> tuple[str, str]:
  """(folder of a new memory cgroup under this process's, limited to `limit_mib` MiB, the
  file a process writes its pid into to join it)."""
  from maxtext_netdata.data.store import store  # noqa: PLC0415

  for base, limit_file in store.memory_cgroups():
    folder = os.path.join(base, f"bench_store_access_{os.getpid()}")
    try:
      os.mkdir(folder)
    except OSError:
      continue
    with open(os.path.join(folder, limit_file), "w") as f:
      f.write(str(limit_mib * 2**20))
    return folder, os.path.join(folder, "cgroup.procs")
  raise SystemExit("--memory-limit: no writable memory cgroup here (it needs root)")


def larger_than_memory(args) -> int:
  root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
  size = _drop_cache(os.path.join(args.store, "train"))
  print(
    f"train split {size / 2**20:,.0f} MiB; memory limit {args.memory_limit:,} MiB;"
    f" grain_num_threads={args.threads}"
  )
  folder, procs = _memory_cgroup(args.memory_limit)
  # Killed (SIGTERM), it still kills its child and removes its cgroup (the `finally`).
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
  try:
    for access in ("normal", "random", "auto"):
      _drop_cache(args.store)
      command = [sys.executable, "-c", _LIMITED, procs, args.store, access, str(args.batch)]
      command += [str(args.seconds), root, str(args.threads)]
      out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
      batches, tokens, read, chosen = json.loads(out.splitlines()[-1])
      name = f"auto ({chosen})" if access == "auto" else access
      print(
        f"{name:<13} {batches:8,.1f} batches/s of {args.batch} x 1024, {tokens / 1e6:6.2f}M"
        f" real tokens/s, {read / 2**20:7,.1f} MiB/s read"
      )
  finally:
    os.rmdir(folder)
  return 0


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--store", required=True, help="a prepared store: PREPARED_DIR/FINGERPRINT")
  parser.add_argument("--copy-to", help="folder for the copy (default: a temporary folder)")
  parser.add_argument("--steps", type=int, default=200, help="batches to load (default 200)")
  parser.add_argument("--memory-limit", type=int, help="MiB: load it larger than memory")
  parser.add_argument("--seconds", type=float, default=20.0, help="with --memory-limit")
  parser.add_argument("--batch", type=int, default=32, help="with --memory-limit: host batch")
  parser.add_argument(
    "--threads", type=int, default=0, help="with --memory-limit: grain_num_threads (default 0)"
  )
  args = parser.parse_args()
  if args.memory_limit:
    return larger_than_memory(args)

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
