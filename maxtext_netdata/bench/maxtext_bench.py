"""`maxtext-netdata bench --maxtext MAXTEXT_YAML`: the guide's procedure on MaxText's own code,
for any dataset type MaxText runs (`grain` parquet / ArrayRecord with a tokenizer, `hf` on local
or hub files, `synthetic`, and `network_grain` through our plugin; `tfds` and `c4_mlperf` where
TensorFlow and TensorFlow Datasets are installed, which the maxtext extra does not bring).

1. the target step: MaxText's trainer on `dataset_type=synthetic` (its own train step);
2. loading alone: MaxText's `create_data_iterator` timed with no training, as its
   `standalone_dataloader` does, plus first batch, p90, real tokens/s per core and an optional
   `grain_worker_count` sweep;
3. the real-data run: MaxText's trainer on the configured data; step time from its metrics
   file, data wait from `maxtext_run`;
4. with `--profile`, MaxText's own profiler (`profiler=xplane`) over a few real-data steps,
   read by `bench.profile`;
5. the verdict, the JSON report and the PNG plot of `bench.report`.

Training runs go to `maxtext_run` processes (`<report folder>/synthetic`, `/real`), forked from
a server started once the config is checked, which imports MaxText's trainer once
(`maxtext_preload`): two MaxText imports a bench instead of three.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import jax

from maxtext_netdata.bench import loading, render
from maxtext_netdata.bench import profile as bench_profile
from maxtext_netdata.bench import report as bench_report
from maxtext_netdata.bench.arguments import WARMUP_STEPS
from maxtext_netdata.errors import ConfigError, first_line

# Dataset types MaxText 0.2.5's create_data_iterator builds, plus ours through the plugin.
DATASET_TYPES = ("grain", "hf", "tfds", "c4_mlperf", "olmo_grain", "synthetic", "network_grain")
# MaxText's hf pipeline runs at most one Grain worker: with more, each reads the same stream.
HF_MAX_WORKERS = 1
# Dataset types whose MaxText pipeline is TensorFlow's (`tf.data`, TensorFlow Datasets).
TENSORFLOW_TYPES = ("tfds", "c4_mlperf")
TENSORFLOW_MISSING = (
  "dataset_type={kind}: MaxText's {kind} pipeline runs on TensorFlow and TensorFlow Datasets,"
  " not installed here ({missing} missing; the maxtext extra leaves them out: 1.7 GB), so"
  " bench cannot check it; `pip install tensorflow-cpu tensorflow-datasets` to run it, or store"
  " the data as parquet or ArrayRecord for dataset_type=grain"
)
HF_AT_MOST_ONE_WORKER = (
  "MaxText's hf pipeline runs one Grain worker at most: store the data as ArrayRecord or"
  " parquet for dataset_type=grain, whose workers scale"
)
# The starved verdict's buffer settings, which MaxText's hf pipeline does not read (it fixes
# one batch per worker and a 128-record read prefetch), and what it is told instead.
BUFFER_KNOBS = "raise grain_per_worker_buffer_size and grain_prefetch_buffer_size"
HF_FIXED_BUFFERS = (
  "MaxText's hf pipeline fixes its buffers (one batch per worker), so for a deeper prefetch"
  " store the data as ArrayRecord or parquet for dataset_type=grain"
)
# Seconds a training run has to end by itself once bench is ending (a Ctrl-C reached both).
RUN_END_S = 5.0
# Real-data steps the profiler records after the warm-up.
PROFILE_STEPS = 6
OFFLINE_TOKENIZATION = (
  "tokenize offline: MaxText's {kind} pipeline tokenizes every document in the loader; store"
  " token ids (ArrayRecord or parquet) and set tokenize_train_data=false"
)


def run(args) -> int:
  """`bench --maxtext`: measure, decide, write the report and the plot."""
  from maxtext_netdata.bench import maxtext_run
  from maxtext_netdata.maxtext import train as maxtext_train

  path = maxtext_train.resolve_config(args.config)
  if args.steps < 0 or args.batches < 1:
    raise ConfigError(f"--steps={args.steps} must be >= 0 and --batches={args.batches} >= 1")
  if args.profile and args.steps < 2:
    raise ConfigError(f"--profile records real-data steps: it needs --steps >= 2, not {args.steps}")
  maxtext_run.check_hook(args.loop_hook)
  maxtext_train.install_checking(args.overrides)
  maxtext_run.call_hook(args.loop_hook)
  cfg = load_config(path, args.overrides)
  sweep = loading.parse_sweep(args.sweep_workers)
  _check_workers(cfg, sweep)
  runs = _fork_server() if args.steps else None  # once the config is known to be good
  report_path = (
    Path(args.report)
    if args.report
    else Path(cfg.base_output_directory) / cfg.run_name / "bench" / "report.json"
  )
  out = report_path.parent
  trainer = _Trainer(path, args.overrides, args.loop_hook, args.steps, out, runs)

  synthetic = real = profile = None
  if args.steps and args.target_step_time is None:
    loading.progress(f"MaxText on synthetic data: {args.steps} + {WARMUP_STEPS} steps")
    synthetic = trainer.train("synthetic", ["dataset_type=synthetic"])
  loading_alone, sweep_results = measure_loadings(path, args.overrides, cfg, args.batches, sweep)
  if args.steps:
    loading.progress(f"MaxText on the configured data: {args.steps} + {WARMUP_STEPS} steps")
    extra = []
    if args.profile:
      extra = [
        "profiler=xplane",
        f"skip_first_n_steps_for_profiler={WARMUP_STEPS}",
        f"profiler_steps={min(args.steps, PROFILE_STEPS)}",
      ]
    real = trainer.train("real", extra)
    if args.profile:
      profile = bench_profile.read(out / "real", step_module="train_step", first_step=WARMUP_STEPS)

  if args.target_step_time is not None:
    target = {"step_time_s": args.target_step_time, "source": "--target-step-time"}
  elif synthetic is not None:
    target = {
      "step_time_s": synthetic["step_time"]["median"],
      "source": "MaxText's train step on synthetic data on this machine",
    }
  else:
    raise ConfigError("--steps 0 needs --target-step-time: MaxText's step is the target")
  recommendation = (
    bench_report.recommend_workers(sweep_results, target["step_time_s"]) if sweep_results else None
  )
  verdict = bench_report.decide(
    target["step_time_s"],
    target["source"],
    loading_alone,
    real,
    target["step_time_s"],
    _next_knob(cfg, loading_alone, recommendation),
  )
  verdict = advice_for_pipeline(verdict, _dataset_type(cfg))
  if profile is not None:
    verdict = bench_report.amend_verdict(verdict, profile)
  sequences = int(cfg.global_batch_size_to_load) // jax.process_count()
  report = {
    "config": path,
    "overrides": list(args.overrides),
    "maxtext": {
      "dataset_type": _dataset_type(cfg),
      "tokenizer_type": str(getattr(cfg.tokenizer_type, "value", cfg.tokenizer_type)),
    },
    "host": {
      "cpu_cores": loading.cpu_cores(),
      "devices": jax.device_count(),
      "device_kind": jax.devices()[0].device_kind,
      "processes": jax.process_count(),
    },
    "batch": {
      "sequences": sequences,
      "max_target_length": cfg.max_target_length,
      "tokens": sequences * cfg.max_target_length,
    },
    "target": target,
    "synthetic": synthetic,
    "real": real,
    "loading": loading_alone,
    "sweep": sweep_results,
    "recommended_workers": recommendation,
    "stages": None,
    "accelerator": None,
    "profile": profile,
    "verdict": verdict,
  }
  render.publish(report, report_path)
  return 0


def load_config(path: str, overrides: list[str]):
  """MaxText's config for `path` and `overrides` (plugin installed), or a one-line error."""
  from maxtext.configs import pyconfig

  from maxtext_netdata.maxtext.patch_config import MaxTextPluginError

  try:
    cfg = pyconfig.initialize(["bench", path, *overrides])
  except ConfigError:
    raise
  except MaxTextPluginError as e:  # one line already: "MaxText config: key=value ..."
    raise ConfigError(f"{path}: {e}") from None
  except Exception as e:  # MaxText raises ValueError, pydantic errors, AssertionError...
    raise ConfigError(f"{path}: MaxText rejects the config: {first_line(e)}") from None
  kind = _dataset_type(cfg)
  if kind not in DATASET_TYPES:
    raise ConfigError(
      f"{path}: dataset_type={kind!r} is not one bench can run; use one of"
      f" {', '.join(DATASET_TYPES)}"
    )
  if kind in TENSORFLOW_TYPES:
    missing = [m for m in ("tensorflow", "tensorflow_datasets") if not _importable(m)]
    if missing:
      raise ConfigError(
        f"{path}: " + TENSORFLOW_MISSING.format(kind=kind, missing=", ".join(missing))
      )
  return cfg


def _importable(module: str) -> bool:
  """Whether `module` is installed, without importing it (TensorFlow takes seconds)."""
  import importlib.util

  return importlib.util.find_spec(module) is not None


def _check_workers(cfg, sweep: list[int]) -> None:
  """`--sweep-workers` counts the pipeline can run: grain and network_grain any, hf 0 or 1
  (MaxText's own check refuses more in the config), others none.

  Raises:
    ConfigError: a count the pipeline cannot run.
  """
  kind = _dataset_type(cfg)
  if kind == "hf" and max(sweep, default=0) > HF_MAX_WORKERS:
    raise ConfigError(
      f"--sweep-workers={max(sweep)}: MaxText's hf pipeline runs {HF_MAX_WORKERS} Grain worker at"
      " most (with more, each reads the same stream: duplicated data)"
    )
  if sweep and kind not in ("grain", "network_grain", "hf"):
    raise ConfigError(f"--sweep-workers: dataset_type={kind} has no grain workers")


def measure_loadings(path, overrides, cfg, batches: int, sweep: list[int]):
  """Loading alone with the configured workers, then with each swept worker count."""
  workers = getattr(cfg, "grain_worker_count", 0)
  loading.progress(f"MaxText's create_data_iterator alone: {batches} batches, {workers} workers")
  loading_alone = measure_loading(cfg, batches)

  def load_alone(count: int) -> dict:
    loading.progress(f"MaxText's create_data_iterator alone: {batches} batches, {count} workers")
    return measure_loading(load_config(path, [*overrides, f"grain_worker_count={count}"]), batches)

  return loading_alone, loading.sweep_workers(loading_alone, sweep, load_alone)


def measure_loading(cfg, batches: int) -> dict:
  """MaxText's `create_data_iterator` with no training, as `standalone_dataloader` times it:
  `loading.time_loading`, the warm-up being one batch more than MaxText's worker buffers hold."""
  from maxtext.input_pipeline import input_pipeline_interface
  from maxtext.utils import maxtext_utils

  mesh = maxtext_utils.get_mesh_from_config(cfg)
  workers = max(0, int(getattr(cfg, "grain_worker_count", 0)))

  def create_iterators():
    try:
      return input_pipeline_interface.create_data_iterator(cfg, mesh)
    except Exception as e:
      raise ConfigError(
        f"MaxText cannot build its {_dataset_type(cfg)} pipeline ({_data_source(cfg)}):"
        f" {first_line(e)}"
      ) from None

  return loading.time_loading(
    create_iterators,
    _close,
    batches=batches,
    warmup=workers * int(getattr(cfg, "grain_per_worker_buffer_size", 1)) + 1,
    workers=workers,
    tokens_key="targets_segmentation",
    ran_out_hint=": use fewer --batches, more data or num_epoch > 1",
  )


def _fork_server():
  """The multiprocessing context whose fork server, started now, imports MaxText's trainer
  (`maxtext_preload`); its processes start with it imported."""
  context = multiprocessing.get_context("forkserver")
  context.set_forkserver_preload(["maxtext_netdata.bench.maxtext_preload"])
  from multiprocessing import forkserver

  forkserver.ensure_running()
  return context


def _run(context, argv: list[str], log: Path) -> int:
  """`maxtext_run.run_logged(argv)` in a process of `context`; its exit status. However bench
  ends meanwhile (Ctrl-C, SIGTERM, an error), the run is asked to end (SIGTERM: it closes its
  workers as `maxtext-train` does) and killed if it has not within its clean-up grace."""
  from maxtext_netdata import signals
  from maxtext_netdata.bench import maxtext_run

  process = context.Process(
    target=maxtext_run.run_logged, args=(argv, str(log), dict(os.environ)), name="maxtext_run"
  )
  process.start()
  try:
    process.join()
  finally:
    if process.exitcode is None:
      process.join(RUN_END_S)  # Ctrl-C at a terminal reached the run too
    if process.exitcode is None:
      process.terminate()
      process.join(signals.CLEANUP_GRACE_S + RUN_END_S)
    if process.exitcode is None:
      process.kill()
      process.join()
  return process.exitcode


class _Trainer:
  """MaxText training sub-runs of one bench, each in a `maxtext_run` process."""

  def __init__(self, path, overrides, hook, steps, out: Path, context):
    self.path, self.overrides, self.hook, self.steps, self.out = path, overrides, hook, steps, out
    self.context = context

  def train(self, name: str, extra: list[str]) -> dict:
    metrics_file = self.out / f"{name}.metrics.jsonl"
    metrics_file.unlink(missing_ok=True)
    argv = ["--hook", self.hook] if self.hook else []
    argv += [self.path, *self.overrides, *extra]
    argv += [
      f"steps={self.steps + WARMUP_STEPS}",
      f"base_output_directory={self.out}",
      f"run_name={name}",
      f"metrics_file={metrics_file}",
      "enable_checkpointing=false",
      "eval_interval=-1",
    ]
    log = self.out / f"{name}.log"
    self.out.mkdir(parents=True, exist_ok=True)
    code = _run(self.context, argv, log)
    if code != 0 or not metrics_file.exists():
      tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:]
      raise ConfigError(
        f"MaxText's {name} run failed (exit {code}; log {log}): {tail[0] if tail else ''}"
      )
    records = []
    for line in metrics_file.read_text(encoding="utf-8").splitlines():
      m = json.loads(line)
      if "perf/step_time_seconds" in m:
        records.append(
          {
            "step": int(m["step"]),
            "step_time_s": float(m["perf/step_time_seconds"]),
            "data_wait_s": float(m.get("perf/data_wait_seconds", 0.0)),
          }
        )
    if len(records) <= WARMUP_STEPS:
      raise ConfigError(f"{metrics_file}: {len(records)} steps logged (the data ended?)")
    return bench_report.training_summary(records, WARMUP_STEPS)


def advice_for_pipeline(verdict: dict, kind: str) -> dict:
  """The verdict with only knobs the `kind` pipeline has: MaxText's hf pipeline reads neither
  buffer setting the starved verdict names."""
  if kind == "hf" and BUFFER_KNOBS in verdict["text"]:
    return {**verdict, "text": verdict["text"].replace(BUFFER_KNOBS, HF_FIXED_BUFFERS)}
  return verdict


def _next_knob(cfg, loading_alone: dict, recommendation: dict | None) -> str:
  knob = bench_report.next_knob(loading_alone, loading.cpu_cores(), recommendation, None)
  kind = _dataset_type(cfg)
  online = kind in ("grain", "hf", "tfds") and getattr(cfg, "tokenize_train_data", False)
  if kind == "hf" and knob.startswith("raise grain_worker_count"):
    if loading_alone["workers"] < HF_MAX_WORKERS:
      return f"set grain_worker_count={HF_MAX_WORKERS} (the most MaxText's hf pipeline runs)"
    return HF_AT_MOST_ONE_WORKER + (f"; {OFFLINE_TOKENIZATION.format(kind=kind)}" if online else "")
  if online and "grain_worker_count" not in knob:
    return OFFLINE_TOKENIZATION.format(kind=kind)
  return knob


def _data_source(cfg) -> str:
  """The config keys naming the data a pipeline reads, as `key=value` words."""
  keys = {
    "hf": ("hf_path", "hf_name", "hf_data_dir", "hf_train_files"),
    "tfds": ("dataset_name", "dataset_path"),
  }.get(_dataset_type(cfg), ("grain_file_type", "grain_train_files"))
  return " ".join(f"{key}={getattr(cfg, key)}" for key in keys if getattr(cfg, key, None))


def _dataset_type(cfg) -> str:
  """`dataset_type` as written in the config (MaxText holds an enum, the plugin a string)."""
  return str(getattr(cfg.dataset_type, "value", cfg.dataset_type))


def _close(iterator) -> None:
  """Stops an iterator's Grain workers and frees their shared memory.

  MaxText's own `close()` trips over Grain's iterator (an assertion in `_parent`), so the
  Grain iterator is closed here and detached before MaxText's `__del__` looks at it.
  """
  local = getattr(iterator, "local_iterator", None)
  if local is not None and hasattr(local, "close"):
    local.close()
    iterator.local_iterator = None
  if hasattr(iterator, "close"):
    try:
      iterator.close()
    except Exception:  # MaxText's clean-up of an already closed iterator
      pass
