"""The accelerator check's measured training runs and its sweeps (`bench.accelerator_check`).

`measure_training` condenses one training run (bench's) into the check's figures: step times,
data wait, tokens/s and MFU of configured and real tokens, device memory. The sweeps run the
configured model on synthetic data with each switch of `Sizes.switches`, then with each
`per_device_batch_size` of `Sizes.batch_scales`, within the check's `Budget`.
`profile_synthetic` runs the configured synthetic step under the profiler;
`measure_placed_synthetic` runs the synthetic batch placed on the devices anew every step,
`measure_fixed_network` one real batch placed once and handed out at every step.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import NamedTuple

import jax
import numpy as np

from maxtext_netdata.bench import benchmark, flops
from maxtext_netdata.bench import profile as bench_profile
from maxtext_netdata.bench.arguments import WARMUP_STEPS
from maxtext_netdata.config import Config
from maxtext_netdata.input_pipeline import interface, registry, synthetic
from maxtext_netdata.trainer import model
from maxtext_netdata.trainer.profiler import trace_dir

# The dataset types of `measure_placed_synthetic` and `measure_fixed_network`, each registered
# for its run only.
PLACED_SYNTHETIC = "synthetic_placed"
FIXED_NETWORK = "network_fixed"


class Sizes(NamedTuple):
  """How much each part measures."""

  rows: int  # generated measurements
  steps: int  # measured training steps per run, after WARMUP_STEPS
  batches: int  # measured loading batches per worker count
  workers: tuple[int, ...]  # grain_worker_count values of loading alone, up to the cores
  threads: tuple[int, ...]  # grain_num_threads values of in-process loading alone
  thread_tokens: float  # token slots each of those runs times: a second or more of CPU
  batch_scales: tuple[float, ...]  # multiples of per_device_batch_size swept
  sweep_steps: int  # measured steps per swept batch size
  overrides: tuple[str, ...]  # config overrides of the mode
  switches: tuple[dict[str, object], ...] = ()  # config changes tried against the configured run
  xla_options: tuple[str, ...] = ()  # `compile_xla_flags` values tried against the configured run
  attention_kernels: tuple[str, ...] = ()  # names of `attention_kernels.KERNELS` compared


class Budget:
  """The time left of the check's budget."""

  def __init__(self, seconds: float):
    self._deadline = time.monotonic() + seconds

  def left(self) -> float:
    return self._deadline - time.monotonic()


def measure_training(
  cfg: Config,
  steps: int,
  run_dir: Path,
  peak_tflops: float | None,
  devices: int,
  **overrides,
) -> dict:
  """`steps + WARMUP_STEPS` steps of `cfg` with `overrides` (bench's training run), condensed.

  Token rates and MFU use the median step; configured tokens are every slot of the global
  batch (MaxText's count), real tokens the median per step of the trainer's `real_tokens`.
  The data-wait share is the steady steps' waiting over their time. Device memory is the
  process's peak so far (None on a CPU).
  """
  start = time.perf_counter()
  summary = benchmark.train_and_read_metrics(cfg, steps, run_dir, **overrides)
  with open(run_dir / "metrics.jsonl", encoding="utf-8") as f:
    records = sorted((r for r in map(json.loads, f) if "step_time_s" in r), key=lambda r: r["step"])
  steady = records[WARMUP_STEPS:]
  run_cfg = cfg.replace(**overrides)
  slots = run_cfg.global_batch_size(devices) * run_cfg.max_target_length
  real = float(np.median([r["real_tokens"] for r in steady]))
  step = summary["step_time"]["median"]
  flops_per_token = model.training_flops_per_token(run_cfg)
  return {
    "per_device_batch_size": run_cfg.per_device_batch_size,
    "use_iota_embed": run_cfg.use_iota_embed,
    "wall_s": time.perf_counter() - start,
    "first_step_s": records[0]["step_time_s"],
    "step_time": summary["step_time"],
    "data_wait": summary["data_wait"],
    "data_wait_share": sum(r["data_wait_s"] for r in steady)
    / sum(r["step_time_s"] for r in steady),
    "tokens_per_step": slots,
    "real_tokens_per_step": real,
    "tokens_per_s": slots / step,
    "real_tokens_per_s": real / step,
    "mfu": flops.utilization(flops_per_token, slots / step, devices, peak_tflops),
    "mfu_real_tokens": flops.utilization(flops_per_token, real / step, devices, peak_tflops),
    "device_memory_peak_bytes": (jax.local_devices()[0].memory_stats() or {}).get(
      "peak_bytes_in_use"
    ),
    "run_dir": str(run_dir),
    "training": summary,
  }


def with_ratio(network: dict, synthetic: dict | None) -> dict:
  """`network` with its median step over the synthetic one (None without a synthetic run)."""
  reference = synthetic["step_time"]["median"] if synthetic else None
  ratio = network["step_time"]["median"] / reference if reference else None
  return {**network, "step_ratio_to_synthetic": ratio}


class _FreshCopies(synthetic.SyntheticIterator):
  """A host batch iterator (as `interface.DataIterator` takes) that returns a new copy of one
  host batch at every `next`: a new host buffer per step, as a loader hands out, with no
  loading work behind it. The state is the number of batches returned."""

  def __next__(self) -> dict[str, np.ndarray]:
    return {key: value.copy() for key, value in super().__next__().items()}

  def start_prefetch(self) -> None:
    pass


def placed_synthetic(config: Config, mesh) -> tuple:
  """The `synthetic` batch placed on the devices anew every step, through `network_grain`'s
  placement (`interface.DataIterator`, `device_prefetch` batches ahead)."""
  local, where = interface.synthetic_host_rows(config, mesh)
  train = interface.DataIterator(
    _FreshCopies(local), where.sharding, where.global_rows, config.device_prefetch
  )
  return train, None


def _measure_registered(name: str, factory, cfg: Config, *args, **overrides) -> dict:
  """`measure_training(cfg, *args, dataset_type=name, **overrides)` with `factory` registered
  as dataset type `name` for that run only."""
  registry.register_dataset_type(name, factory)
  try:
    return measure_training(cfg, *args, dataset_type=name, **overrides)
  finally:
    registry.unregister_dataset_type(name)


def measure_placed_synthetic(
  cfg: Config, steps: int, run_dir: Path, peak_tflops: float | None, devices: int
) -> dict:
  """`measure_training` of the synthetic batch placed anew every step (`placed_synthetic`).

  Between the synthetic step (one batch, on the devices once) and the real-data step, it
  splits a step ratio above 1: placing a new batch every step (this run slower than the
  synthetic one) or loading it (only the real-data run slower).
  """
  return _measure_registered(
    PLACED_SYNTHETIC, placed_synthetic, cfg, steps, run_dir, peak_tflops, devices
  )


def fixed_network(config: Config, mesh) -> tuple:
  """The first `network_grain` batch, placed on the devices once and handed out at every step
  as `synthetic` hands out its batch: the real data's values, with no placing or loading
  behind the step. The loader is closed before the first step."""
  train, evaluation = registry.factory("network_grain")(config, mesh)
  try:
    batch = next(train)
  finally:
    train.close()
    if evaluation is not None:
      evaluation.close()
  return synthetic.SyntheticIterator(batch), None


def measure_fixed_network(
  cfg: Config, steps: int, run_dir: Path, peak_tflops: float | None, devices: int, **overrides
) -> dict:
  """`measure_training` of one real batch on the devices, repeated (`fixed_network`).

  Against the synthetic step (random tokens, one full segment a row) it measures what the
  real data's values cost the device: the same kernels run on both, but the gradient of the
  embedding lookup is a scatter-add whose updates collide on the rows of frequent tokens,
  and real batches are skewed towards a few dozen byte tokens where the synthetic tokens
  spread evenly over the vocabulary. With `use_iota_embed=True` that gradient is a matmul.
  """
  return _measure_registered(
    FIXED_NETWORK, fixed_network, cfg, steps, run_dir, peak_tflops, devices, **overrides
  )


def sweep_batch_sizes(
  cfg: Config, sizes: Sizes, runs_dir: Path, configured: dict, env: dict, budget: Budget
) -> dict:
  """Synthetic steps at each `per_device_batch_size` of `sizes.batch_scales`, ascending.

  The configured size is the synthetic part's run. No further size runs after one that fails
  (out of memory: larger ones would too) or once the budget left is shorter than the
  configured size's run took (a cold compile included, as a new size's is); `stopped` says
  which.
  """
  configured_size = cfg.per_device_batch_size
  batch_sizes = sorted({max(1, round(configured_size * s)) for s in sizes.batch_scales})
  runs, stopped = [], None
  for size in batch_sizes:
    if size == configured_size:
      runs.append(_sweep_entry(configured))
      continue
    if stopped is not None:
      continue
    if budget.left() < configured["wall_s"]:
      stopped = f"per_device_batch_size={size} and the sizes after it: {budget.left():.0f} s left"
      continue
    try:
      run = _sweep_run(cfg, sizes, env, runs_dir / f"batch_{size}", per_device_batch_size=size)
    except Exception as e:  # out of memory, most likely; larger sizes would fail as well
      runs.append({"per_device_batch_size": size, "error": error_line(e)})
      stopped = f"per_device_batch_size={size} failed"
      continue
    runs.append(_sweep_entry(run))
  best = max((r for r in runs if "error" not in r), key=lambda r: r["tokens_per_s"])
  return {"runs": runs, "best": best["per_device_batch_size"], "stopped": stopped}


def sweep_switches(
  cfg: Config,
  sizes: Sizes,
  runs_dir: Path,
  configured: dict,
  env: dict,
  budget: Budget,
  switches: tuple[dict[str, object], ...] | None = None,
  name: str = "switch",
) -> dict:
  """Synthetic steps of the configured batch with each of `switches` (default
  `sizes.switches`) applied, into `runs_dir/<name>_<number>`.

  A switch that fails is recorded and the next one runs; none starts once the budget left is
  shorter than the configured run took. `best` is the fastest switch ({} when the configured
  settings are), `best_run` its run for the batch sweep.
  """
  keys = ("per_device_batch_size", "wall_s", "step_time", "tokens_per_s", "real_tokens_per_s")
  keys += ("mfu", "mfu_real_tokens")
  best = {"switches": {}, **{key: configured[key] for key in keys}}
  runs, stopped = [], None
  for number, switch in enumerate(sizes.switches if switches is None else switches):
    label = " ".join(f"{k}={v}" for k, v in switch.items())
    if budget.left() < configured["wall_s"]:
      stopped = f"{label} and the switches after it: {budget.left():.0f} s left"
      break
    try:
      run = _sweep_run(cfg, sizes, env, runs_dir / f"{name}_{number}", **switch)
    except Exception as e:  # cuDNN refusing the shapes, out of memory: the next one may run
      runs.append({"switches": switch, "error": error_line(e)})
      continue
    runs.append({"switches": switch, **{key: run[key] for key in keys}})
    if run["tokens_per_s"] > best["tokens_per_s"]:
      best = runs[-1]
  return {"runs": runs, "best": best["switches"], "best_run": best, "stopped": stopped}


def profile_synthetic(cfg: Config, work: Path, out: Path, peak, devices: int, steps: int) -> dict:
  """The configured step on synthetic data under the profiler: its idle share and device time
  by kernel class, to set beside the real-data step's (bench's profile): where a step ratio
  above 1 comes from, a busier device or an idle one. Its events (`steps` steps) go to
  `out/synthetic_profile_events.json.gz`."""
  run_dir = work / "runs" / "synthetic_profile"
  run = measure_training(
    cfg,
    steps + 1,
    run_dir,
    peak,
    devices,
    dataset_type="synthetic",
    **benchmark.profiler_window(steps + 1, perfetto=False),
  )
  events = bench_profile.read_events(bench_profile.find_xplane(trace_dir(run_dir)))
  analyzed = bench_profile.analyze_events(events, "train_step", first_step=WARMUP_STEPS)
  path = out / "synthetic_profile_events.json.gz"
  bench_profile.write_events(events, path, steps=steps)
  return {
    "median_step_s": run["step_time"]["median"],
    "step_time_s": analyzed["step_time_s"],
    "idle_share": analyzed["idle_share"],
    "device_time": analyzed["device_time"],
    "events": str(path),
  }


def _sweep_run(cfg: Config, sizes: Sizes, env: dict, run_dir: Path, **overrides) -> dict:
  """`measure_training` of a sweep's synthetic run: `sizes.sweep_steps` steps with `overrides`."""
  return measure_training(
    cfg,
    sizes.sweep_steps,
    run_dir,
    env["peak_tflops"],
    env["devices"],
    dataset_type="synthetic",
    **overrides,
  )


def _sweep_entry(run: dict) -> dict:
  keys = ("per_device_batch_size", "tokens_per_s", "real_tokens_per_s", "mfu", "mfu_real_tokens")
  return {**{key: run[key] for key in keys}, "step_time_s": run["step_time"]["median"]}


def error_line(error: BaseException) -> str:
  lines = str(error).strip().splitlines()
  return f"{type(error).__name__}: {lines[0] if lines else ''}"[:500]
