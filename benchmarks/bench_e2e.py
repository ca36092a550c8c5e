"""Store -> global jax.Arrays in one process: real tokens per CPU second, through the public API.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_e2e.py [--rows 1000000]
        [--sizes 8,64,256] [--batches 40] [--threads 2,0] [--dir DIR]

Uses only what every version of the pipeline has (`config.load`, `prepare.ensure_prepared`,
`BatchBuilder.from_config`, `network_grain.make_iterator(in_process=True)`,
`interface.to_global`), so the same command measures an older checkout for a before/after
comparison (run it with that checkout first on PYTHONPATH). `bench_pipeline.py` prints these
figures beside the memory-copy ceiling and the worker placements.

Per host batch size and Grain read-thread count: real (non-PAD) tokens per CPU second of this
process, wall rate, time to the first global batch from iterator creation (a fresh builder,
its epoch plan included; JAX warmed up first), and per batch the time in the iterator's
`next` (with 0 read threads: the whole build, synchronously) and in `to_global`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time

import jax
import numpy as np

from maxtext_netdata import config as config_lib
from maxtext_netdata.data.prepare import prepare
from maxtext_netdata.data.synthetic.generate import generate
from maxtext_netdata.format import tokens as tk
from maxtext_netdata.input_pipeline import batch_kernel_loading, interface, network_grain
from maxtext_netdata.input_pipeline.sequences import KEYS, BatchBuilder


@contextlib.contextmanager
def work_folder(folder: str | None, prefix: str):
  """`folder` (`--dir`, kept), or a temporary folder removed when the benchmark ends, however
  it ends (its store is tens of MB)."""
  if folder:
    yield folder
    return
  with tempfile.TemporaryDirectory(prefix=prefix) as temporary:
    yield temporary


def sample(work: str, rows: int, seq_len: int) -> tuple[list[str], object]:
  """(config overrides, train store) of a generated sample under `work`, prepared once."""
  raw = os.path.join(work, "raw")
  if not os.path.isdir(raw):
    generate(raw, rows=rows, shards=4, seed=0, progress=False)
  overrides = [
    f"grain_train_files={raw}/*.parquet",
    f"base_output_directory={work}",
    f"max_target_length={seq_len}",
    "num_epoch=-1",
    "grain_worker_count=0",
  ]
  config = config_lib.load(None, overrides)
  return overrides, prepare.ensure_prepared(config, progress=False).train


def one_device_sharding() -> jax.sharding.Sharding:
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))


def in_process(config, store, rows: int, batches: int, sharding) -> dict:
  """Store -> global arrays through the in-process Grain iterator, per CPU second."""
  builder = BatchBuilder.from_config(config, store, rows)
  warm = {key: np.zeros((rows, builder.seq_len), np.int32) for key in KEYS}
  jax.block_until_ready(interface.to_global(warm, sharding, rows))
  start = time.perf_counter()
  iterator = network_grain.make_iterator(config, builder, 0, rows, None, in_process=True)
  jax.block_until_ready(interface.to_global(next(iterator), sharding, rows))
  first_s = time.perf_counter() - start
  batch_kernel_loading.wait_ready()  # the timed batches by the machine code, not its Python stand-in
  wall = cpu = in_next = in_global = 0.0
  real = 0
  for _ in range(batches):
    w0, c0 = time.perf_counter(), time.process_time()
    host = next(iterator)
    w1 = time.perf_counter()
    jax.block_until_ready(interface.to_global(host, sharding, rows))
    w2 = time.perf_counter()
    wall, cpu = wall + w2 - w0, cpu + time.process_time() - c0
    in_next, in_global = in_next + w1 - w0, in_global + w2 - w1
    real += int(np.count_nonzero(host["inputs"] != tk.PAD))  # untimed
  iterator.close()
  return {
    "first_s": first_s,
    "per_cpu_s": real / cpu,
    "wall_rate": real / wall,
    "real_per_batch": real / batches,
    "padding": 1 - real / (batches * rows * builder.seq_len),
    "next_ms": 1e3 * in_next / batches,
    "to_global_ms": 1e3 * in_global / batches,
    "host": host,
  }


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--rows", type=int, default=1_000_000)
  parser.add_argument("--sizes", default="8,64,256", help="host batch rows, comma-separated")
  parser.add_argument("--threads", default="2,0", help="grain_num_threads values")
  parser.add_argument("--batches", type=int, default=40, help="timed batches per variant")
  parser.add_argument("--seq-len", type=int, default=1024)
  parser.add_argument("--dir", help="work folder (default: a temporary one)")
  args = parser.parse_args()
  with work_folder(args.dir, "bench_e2e_") as work:
    return _main(args, work)


def _main(args, work: str) -> int:
  overrides, store = sample(work, args.rows, args.seq_len)
  print(f"store: {store.num_rows} rows, {store.num_probes} probes")
  sharding = one_device_sharding()
  for rows in (int(s) for s in args.sizes.split(",")):
    for threads in (int(t) for t in args.threads.split(",")):
      config = config_lib.load(None, [*overrides, f"grain_num_threads={threads}"])
      r = in_process(config, store, rows, args.batches, sharding)
      print(
        f"  {rows:4d} x {args.seq_len}, {threads} read threads: {r['per_cpu_s'] / 1e6:6.1f}M"
        f" real tokens/s per core ({r['wall_rate'] / 1e6:.1f}M wall); first batch"
        f" {r['first_s']:.3f} s; per batch next {r['next_ms']:.2f} ms, to_global"
        f" {r['to_global_ms']:.2f} ms; padding {r['padding']:.2%}"
      )
  return 0


if __name__ == "__main__":
  sys.exit(main())
