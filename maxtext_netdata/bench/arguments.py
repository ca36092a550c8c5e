"""`maxtext-netdata bench`'s arguments, apart from the benchmark so that `bench --help` answers
before jax, numba and the trainer are imported (0.3 s against 2.7 s)."""

from __future__ import annotations

import argparse

from maxtext_netdata.bench.chips import PEAK_TFLOPS

# Training steps left out of the step statistics: the first compiles, the second may still
# pay for the first step's metrics transfer.
WARMUP_STEPS = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument(
    "config", help="YAML config (dataset_type network_grain), or with --maxtext a MaxText YAML"
  )
  parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
  parser.add_argument(
    "--report", help="JSON report path (default <run_dir>/bench/report.json; the PNG beside)"
  )
  parser.add_argument(
    "--target-step-time",
    type=float,
    metavar="S",
    help="accelerator step time in seconds measured elsewhere; skips the synthetic-data run",
  )
  parser.add_argument(
    "--sweep-workers",
    metavar="LIST",
    help="comma-separated grain_worker_count values to time loading with, e.g. 0,1,2",
  )
  peak = parser.add_mutually_exclusive_group()
  peak.add_argument(
    "--peak-tflops", type=float, metavar="X", help="accelerator bf16 peak TFLOP/s per chip"
  )
  peak.add_argument(
    "--accelerator",
    choices=sorted(PEAK_TFLOPS),
    type=str.lower,
    help="take the peak of a listed chip (default: peak_tflops_per_device)",
  )
  parser.add_argument(
    "--steps",
    type=int,
    default=20,
    metavar="N",
    help=f"measured training steps per run, after {WARMUP_STEPS} warm-up; 0 skips training",
  )
  parser.add_argument(
    "--batches", type=int, default=100, metavar="M", help="measured loading batches"
  )
  parser.add_argument(
    "--maxtext",
    action="store_true",
    help="CONFIG is a MaxText config of any dataset type; run MaxText's own trainer and loader",
  )
  parser.add_argument(
    "--profile",
    action="store_true",
    help="record a JAX profiler trace of real-data steps and measure the accelerator's gaps",
  )
  parser.add_argument(
    "--loop-hook",
    metavar="MODULE:FUNCTION",
    help="with --maxtext: FUNCTION() patches MaxText (loop, pipeline) in every bench process",
  )
