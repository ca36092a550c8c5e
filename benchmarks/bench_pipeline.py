"""End-to-end speed of the network_grain pipeline against a naive per-row pipeline.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_pipeline.py [--rows 200000]
        [--batch 256] [--batches 40] [--seq-len 1024]

On one generated sample (`maxtext-netdata generate` defaults: 200k rows, 4 shards), prepared
once, prints:
- the batch builder's stages called directly (gather, build, shift_data), CPU ms per batch and
  real tokens per CPU second;
- real (non-PAD) tokens/s from the prepared store to shifted host batches, in-process
  (grain_worker_count=0) and with 2 worker processes, as wall rate and per busy core
  (tokens / CPU seconds of this process and its workers);
- time to the first batch of each (iterator creation to first batch, workers included);
- the padding share of those batches;
- a deliberately naive pipeline (per measurement Python: address text, per-block token lists
  as in tests/reference_tokenizer.py, one probe window per sequence, padded) on the same
  store, and the ratio of per-core rates.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time

import numpy as np
import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import reference_tokenizer as ref  # noqa: E402

from maxtext_netdata import config as config_lib  # noqa: E402
from maxtext_netdata.data import prepare  # noqa: E402
from maxtext_netdata.data.generate import generate  # noqa: E402
from maxtext_netdata.format import tokens as tk  # noqa: E402
from maxtext_netdata.input_pipeline import network_grain, transforms  # noqa: E402
from maxtext_netdata.input_pipeline.sequences import BatchBuilder  # noqa: E402


def cpu_seconds(process: psutil.Process) -> float:
  """CPU seconds of `process` and all its live children."""
  total = sum(process.cpu_times()[:2])
  for child in process.children(recursive=True):
    try:
      total += sum(child.cpu_times()[:2])
    except psutil.NoSuchProcess:
      pass
  return total


def run_grain(config, builder: BatchBuilder, batch: int, batches: int) -> dict:
  """Time `batches` host batches through the Grain iterator of `config`."""
  me = psutil.Process()
  start = time.perf_counter()
  iterator = network_grain.make_iterator(config, builder, 0, batch, builder.num_steps)
  next(iterator)
  first_s = time.perf_counter() - start
  real = total = 0
  steady_start, steady_cpu = time.perf_counter(), cpu_seconds(me)
  for _ in range(batches):
    inputs = next(iterator)["inputs"]
    real += int(np.count_nonzero(inputs != tk.PAD))
    total += inputs.size
  wall = time.perf_counter() - steady_start
  cpu = cpu_seconds(me) - steady_cpu
  iterator.close()
  return {
    "first_batch_s": first_s,
    "tokens_per_s": real / wall,
    "tokens_per_cpu_s": real / cpu,
    "padding": 1 - real / total,
  }


def run_stages(builder: BatchBuilder, batch: int, batches: int) -> dict:
  """The builder's stages called directly in this thread (no Grain): CPU seconds per batch."""
  times = {"gather": 0.0, "build": 0.0, "shift_data": 0.0}
  real = 0
  for step in range(batches):
    t0 = time.process_time()
    gathered = builder.gather(step, 0, batch)
    t1 = time.process_time()
    host = builder.build(gathered)
    t2 = time.process_time()
    host = transforms.shift_data(host)
    t3 = time.process_time()
    times["gather"] += t1 - t0
    times["build"] += t2 - t1
    times["shift_data"] += t3 - t2
    real += int(np.count_nonzero(host["inputs"] != tk.PAD))
  return {
    "tokens_per_cpu_s": real / sum(times.values()),
    **{f"{k}_ms": 1e3 * v / batches for k, v in times.items()},
  }


def _address(raw, version: int) -> str:
  family = socket.AF_INET if version == 4 else socket.AF_INET6
  return socket.inet_ntop(family, bytes(raw[: 4 if version == 4 else 16]))


def run_naive(store, seq_len: int, sequences: int, seed: int = 0) -> dict:
  """Per-row Python: a random probe window per sequence, every measurement tokenized alone."""
  rng = np.random.default_rng(seed)
  offsets = np.asarray(store.probe_offsets)
  real = 0
  start = time.process_time()
  for _ in range(sequences):
    probe = int(rng.integers(store.num_probes))
    lo, hi = int(offsets[probe]), int(offsets[probe + 1])
    row = int(rng.integers(lo, hi))
    version = int(store.probe_version[probe])
    src = _address(store.probe_src[probe], version)
    tokens: list[int] = []
    previous = None
    while row < hi:
      seconds = int(store.seconds[row])
      kind = "abs" if previous is None else "delta"
      value = seconds if previous is None else seconds - previous
      order = list(ref.FIXED_ORDER)
      rng.shuffle(order)
      rtt = -1.0 if store.failed[row] else float(store.rtt_ms[row])
      measurement = ref.encode_measurement(
        src, _address(store.dst[row], version), version, rtt, kind, value, order
      )
      if len(tokens) + len(measurement) > seq_len:
        break
      tokens += measurement
      previous = seconds
      row += 1
    real += len(tokens)
    _ = np.array(tokens + [tk.PAD] * (seq_len - len(tokens)), dtype=np.int32)
  cpu = time.process_time() - start
  return {"tokens_per_cpu_s": real / cpu, "padding": 1 - real / (sequences * seq_len)}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--rows", type=int, default=200_000)
  parser.add_argument("--shards", type=int, default=4)
  parser.add_argument("--batch", type=int, default=256, help="sequences per host batch")
  parser.add_argument("--batches", type=int, default=40, help="timed batches per variant")
  parser.add_argument("--seq-len", type=int, default=1024)
  parser.add_argument("--naive-sequences", type=int, default=200)
  parser.add_argument("--dir", help="work folder (default: a temporary one)")
  args = parser.parse_args()

  work = args.dir or tempfile.mkdtemp(prefix="bench_pipeline_")
  raw = os.path.join(work, "raw")
  if not os.path.isdir(raw):
    generate(raw, rows=args.rows, shards=args.shards, seed=0, progress=False)
  overrides = [
    f"grain_train_files={raw}/*.parquet",
    f"base_output_directory={work}",
    f"max_target_length={args.seq_len}",
    f"global_batch_size_to_load={args.batch}",
    "num_epoch=-1",
  ]
  config = config_lib.load(None, [*overrides, "grain_worker_count=0"])
  store = prepare.ensure_prepared(config, progress=False).train
  print(
    f"store: {store.num_rows} rows, {store.num_probes} probes; batch {args.batch} x {args.seq_len}"
  )

  stages = run_stages(BatchBuilder.from_config(config, store, args.batch), args.batch, args.batches)
  print(
    f"builder alone (no Grain, one thread): {stages['tokens_per_cpu_s'] / 1e6:.1f}M real"
    f" tokens/s per core; per batch gather {stages['gather_ms']:.2f} ms, build"
    f" {stages['build_ms']:.2f} ms, shift_data {stages['shift_data_ms']:.2f} ms"
  )
  results = {}
  for workers in (0, 2):
    config = config_lib.load(None, [*overrides, f"grain_worker_count={workers}"])
    builder = BatchBuilder.from_config(config, store, args.batch)
    results[workers] = r = run_grain(config, builder, args.batch, args.batches)
    print(
      f"grain_worker_count={workers}: first batch {r['first_batch_s']:.2f} s;"
      f" {r['tokens_per_s'] / 1e6:.1f}M real tokens/s wall,"
      f" {r['tokens_per_cpu_s'] / 1e6:.1f}M per busy core; padding {r['padding']:.2%}"
    )
  naive = run_naive(store, args.seq_len, args.naive_sequences)
  print(
    f"naive per-row pipeline: {naive['tokens_per_cpu_s'] / 1e6:.3f}M real tokens/s per core;"
    f" padding {naive['padding']:.2%}"
  )
  print(
    f"speed-up per core, in-process vs naive: "
    f"{results[0]['tokens_per_cpu_s'] / naive['tokens_per_cpu_s']:.0f}x"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
