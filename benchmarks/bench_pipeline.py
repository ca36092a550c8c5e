"""End-to-end speed of the network_grain pipeline beside this machine's memory-copy ceiling.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_pipeline.py [--rows 1000000]
        [--sizes 8,64,256] [--batches 40] [--seq-len 1024] [--dir DIR]

On one generated sample (`maxtext-netdata generate`, `--rows` rows), prepared once, prints:
- the batch kernel's first-ever compile (a fresh process with an empty NUMBA_CACHE_DIR) and
  its load from the on-disk cache (another fresh process), each with the first batch's time
  (built by the kernel's Python code while it compiles or loads), and the first batch after a
  trainer-like start-up (JAX's import and a compile) that the load overlaps; the kernel's
  Python code's ms per batch beside the kernel's;
- per host batch size (rows x seq-len), in-process (grain_worker_count=0), with Grain's read
  threads (grain_num_threads=2) and without (0, the default): real (non-PAD) tokens per CPU
  second of this process from the store to global `jax.Array`s (the Grain iterator, then
  `interface.to_global`), the time to the first global batch from iterator creation (a fresh
  builder: its epoch plan included; JAX warmed up first), ms per batch in the iterator's `next`
  and in to_global (`bench_e2e.py`), and the kernel's pass alone;
- the physical ceiling for the same output: a memcpy of the batch's six int32 arrays into
  reused buffers, as real tokens per second, and the share of it the pipeline reaches;
- with 2 worker processes, both placements of ShiftData (in the main process on the three
  inputs arrays the workers send, or in the workers' kernel pass, sending six): wall rate,
  rate per busy core (CPU of this process and its workers), and where the time goes (main
  process waiting for a batch, ShiftData, to_global; worker CPU per batch).
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import subprocess
import sys
import tempfile
import time

import grain
import jax
import numpy as np
from absl import flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_e2e  # noqa: E402

from maxtext_netdata import config as config_lib  # noqa: E402
from maxtext_netdata.bench import loading  # noqa: E402
from maxtext_netdata.format import tokens as tk  # noqa: E402
from maxtext_netdata.input_pipeline import (  # noqa: E402
  batch_kernel_loading,
  interface,
  network_grain,
  transforms,
  worker_blocks,
)
from maxtext_netdata.input_pipeline.sequences import KEYS, BatchBuilder  # noqa: E402

_COMPILE_SCRIPT = """
import sys, time
t0 = time.perf_counter()
from maxtext_netdata.data.store.store import PreparedStore
from maxtext_netdata.input_pipeline.sequences import BatchBuilder
t1 = time.perf_counter()
b = BatchBuilder(PreparedStore(sys.argv[1]), seq_len=1024, global_batch_size=8, seed=0,
  packing=True, shuffle=True, mode_weights=(0.4, 0.3, 0.3), field_order="random", num_epoch=-1)
if sys.argv[2] == "jax":  # a trainer's start-up between its data iterator and first batch
  import jax, jax.numpy as jnp
  jax.jit(lambda x: jnp.tanh(x @ x).sum()).lower(jnp.ones((256, 256))).compile()
rows = b.gather(0, 0, 8)
t2 = time.perf_counter()
b.build_shifted(rows)
t3 = time.perf_counter()
if sys.argv[2] == "many":  # a loop that asks for batches at once
  for step in range(1, int(sys.argv[3])):
    b.build_shifted(b.gather(step, 0, 8))
t5 = time.perf_counter()
from maxtext_netdata.input_pipeline import batch_kernel_loading
batch_kernel_loading.wait_ready()
t4 = time.perf_counter()
print(f"{t1 - t0:.3f} {t3 - t2:.3f} {t4 - t2:.3f} {t5 - t2:.3f}")
"""


def first_call(
  store_path: str, cache_dir: str, then: str = "", batches: int = 1
) -> tuple[float, float, float, float]:
  """(import seconds, first batch seconds, seconds until the kernel is loaded or compiled,
  seconds for `batches` batches) in a fresh process using `cache_dir`, each from the first
  batch's request; with `then="jax"`, JAX is imported and a small function compiled between
  the builder's creation and its first batch, with `then="many"`, `batches` batches are
  asked for at once."""
  env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir, "PYTHONPATH": ROOT}
  out = subprocess.run(
    [sys.executable, "-c", _COMPILE_SCRIPT, store_path, then or "-", str(batches)],
    capture_output=True,
    text=True,
    env=env,
    check=True,
  ).stdout.split()
  return float(out[0]), float(out[1]), float(out[2]), float(out[3])


def real_tokens(builder: BatchBuilder, rows: int, steps: range) -> int:
  """Non-PAD tokens of host batches `steps` (counted apart from the timed runs)."""
  return sum(
    int(np.count_nonzero(builder.build(builder.gather(s, 0, rows))["inputs"] != tk.PAD))
    for s in steps
  )


def kernel_ms(builder: BatchBuilder, rows: int, batches: int) -> float:
  """ms per host batch of the kernel's pass alone (all six arrays), this thread."""
  builder.build_shifted(builder.gather(0, 0, rows))
  batch_kernel_loading.wait_ready()  # the machine code, not the Python code that stands in meanwhile
  start = time.process_time()
  for step in range(1, batches + 1):
    builder.build_shifted(builder.gather(step, 0, rows))
  return 1e3 * (time.process_time() - start) / batches


def python_ms(builder: BatchBuilder, rows: int, batches: int) -> float:
  """ms per host batch of the kernel's Python code (what builds a new machine's first
  batches while the kernel compiles), this thread."""
  now = batch_kernel_loading.fill_batch_now
  batch_kernel_loading.fill_batch_now = lambda: batch_kernel_loading.python_fill_batch
  try:
    start = time.process_time()
    for step in range(1, batches + 1):
      builder.build_shifted(builder.gather(step, 0, rows))
    return 1e3 * (time.process_time() - start) / batches
  finally:
    batch_kernel_loading.fill_batch_now = now


def memcpy_ceiling(host: dict[str, np.ndarray], repeats: int = 200) -> float:
  """Seconds per copy of the six arrays into reused buffers (median of `repeats`)."""
  sources = [np.ascontiguousarray(host[k]) for k in KEYS]
  targets = [np.empty_like(a) for a in sources]
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    for target, source in zip(targets, sources, strict=True):
      np.copyto(target, source)
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def with_workers(config, store, rows: int, batches: int, sharding, shift_in_workers: bool) -> dict:
  """Two worker processes; ShiftData in the main process or fused in the workers' pass."""
  builder = BatchBuilder.from_config(config, store, rows)
  dataset = network_grain.make_dataset(builder, 0, rows, None, shifted=shift_in_workers)
  dataset = dataset.to_iter_dataset(
    grain.ReadOptions(
      num_threads=config.grain_num_threads, prefetch_buffer_size=config.grain_prefetch_buffer_size
    )
  ).mp_prefetch(
    grain.MultiprocessingOptions(
      num_workers=2, per_worker_buffer_size=config.grain_per_worker_buffer_size
    ),
    worker_init_fn=functools.partial(
      network_grain.start_worker, blocks := worker_blocks.new_prefix()
    ),
  )
  shift_map = transforms.ShiftData()  # as make_iterator places it: targets in reused buffers
  start = time.perf_counter()
  iterator = iter(dataset)
  try:  # the workers and their shared memory end whatever happens
    host = next(iterator)
    if not shift_in_workers:
      host = shift_map.map(host)
    jax.block_until_ready(interface.to_global(host, sharding, rows))
    first_s = time.perf_counter() - start
    for _ in range(3):  # let the workers' buffers fill as in steady state
      next(iterator)
    wait = shift = device = 0.0
    wall0, cpu0, main0 = time.perf_counter(), loading.cpu_seconds(), time.process_time()
    for _ in range(batches):
      t0 = time.perf_counter()
      host = next(iterator)
      t1 = time.perf_counter()
      if not shift_in_workers:
        host = shift_map.map(host)
      t2 = time.perf_counter()
      jax.block_until_ready(interface.to_global(host, sharding, rows))
      t3 = time.perf_counter()
      wait, shift, device = wait + t1 - t0, shift + t2 - t1, device + t3 - t2
    wall = time.perf_counter() - wall0
    cpu = loading.cpu_seconds(cpu0)
    main = time.process_time() - main0
  finally:
    iterator.close()
    # As the pipeline's own iterator ends (`HostBatchIterator.close`): the last batch's
    # blocks unlinked by Grain once garbage, those made and never handed over by us.
    host = iterator = None  # the iterator holds the batches it read ahead
    gc.collect()  # arrays in reference cycles (Grain's iterator) are garbage only then
    network_grain.release_shared_memory()
    worker_blocks.unlink_left(blocks, keep_mapped=True)
  real = real_tokens(builder, rows, range(4, 4 + batches))
  ms = 1e3 / batches
  return {
    "first_s": first_s,
    "wall_rate": real / wall,
    "per_cpu_s": real / cpu,
    "wait_ms": wait * ms,
    "shift_ms": shift * ms,
    "device_ms": device * ms,
    "main_cpu_ms": main * ms,
    "worker_cpu_ms": (cpu - main) * ms,
  }


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--rows", type=int, default=1_000_000)
  parser.add_argument("--sizes", default="8,64,256", help="host batch rows, comma-separated")
  parser.add_argument("--batches", type=int, default=40, help="timed batches per variant")
  parser.add_argument("--seq-len", type=int, default=1024)
  parser.add_argument("--dir", help="work folder (default: a temporary one)")
  args = parser.parse_args()
  flags.FLAGS.mark_as_parsed()  # Grain reads absl flags when it starts workers

  with bench_e2e.work_folder(args.dir, "bench_pipeline_") as work:
    return _main(args, work)


def _main(args, work: str) -> int:
  overrides, store = bench_e2e.sample(work, args.rows, args.seq_len)
  config = config_lib.load(None, overrides)
  print(f"store: {store.num_rows} rows, {store.num_probes} probes; {os.cpu_count()} cores")
  with tempfile.TemporaryDirectory(prefix="numba_cache_") as cache:
    import_s, first_s, compile_s, _ = first_call(store.path, cache)
    _, load_first_s, load_s, _ = first_call(store.path, cache)
    _, overlapped_s, _, _ = first_call(store.path, cache, "jax")
    _, _, _, many_s = first_call(store.path, cache, "many", 500)
  print(
    f"batch kernel: first-ever compile {compile_s:.2f} s (import {import_s:.2f} s), the first"
    f" 8x{args.seq_len} batch meanwhile by its Python code in {first_s:.3f} s; from the"
    f" on-disk cache in a new process {load_s:.3f} s (first batch {load_first_s:.3f} s),"
    f" first batch {overlapped_s:.3f} s when JAX's import and a compile come between builder"
    f" and batch; 500 batches asked for at once {many_s:.3f} s"
  )
  sharding = bench_e2e.one_device_sharding()
  print(
    "in-process, store -> global arrays: real tokens/s per core (wall) | first batch |"
    " next, to_global ms per batch | memcpy ceiling (share)"
  )
  for rows in (int(s) for s in args.sizes.split(",")):
    for threads in (2, 0):
      threaded = config_lib.load(None, [*overrides, f"grain_num_threads={threads}"])
      r = bench_e2e.in_process(threaded, store, rows, args.batches, sharding)
      ceiling = r["real_per_batch"] / memcpy_ceiling(r["host"])
      print(
        f"  {rows:4d} x {args.seq_len}, {threads} read threads: {r['per_cpu_s'] / 1e6:6.1f}M"
        f" ({r['wall_rate'] / 1e6:.1f}M) | {r['first_s']:.3f} s | {r['next_ms']:.2f},"
        f" {r['to_global_ms']:.2f} | {ceiling / 1e6:.0f}M ({r['per_cpu_s'] / ceiling:.0%});"
        f" padding {r['padding']:.2%}"
      )
    builder = BatchBuilder.from_config(config, store, rows)
    alone = kernel_ms(builder, rows, args.batches)
    python = python_ms(builder, rows, max(1, args.batches // 10))
    print(
      f"  {rows:4d} x {args.seq_len}, the kernel's pass alone: {alone:.2f} ms per batch,"
      f" {r['real_per_batch'] / alone / 1e3:.0f}M real tokens/s per core; its Python code"
      f" (while it compiles) {python:.1f} ms per batch ({python / alone:.0f}x)"
    )
  print("2 workers, store -> global arrays:")
  for rows in (int(s) for s in args.sizes.split(",")):
    for in_workers in (False, True):
      w = with_workers(config, store, rows, args.batches, sharding, in_workers)
      print(
        f"  {rows:4d} x {args.seq_len}, ShiftData in {'workers' if in_workers else 'main   '}:"
        f" {w['wall_rate'] / 1e6:6.1f}M real tokens/s wall, {w['per_cpu_s'] / 1e6:5.1f}M per"
        f" busy core; first batch {w['first_s']:.2f} s; per batch: main waits"
        f" {w['wait_ms']:.2f} ms, ShiftData {w['shift_ms']:.2f}, to_global"
        f" {w['device_ms']:.2f}; CPU main {w['main_cpu_ms']:.2f} ms, workers"
        f" {w['worker_cpu_ms']:.2f} ms"
      )
  return 0


if __name__ == "__main__":
  sys.exit(main())
