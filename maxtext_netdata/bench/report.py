"""The figures, verdict and outputs of `maxtext-netdata bench`.

Everything here works on plain timings, so the decision can be checked on constructed numbers:
`loading_summary` and `training_summary` condense measurements, `recommend_workers` reads a
worker-count sweep, `decide` turns the figures into a verdict in plain words, and
`format_table`, `write_json`, `plot` and `write_plot` present one report dict.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

# Real steps this much slower than the reference step are "slower".
SLOWDOWN_TOLERANCE = 1.10
# Slower real steps whose data wait accounts for this share of the extra time are starved by
# the loader; with less, the time is lost elsewhere in the loop.
WAIT_EXPLAINS_SHARE = 0.5
# Headroom a worker count must leave under the target step to be recommended.
SWEEP_HEADROOM = 1.2
# Without a target, the smallest worker count this close to the fastest is recommended.
SWEEP_NEAR_BEST = 1.10

NOT_BOTTLENECK = "loading_not_bottleneck"
BOTTLENECK = "loading_bottleneck"
STARVED = "loading_starved_in_training"
FORCED_SYNC = "forced_synchronization_suspected"

# What to try when loading is too slow, by its slowest stage (bench.measure_stages).
STAGE_ADVICE = {
  "read": "reading the store is slowest: keep the prepared store on local disk (run"
  " `maxtext-netdata prepare` offline, set network_prepared_dir to a local SSD path)",
  "build": "building sequences is slowest: it is CPU work that scales with worker processes;"
  " a host with more CPU cores per accelerator",
  "batch": "ShiftData, which runs in the training process after the workers, is slowest: that"
  " process is the limit, so give it a core of its own rather than adding workers",
  "device": "moving batches to the device is slowest: check the host-to-device link (PCIe,"
  " NUMA placement) and never block on a batch before its step, so the copy overlaps compute",
}


def summarize(values: Sequence[float]) -> dict:
  """Median, p90, max, mean and count of `values` (all None when empty)."""
  if not len(values):
    return {"n": 0, "median": None, "p90": None, "max": None, "mean": None}
  array = np.asarray(values, dtype=np.float64)
  return {
    "n": int(array.size),
    "median": float(np.median(array)),
    "p90": float(np.percentile(array, 90)),
    "max": float(array.max()),
    "mean": float(array.mean()),
  }


def loading_summary(
  batch_times_s: Sequence[float],
  first_batch_s: float,
  elapsed_s: float,
  real_tokens: int,
  slot_tokens: int,
  cpu_seconds: float,
  workers: int,
) -> dict:
  """Figures of one loading-alone run of `len(batch_times_s)` batches after warm-up.

  `elapsed_s` is the wall time of those batches (the steady rate), `real_tokens` their
  non-padding tokens, `slot_tokens` all token slots, `cpu_seconds` the CPU time of this process
  and its workers meanwhile.
  """
  n = len(batch_times_s)
  cores = cpu_seconds / elapsed_s if elapsed_s > 0 else 0.0
  real_rate = real_tokens / elapsed_s if elapsed_s > 0 else 0.0
  return {
    "workers": workers,
    "batches": n,
    "first_batch_s": first_batch_s,
    "batch_times_s": [float(t) for t in batch_times_s],
    "batch_time_s": summarize(batch_times_s),
    "batch_s": elapsed_s / n if n else math.inf,
    "real_tokens_per_s": real_rate,
    "slot_tokens_per_s": slot_tokens / elapsed_s if elapsed_s > 0 else 0.0,
    "padding_share": 1.0 - real_tokens / slot_tokens if slot_tokens else 0.0,
    "cpu_cores_busy": cores,
    "real_tokens_per_s_per_core": real_rate / cores if cores > 0 else 0.0,
  }


def training_summary(records: Iterable[dict], warmup_steps: int) -> dict:
  """Step time and data wait of metrics.jsonl `records`, the first `warmup_steps` left out."""
  records = sorted(records, key=lambda r: r["step"])
  steady = records[warmup_steps:]
  step_times = [float(r["step_time_s"]) for r in records]
  data_waits = [float(r["data_wait_s"]) for r in records]
  return {
    "steps": [int(r["step"]) for r in records],
    "step_times_s": step_times,
    "data_wait_s": data_waits,
    "warmup_steps": warmup_steps,
    "step_time": summarize([float(r["step_time_s"]) for r in steady]),
    "data_wait": summarize([float(r["data_wait_s"]) for r in steady]),
  }


def with_loader_cores(accelerator: dict, loading: dict) -> dict:
  """`accelerators.estimate` output with, per MFU, the host cores this pipeline would need.

  A core of this pipeline delivers `slot_tokens_per_s / cpu_cores_busy` token slots per second
  (the accelerator consumes padding too), measured by the loading-alone run.
  """
  per_core = (
    loading["slot_tokens_per_s"] / loading["cpu_cores_busy"]
    if loading["cpu_cores_busy"] > 0
    else 0.0
  )
  result = dict(accelerator, loader_slot_tokens_per_s_per_core=per_core)
  result["at_mfu"] = [
    dict(m, loader_cores_needed=m["tokens_per_s"] / per_core if per_core else None)
    for m in accelerator["at_mfu"]
  ]
  return result


def recommend_workers(sweep: Sequence[dict], target_step_s: float | None) -> dict:
  """The worker count to use, from loading summaries of several `grain_worker_count` values.

  The smallest count leaving SWEEP_HEADROOM under the target step wins (fewer processes, less
  memory); if none does, or without a target, the smallest count within SWEEP_NEAR_BEST of the
  fastest.
  """
  by_workers = sorted(sweep, key=lambda s: s["workers"])
  if target_step_s is not None:
    for s in by_workers:
      if s["batch_s"] * SWEEP_HEADROOM <= target_step_s:
        return {
          "workers": s["workers"],
          "reason": f"the fewest workers loading a batch in {_ms(s['batch_s'])},"
          f" {target_step_s / s['batch_s']:.1f}x under the {_ms(target_step_s)} step"
          f" (>= {SWEEP_HEADROOM:g}x wanted)",
        }
  best = min(s["batch_s"] for s in by_workers)
  pick = next(s for s in by_workers if s["batch_s"] <= best * SWEEP_NEAR_BEST)
  return {
    "workers": pick["workers"],
    "reason": f"the fewest workers within {int((SWEEP_NEAR_BEST - 1) * 100)}% of the fastest"
    f" ({_ms(pick['batch_s'])} per batch)",
  }


def slowest_stage(stages: dict | None) -> str | None:
  """Name of the stage with the largest time per batch in a `{name: seconds}` breakdown."""
  if not stages:
    return None
  return max(stages, key=stages.get)


def next_knob(
  loading: dict, cpu_cores: int, recommendation: dict | None, stages: dict | None
) -> str:
  """What to try first when loading is too slow."""
  if recommendation is not None and recommendation["workers"] != loading["workers"]:
    return f"set grain_worker_count={recommendation['workers']} ({recommendation['reason']})"
  if loading["workers"] < cpu_cores - 1:
    return f"raise grain_worker_count (now {loading['workers']}; this host has {cpu_cores} cores)"
  stage = slowest_stage(stages)
  if stage is not None:
    return STAGE_ADVICE[stage]
  return "the loader uses every core of this host: a host with more CPU cores per accelerator"


def decide(
  target_step_s: float,
  target_source: str,
  loading: dict,
  real: dict | None,
  reference_step_s: float | None,
  knob: str,
) -> dict:
  """The verdict: is loading the bottleneck, and if training is slow anyway, why?

  Args:
    target_step_s: the accelerator step time loading must beat.
    target_source: where the target came from, in words.
    loading: `loading_summary` of the configured pipeline alone.
    real: `training_summary` of training on the configured data, or None if not run.
    reference_step_s: step time real steps are compared with (the synthetic-data median on
      this machine, or the given target); None skips that comparison.
    knob: `next_knob` advice, used when loading is too slow.

  Returns:
    {"kind": one of the module's verdict names, "text": the verdict in plain words}.
  """
  batch_s = loading["batch_s"]
  ratio = target_step_s / batch_s if batch_s > 0 else math.inf
  loading_words = (
    f"loading takes {_ms(batch_s)} per batch (p90 {_ms(loading['batch_time_s']['p90'])},"
    f" {loading['workers']} workers) against a {_ms(target_step_s)} step ({target_source})"
  )
  if ratio < 1.0:
    return {
      "kind": BOTTLENECK,
      "text": f"Data loading IS the bottleneck: {loading_words}, {1 / ratio:.1f}x slower."
      f" Next: {knob}.",
    }
  fast = f"Data loading is not the bottleneck: {loading_words}, {ratio:.1f}x faster."
  if real is None or reference_step_s is None or real["step_time"]["median"] is None:
    return {"kind": NOT_BOTTLENECK, "text": fast}
  real_step = real["step_time"]["median"]
  wait = real["data_wait"]["median"]
  slowdown = real_step / reference_step_s
  if slowdown <= SLOWDOWN_TOLERANCE:
    return {
      "kind": NOT_BOTTLENECK,
      "text": f"{fast} Real-data steps take {_ms(real_step)}, as fast as the"
      f" {_ms(reference_step_s)} reference step.",
    }
  slower = (
    f"real-data steps take {_ms(real_step)}, {slowdown:.2f}x the {_ms(reference_step_s)}"
    f" reference step"
  )
  if wait >= WAIT_EXPLAINS_SHARE * (real_step - reference_step_s):
    return {
      "kind": STARVED,
      "text": f"Loading is fast alone but starved in training: {loading_words}; yet"
      f" {slower}, and waiting {_ms(wait)} for data is most of the difference. Training and"
      " loading compete for the host (CPU threads of the step, memory bandwidth) or the"
      " prefetch is too shallow: give the loader dedicated cores (fewer XLA host threads),"
      " raise grain_per_worker_buffer_size and grain_prefetch_buffer_size. A loop that waits"
      " for the device every step also stops loading from overlapping the step.",
    }
  return {
    "kind": FORCED_SYNC,
    "text": f"Forced synchronization suspected: loading is fast ({_ms(batch_s)} per batch,"
    f" {ratio:.1f}x under the step), yet {slower}, and waiting for data ({_ms(wait)})"
    " explains little of it."
    " Something in the loop makes the host wait for the device each step: host reads of"
    " device values (print(loss), float(metric), .item(), np.asarray on a jax.Array),"
    " jax.device_get or block_until_ready in the loop, blocking checkpoint saves, or"
    " logging that is not asynchronous. Read metrics one step late and checkpoint"
    " asynchronously.",
  }


def format_table(report: dict) -> str:
  """The report as an aligned plain-text table for the terminal."""
  rows: list[tuple[str, str]] = []
  batch = report["batch"]
  rows.append(("batch", f"{batch['sequences']} x {batch['max_target_length']} tokens"))
  target = report["target"]
  rows.append(("target step", f"{_ms(target['step_time_s'])} ({target['source']})"))
  for name in ("synthetic", "real"):
    run = report.get(name)
    if run:
      rows.append(
        (
          f"{name} step",
          f"median {_ms(run['step_time']['median'])}, p90 {_ms(run['step_time']['p90'])},"
          f" data wait median {_ms(run['data_wait']['median'])}"
          f" ({run['step_time']['n']} steps)",
        )
      )
  loading = report["loading"]
  rows.append(
    (
      "loading alone",
      f"{_ms(loading['batch_s'])}/batch; median {_ms(loading['batch_time_s']['median'])},"
      f" p90 {_ms(loading['batch_time_s']['p90'])}, max {_ms(loading['batch_time_s']['max'])}"
      f" ({loading['batches']} batches, {loading['workers']} workers)",
    )
  )
  rows.append(("first batch", _ms(loading["first_batch_s"])))
  rows.append(
    (
      "real tokens/s",
      f"{loading['real_tokens_per_s']:,.0f} ({loading['real_tokens_per_s_per_core']:,.0f}"
      f" per busy core, {loading['cpu_cores_busy']:.2f} cores busy,"
      f" {loading['padding_share']:.1%} padding)",
    )
  )
  for s in report.get("sweep") or []:
    rows.append(
      (
        f"  workers={s['workers']}",
        f"{_ms(s['batch_s'])}/batch, {s['real_tokens_per_s']:,.0f} real tokens/s,"
        f" first batch {_ms(s['first_batch_s'])}",
      )
    )
  if report.get("recommended_workers"):
    rec = report["recommended_workers"]
    rows.append(("recommended", f"grain_worker_count={rec['workers']}: {rec['reason']}"))
  stages = report.get("stages")
  if stages:
    text = ", ".join(f"{k} {_ms(v)}" for k, v in stages["per_batch_s"].items())
    rows.append(("stages, median", f"{text}; slowest: {stages['slowest']}"))
  acc = report.get("accelerator")
  if acc:
    rows.append(
      (
        "model",
        f"{acc['params'] / 1e6:.1f}M params,"
        f" {acc['flops_per_token'] / 1e9:.3g} GFLOP per token (training)",
      )
    )
    for m in acc["at_mfu"]:
      rows.append(
        (
          f"{acc['name']} @ {m['mfu']:.0%} MFU",
          f"{m['tokens_per_s']:,.0f} tokens/s, {_ms(m['step_time_s'])}/step,"
          f" needs {_number(m['loader_cores_needed'], '.1f')} cores of this pipeline",
        )
      )
  prof = report.get("profile")
  if prof and "error" in prof:
    rows.append(("profile", f"not measured: {prof['error']}"))
  elif prof:
    gaps = prof["gaps"]
    rows.append(
      (
        "profile",
        f"idle {prof['idle_share']['median']:.0%} of a step (median, max"
        f" {prof['idle_share']['max']:.0%}); {gaps['count']} gaps, {_ms(gaps['seconds'])};"
        f" host waiting on: {prof['host_waiting_on'] or 'nothing'} ({len(prof['steps'])} steps)",
      )
    )
  width = max(len(k) for k, _ in rows)
  lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
  lines.append("")
  lines.append(report["verdict"]["text"])
  return "\n".join(lines)


def write_json(report: dict, path: str | os.PathLike) -> Path:
  """Writes `report` as indented JSON to `path` (folders created)."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(report, indent=2, allow_nan=False, default=_jsonable) + "\n")
  return path


def write_plot(report: dict, path: str | os.PathLike) -> Path:
  """Writes `plot(report)` as a PNG to `path` (folders created)."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  plot(report).savefig(path, dpi=100)
  return path


def plot(report: dict):
  """A matplotlib Figure (Agg canvas, no pyplot state): step time and data wait per step
  (synthetic, real) and loading time per batch, each against the target step time; with a
  `profile` section, the accelerator's idle share per profiled step below."""
  from matplotlib.figure import Figure
  from matplotlib.ticker import MaxNLocator

  target_ms = report["target"]["step_time_s"] * 1e3
  runs = [(n, report[n]) for n in ("synthetic", "real") if report.get(n)]
  profile = report.get("profile")
  profile = profile if profile and "steps" in profile else None
  fig = Figure(figsize=(9, 4 + 3.5 * bool(runs) + 3.5 * bool(profile)))
  axes = fig.subplots(1 + bool(runs) + bool(profile), 1, squeeze=False)
  if profile:
    from maxtext_netdata.bench import profile as bench_profile

    bench_profile.plot_panel(axes[-1][0], profile)
    axes = axes[:-1]
  if runs:
    ax = axes[0][0]
    steady_max = target_ms
    for (name, run), color in zip(runs, ("tab:blue", "tab:orange"), strict=False):
      step_ms = np.asarray(run["step_times_s"]) * 1e3
      ax.plot(run["steps"], step_ms, color=color, marker=".", label=f"{name} step time")
      ax.plot(
        run["steps"],
        np.asarray(run["data_wait_s"]) * 1e3,
        color=color,
        linestyle=":",
        label=f"{name} data wait",
      )
      steady_max = max(steady_max, float(step_ms[run["warmup_steps"] :].max(initial=0.0)))
      warmup_end = run["steps"][0] + run["warmup_steps"] - 0.5
    ax.axvspan(
      runs[0][1]["steps"][0] - 0.5, warmup_end, color="0.9", label="warm-up (compile), not counted"
    )
    ax.axhline(target_ms, color="black", linestyle="--", label="target step")
    ax.set_ylim(0, steady_max * 1.3)
    ax.set_xlabel("step")
    ax.set_ylabel("ms")
    ax.set_title("Training steps: step time and time waiting for data")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize="small")
  ax = axes[-1][0]
  loading = report["loading"]
  ax.plot(
    np.arange(1, loading["batches"] + 1),
    np.asarray(loading["batch_times_s"]) * 1e3,
    marker=".",
    label=f"loading, {loading['workers']} workers",
  )
  ax.axhline(loading["batch_s"] * 1e3, color="tab:green", label="loading, steady mean")
  others = [e for e in report.get("sweep") or [] if e["workers"] != loading["workers"]]
  for i, other in enumerate(others):
    ax.axhline(
      other["batch_s"] * 1e3,
      color=f"C{3 + i}",
      linestyle="-.",
      linewidth=1,
      label=f"steady mean, {other['workers']} workers (sweep)",
    )
  ax.axhline(target_ms, color="black", linestyle="--", label="target step")
  ax.set_yscale("log")
  ax.set_ylim(top=max(target_ms, max(loading["batch_times_s"]) * 1e3) * 20)
  ax.set_xlabel("batch after warm-up")
  ax.set_ylabel("ms (log scale)")
  ax.set_title(f"Loading alone against the target step: {report['verdict']['kind']}")
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.legend(fontsize="small", ncols=2, loc="upper right")
  fig.tight_layout()
  return fig


def _ms(seconds: float | None) -> str:
  if seconds is None:
    return "n/a"
  if seconds >= 1.0:
    return f"{seconds:.2f} s"
  return f"{seconds * 1e3:.2f} ms"


def _number(value: float | None, spec: str) -> str:
  return "n/a" if value is None else format(value, spec)


def _jsonable(value):
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, Path):
    return str(value)
  raise TypeError(f"not JSON serializable: {type(value).__name__}")
