"""The epoch plan at RIPE Atlas's scale: its time, its memory, and a row's lookup.

    python benchmarks/bench_plan.py [--rows 35e9] [--probes 12000] [--baseline-rows 1e8]

Plans one epoch of a store of `--rows` measurements over `--probes` probes (sizes drawn at
random about the mean; each measurement ~30 tokens, as RIPE's IPv4 pings) without a store:
the planner needs only each probe's row offsets and mean length. Prints the plan's time, its
arrays' bytes (beside the bytes of an array of every plan row's contexts and of the stream
order, the layout before), the process's peak RSS, and the time to find the plan rows and
contexts of a 32 x 1024 batch. `--baseline-rows` times that former layout's largest part,
the stream order as an argsort of a billion-row month's keys, at a size this machine holds,
in the same run.
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from maxtext_netdata.input_pipeline import epoch_plan, rng


def _stats(rows: int, probes: int, mean_length: float) -> epoch_plan.ProbeStats:
  sizes = np.random.default_rng(0).uniform(0.5, 1.5, probes)
  counts = np.floor(sizes / sizes.sum() * rows).astype(np.int64)
  counts[-1] += rows - counts.sum()
  offsets = np.zeros(probes + 1, dtype=np.int64)
  np.cumsum(counts, out=offsets[1:])
  return epoch_plan.ProbeStats(offsets=offsets, mean_length=np.full(probes, mean_length))


def _peak_rss_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=float, default=35e9, help="store rows (measurements)")
  parser.add_argument("--probes", type=int, default=12_000)
  parser.add_argument("--seq-len", type=int, default=1024)
  parser.add_argument("--mean-length", type=float, default=30.0, help="tokens a measurement")
  parser.add_argument("--baseline-rows", type=float, default=1e8)
  args = parser.parse_args()
  rows = int(args.rows)
  stats = _stats(rows, args.probes, args.mean_length)
  before = _peak_rss_mib()
  start = time.perf_counter()
  plan = epoch_plan.plan_epoch(
    stats, seq_len=args.seq_len, seed=0, epoch=0, packing=True, shuffle=True
  )
  seconds = time.perf_counter() - start
  size = sum(np.asarray(getattr(plan, f)).nbytes for f in plan.__dataclass_fields__)
  short_contexts = len(plan.short_probe)
  former = 8 * (2 * plan.num_rows + 1 + 3 * (plan.num_long + short_contexts))
  print(f"store: {rows:,} rows, {args.probes:,} probes; {plan.num_rows:,} plan rows")
  print(
    f"plan: {seconds * 1e3:.1f} ms, {size / 2**20:.2f} MiB ({size / rows:.2e} bytes a row);"
    f" an array of every plan row's contexts and the order: {former / 2**30:.1f} GiB"
    f" ({former / rows:.2f} bytes a row); peak RSS {before:.0f} -> {_peak_rss_mib():.0f} MiB"
  )
  positions = np.random.default_rng(1).integers(0, plan.num_rows, 32)
  plan.contexts(plan.rows_at(positions))  # rows_at's first call loads (or compiles) it
  repeats = 2000
  start = time.perf_counter()
  for _ in range(repeats):
    plan.rows_at(positions)
  lookup = (time.perf_counter() - start) / repeats
  start = time.perf_counter()
  for _ in range(repeats // 10):
    plan.contexts(plan.rows_at(positions))
  contexts = (time.perf_counter() - start) / (repeats // 10)
  print(
    f"a 32-row batch: plan rows {lookup * 1e6:.1f} us, with their contexts in numpy"
    f" {contexts * 1e6:.1f} us (the batch kernel finds both itself, per row)"
  )
  baseline = int(args.baseline_rows)
  base_plan_rows = int(plan.num_rows * baseline / rows)
  start = time.perf_counter()
  rng.permutation(rng.stream_key(0, 0, rng.SHUFFLE), base_plan_rows)
  argsort = time.perf_counter() - start
  print(
    f"baseline, the former order (an argsort of random keys) for {baseline:,} rows"
    f" ({base_plan_rows:,} plan rows): {argsort:.2f} s, {8 * base_plan_rows / 2**20:.0f} MiB;"
    f" at {rows:,} rows ~{argsort * rows / baseline / 60:.0f} min or more (n log n)"
  )


if __name__ == "__main__":
  main()
