"""Soak test of the input pipeline: memory and file descriptors over many batches (not a CI test).

    python benchmarks/bench_soak.py [--batches 20000] [--workers 2] [--rows 400000]

Loads `--batches` host batches of configs/latency_network.yml's shape (1024 tokens x 32
sequences, one device) from generated data with `--workers` Grain worker processes, the
iterator the trainer uses. Every `--sample-every` batches it samples the resident memory of
the main process and of each worker, the main process's open file descriptors and its
/dev/shm entries in use; at the end it prints the drift after warm-up (least-squares slope,
MiB per 1,000 batches) of each, and the descriptor counts. Flat means no leak.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import psutil
from absl import flags

from maxtext_netdata import config as config_lib
from maxtext_netdata.data.prepare import prepare
from maxtext_netdata.data.synthetic.generate import generate
from maxtext_netdata.input_pipeline import network_grain
from maxtext_netdata.input_pipeline.sequences import BatchBuilder

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _workers(main: psutil.Process) -> list[psutil.Process]:
  return [
    p for p in main.children(recursive=True) if "resource_tracker" not in " ".join(p.cmdline())
  ]


def _sample(main: psutil.Process) -> dict:
  workers = _workers(main)
  return {
    "main_mib": main.memory_info().rss / 2**20,
    "workers_mib": [w.memory_info().rss / 2**20 for w in workers],
    "fds": main.num_fds(),
    "shm": len(os.listdir("/dev/shm")),
  }


def _drift(batches: np.ndarray, values: np.ndarray) -> float:
  """Least-squares slope of `values` over `batches`, per 1,000 batches."""
  return float(np.polyfit(batches, values, 1)[0] * 1000)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batches", type=int, default=20_000)
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--rows", type=int, default=400_000, help="generated raw rows")
  parser.add_argument("--sample-every", type=int, default=250)
  parser.add_argument("--warmup", type=int, default=1000, help="batches before drift counts")
  parser.add_argument("--data", help="existing raw parquet glob (default: generated)")
  args = parser.parse_args()
  flags.FLAGS.mark_as_parsed()  # an entry point: Grain's worker start reads absl flags

  with tempfile.TemporaryDirectory(prefix="soak_") as tmp:
    files = args.data
    if files is None:
      generate(os.path.join(tmp, "raw"), rows=args.rows, shards=4, seed=0, progress=False)
      files = os.path.join(tmp, "raw", "*.parquet")
    config = config_lib.load(
      os.path.join(REPO, "configs", "latency_network.yml"),
      [
        f"grain_train_files={files}",
        f"base_output_directory={tmp}",
        f"grain_worker_count={args.workers}",
        "num_epoch=-1",
      ],
    )
    batch = config.global_batch_size(1)
    splits = prepare.ensure_prepared(config, progress=False)
    builder = BatchBuilder.from_config(config, splits.train, batch)
    iterator = network_grain.HostBatchIterator(config, builder, 0, batch, None)
    main_process = psutil.Process()
    print(
      f"soak: {args.batches} batches of {batch} x {config.max_target_length} tokens,"
      f" {args.workers} workers, {builder.steps_per_epoch} steps per epoch",
      flush=True,
    )
    samples, start = [], time.perf_counter()
    try:
      for index in range(1, args.batches + 1):
        next(iterator)
        if index % args.sample_every == 0:
          sample = {"batch": index, **_sample(main_process)}
          samples.append(sample)
          if index % (args.sample_every * 8) == 0:
            print(
              f"  batch {index}: main {sample['main_mib']:.0f} MiB, workers"
              f" {', '.join(f'{m:.0f}' for m in sample['workers_mib'])} MiB,"
              f" fds {sample['fds']}, /dev/shm (whole machine) {sample['shm']}",
              flush=True,
            )
    finally:
      iterator.close()
    elapsed = time.perf_counter() - start

  steady = [s for s in samples if s["batch"] > args.warmup]
  if len(steady) < 2:
    print("soak: too few samples after warm-up; raise --batches", file=sys.stderr)
    return 1
  x = np.array([s["batch"] for s in steady], dtype=np.float64)
  workers = min(len(s["workers_mib"]) for s in steady)
  print(f"soak: {args.batches / elapsed:.0f} batches/s over {elapsed:.0f} s")
  print(
    f"soak: drift after {args.warmup} batches, MiB per 1,000 batches:"
    f" main {_drift(x, np.array([s['main_mib'] for s in steady])):+.3f}"
    + "".join(
      f", worker {w} {_drift(x, np.array([s['workers_mib'][w] for s in steady])):+.3f}"
      for w in range(workers)
    )
  )
  fds = [s["fds"] for s in steady]
  print(
    f"soak: open fds of the main process: first {fds[0]}, last {fds[-1]}, max {max(fds)};"
    f" main RSS {steady[0]['main_mib']:.0f} -> {steady[-1]['main_mib']:.0f} MiB"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
