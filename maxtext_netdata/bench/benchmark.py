"""`maxtext-netdata bench`: is data loading faster than the accelerator step, and if training
is still slow, why?

One command for what MaxText's pipeline-performance guide does by hand:
1. the target step time: the configured model trained on synthetic data (no loading cost), or
   `--target-step-time` measured on the real accelerator, or the accelerator estimate;
2. the configured pipeline alone, with no training: time per batch, first-batch latency, real
   tokens/s and per busy core; optionally for several `grain_worker_count` values;
3. training on the configured data, step time and data wait from the run's metrics.jsonl;
4. a per-stage breakdown of one batch (reading the store, building sequences, batching and
   ShiftData, moving to the device);
5. the tokens/s the accelerator would consume at 40% and 60% MFU and the host cores that takes;
6. a verdict in plain words, a terminal table, a JSON report and a PNG plot.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import numpy as np

from maxtext_netdata import config
from maxtext_netdata.bench import accelerators, loading, render
from maxtext_netdata.bench import profile as bench_profile
from maxtext_netdata.bench import report as bench_report
from maxtext_netdata.bench.arguments import WARMUP_STEPS
from maxtext_netdata.config import Config
from maxtext_netdata.distributed import mesh
from maxtext_netdata.errors import ConfigError
from maxtext_netdata.input_pipeline import batch_kernel_loading
from maxtext_netdata.trainer.profiler import trace_dir


def run(args: argparse.Namespace) -> int:
  if args.maxtext:
    from maxtext_netdata.bench import maxtext_bench

    return maxtext_bench.run(args)
  if args.loop_hook:
    raise ConfigError("--loop-hook patches MaxText: use it with --maxtext")
  cfg = config.load(args.config, args.overrides)
  sweep = loading.parse_sweep(args.sweep_workers)
  if args.steps < 0 or args.batches < 1:
    raise ConfigError(f"--steps={args.steps} must be >= 0 and --batches={args.batches} >= 1")
  if args.profile and args.steps < 2:
    raise ConfigError(f"--profile records real-data steps: it needs --steps >= 2, not {args.steps}")
  if args.target_step_time is not None and args.target_step_time <= 0:
    raise ConfigError(f"--target-step-time={args.target_step_time} must be positive")
  if cfg.dataset_type != "network_grain":
    raise ConfigError(
      f"bench measures the data pipeline: dataset_type must be network_grain, not"
      f" {cfg.dataset_type!r} (the synthetic run is made by bench itself)"
    )
  from maxtext_netdata.data.prepare import prepare

  loading.progress("preparing the store (cached after the first run)")
  prepare.ensure_prepared(cfg)
  report_path = Path(args.report) if args.report else cfg.run_dir / "bench" / "report.json"
  report = measure(cfg, args, sweep, report_path.parent)
  render.publish(report, report_path)
  return 0


def measure(cfg: Config, args: argparse.Namespace, sweep: list[int], out_dir: Path) -> dict:
  """Every figure of the report, the verdict included."""
  from maxtext_netdata.input_pipeline import interface

  device_mesh = mesh.make_mesh(cfg)
  devices = device_mesh.devices.size
  sequences = interface.global_batch_size(cfg, device_mesh) // jax.process_count()
  tokens_per_batch = sequences * cfg.max_target_length
  peak, chip = accelerators.resolve_peak_tflops(args.peak_tflops, args.accelerator, cfg)
  estimate = accelerators.estimate(cfg, chip, peak, tokens_per_batch, devices=devices)

  synthetic = real = None
  if args.steps > 0 and args.target_step_time is None:
    loading.progress(f"training {args.steps} + {WARMUP_STEPS} steps on synthetic data")
    synthetic = train_and_read_metrics(
      cfg, args.steps, out_dir / "synthetic", dataset_type="synthetic"
    )

  def load_alone(workers: int) -> dict:
    loading.progress(f"loading {args.batches} batches alone, grain_worker_count={workers}")
    return measure_loading(cfg.replace(grain_worker_count=workers), device_mesh, args.batches)

  loading_alone = load_alone(cfg.grain_worker_count)
  sweep_results = loading.sweep_workers(loading_alone, sweep, load_alone)

  profile = None
  if args.steps > 0:
    loading.progress(f"training {args.steps} + {WARMUP_STEPS} steps on the configured data")
    if args.profile:
      real = train_and_read_metrics(
        cfg, args.steps, out_dir / "real", **profiler_window(args.steps, perfetto=True)
      )
      profile = bench_profile.read(
        trace_dir(out_dir / "real"), step_module="train_step", first_step=WARMUP_STEPS
      )
    else:
      real = train_and_read_metrics(cfg, args.steps, out_dir / "real")

  loading.progress("timing the pipeline stages")
  stages = measure_stages(cfg, device_mesh, min(args.batches, 20))

  if args.target_step_time is not None:
    target = {"step_time_s": args.target_step_time, "source": "--target-step-time"}
    reference = args.target_step_time
  elif synthetic is not None:
    target = {
      "step_time_s": synthetic["step_time"]["median"],
      "source": "synthetic-data steps on this machine",
    }
    reference = target["step_time_s"]
  else:
    first = estimate["at_mfu"][0]
    target = {
      "step_time_s": first["step_time_s"],
      "source": f"estimate: {chip} at {first['mfu']:.0%} MFU of {peak:g} TFLOP/s",
    }
    reference = None

  recommendation = (
    bench_report.recommend_workers(sweep_results, target["step_time_s"]) if sweep_results else None
  )
  knob = bench_report.next_knob(
    loading_alone, loading.cpu_cores(), recommendation, stages["per_batch_s"]
  )
  verdict = bench_report.decide(
    target["step_time_s"], target["source"], loading_alone, real, reference, knob
  )
  return {
    "config": cfg.config_path,
    "overrides": list(args.overrides),
    "host": {
      "cpu_cores": loading.cpu_cores(),
      "devices": devices,
      "device_kind": jax.devices()[0].device_kind,
      "processes": jax.process_count(),
    },
    "batch": {
      "sequences": sequences,
      "max_target_length": cfg.max_target_length,
      "tokens": tokens_per_batch,
    },
    "target": target,
    "synthetic": synthetic,
    "real": real,
    "loading": loading_alone,
    "sweep": sweep_results,
    "recommended_workers": recommendation,
    "stages": stages,
    "accelerator": bench_report.with_loader_cores(estimate, loading_alone),
    "profile": profile,
    "verdict": bench_report.amend_verdict(verdict, profile) if profile else verdict,
  }


def measure_loading(cfg: Config, device_mesh, batches: int) -> dict:
  """Our pipeline alone, no training: `loading.time_loading` of `create_data_iterator`, the
  warm-up being the batches our worker and prefetch buffers hold."""
  from maxtext_netdata.input_pipeline import create_data_iterator

  workers = _resolved_workers(cfg, device_mesh)
  return loading.time_loading(
    lambda: create_data_iterator(cfg, device_mesh),
    lambda iterator: iterator.close(),
    batches=batches,
    warmup=workers * cfg.grain_per_worker_buffer_size + cfg.grain_prefetch_buffer_size,
    workers=workers,
    tokens_key="inputs_segmentation",
    ran_out_hint=f" (num_epoch={cfg.num_epoch}): use fewer --batches, more data or num_epoch=-1",
    ready=batch_kernel_loading.wait_ready,
  )


def measure_stages(cfg: Config, device_mesh, batches: int) -> dict:
  """Median seconds per host batch of each stage, run one after another in this process.

  Stages (see `input_pipeline.sequences`): `read` = epoch-plan lookup and gathering the
  store's rows, `build` = modes, fill and tokenizing into the batch, `batch` = ShiftData on the
  finished batch, `device` = `interface.to_global` until the arrays are on the device.
  Step 0 is run once first, untimed, to build the epoch plan.
  """
  from maxtext_netdata.data.prepare import prepare
  from maxtext_netdata.input_pipeline import interface, transforms
  from maxtext_netdata.input_pipeline.sequences import BatchBuilder

  size, sharding, lo, hi = interface.host_slice(cfg, device_mesh)
  builder = BatchBuilder.from_config(cfg, prepare.ensure_prepared(cfg, progress=False).train, size)
  times = {name: [] for name in ("read", "build", "batch", "device")}
  for step in range(batches + 1):
    t0 = time.perf_counter()
    gathered = builder.gather(step, lo, hi)
    t1 = time.perf_counter()
    host = builder.build(gathered)
    t2 = time.perf_counter()
    host = transforms.shift_data(host)
    t3 = time.perf_counter()
    jax.block_until_ready(interface.to_global(host, sharding, size))
    t4 = time.perf_counter()
    if step:
      for name, seconds in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
        times[name].append(seconds)
  per_batch = {name: float(np.median(values)) for name, values in times.items()}
  return {
    "batches": batches,
    "per_batch_s": per_batch,
    "slowest": bench_report.slowest_stage(per_batch),
  }


def profiler_window(steps: int, perfetto: bool) -> dict:
  """The trainer's profiler keys (`trainer.profiler`) that trace the `steps` steps after
  `train_and_read_metrics`'s warm-up, the compile left out, into `<run_dir>/profile`."""
  return {
    "profiler": "xplane",
    "skip_first_n_steps_for_profiler": WARMUP_STEPS,
    "profiler_steps": steps,
    "profiler_perfetto": perfetto,
  }


def train_and_read_metrics(cfg: Config, steps: int, run_dir: Path, **overrides) -> dict:
  """Trains `steps + WARMUP_STEPS` steps into `run_dir` and summarizes its metrics.jsonl.

  The loop is the configured one (logging, TensorBoard) but without eval, which is no step
  time, and without checkpoints: they are saved asynchronously, and a run must not resume
  from one a previous bench left behind.
  """
  from maxtext_netdata.trainer import train

  run_cfg = cfg.replace(
    steps=steps + WARMUP_STEPS,
    base_output_directory=str(run_dir.parent),
    run_name=run_dir.name,
    network_prepared_dir=cfg.prepared_dir,
    enable_checkpointing=False,
    eval_interval=-1,
    **overrides,
  )
  summary = train.train(run_cfg)
  with open(summary["metrics_path"], encoding="utf-8") as f:
    records = [json.loads(line) for line in f if line.strip()]
  records = [r for r in records if "step_time_s" in r]
  if len(records) <= WARMUP_STEPS:
    raise ConfigError(
      f"{summary['metrics_path']}: {len(records)} steps logged, expected {run_cfg.steps}"
      f" (the data ended? num_epoch={cfg.num_epoch})"
    )
  return bench_report.training_summary(records, WARMUP_STEPS)


def _resolved_workers(cfg: Config, device_mesh) -> int:
  """The worker count the pipeline will start (`grain_worker_count=-1` resolved)."""
  from maxtext_netdata.input_pipeline import interface, network_grain

  _, _, lo, hi = interface.host_slice(cfg, device_mesh)
  return network_grain.worker_count(
    cfg, network_grain.host_batch_bytes(hi - lo, cfg.max_target_length)
  )
