"""The outputs of a `maxtext-netdata bench` report dict: the terminal table, the JSON file and
the plot beside it (`publish` writes all three, for our configs and MaxText's alike)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from maxtext_netdata.bench import profile as bench_profile
from maxtext_netdata.bench.report import ms


def publish(report: dict, report_path: Path) -> None:
  """Writes the JSON report and its PNG beside it, then prints the table and both paths."""
  write_json(report, report_path)
  plot_path = write_plot(report, report_path.with_suffix(".png"))
  print(format_table(report))
  print(f"\nreport: {report_path}\nplot:   {plot_path}")


def format_table(report: dict) -> str:
  """The report as an aligned plain-text table for the terminal."""
  rows: list[tuple[str, str]] = []
  batch = report["batch"]
  rows.append(("batch", f"{batch['sequences']} x {batch['max_target_length']} tokens"))
  target = report["target"]
  rows.append(("target step", f"{ms(target['step_time_s'])} ({target['source']})"))
  for name in ("synthetic", "real"):
    run = report.get(name)
    if run:
      rows.append(
        (
          f"{name} step",
          f"median {ms(run['step_time']['median'])}, p90 {ms(run['step_time']['p90'])},"
          f" data wait median {ms(run['data_wait']['median'])}"
          f" ({run['step_time']['n']} steps)",
        )
      )
  loading = report["loading"]
  rows.append(
    (
      "loading alone",
      f"{ms(loading['batch_s'])}/batch; median {ms(loading['batch_time_s']['median'])},"
      f" p90 {ms(loading['batch_time_s']['p90'])}, max {ms(loading['batch_time_s']['max'])}"
      f" ({loading['batches']} batches, {loading['workers']} workers)",
    )
  )
  rows.append(("first batch", ms(loading["first_batch_s"])))
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
        f"{ms(s['batch_s'])}/batch, {s['real_tokens_per_s']:,.0f} real tokens/s,"
        f" first batch {ms(s['first_batch_s'])}",
      )
    )
  if report.get("recommended_workers"):
    rec = report["recommended_workers"]
    rows.append(("recommended", f"grain_worker_count={rec['workers']}: {rec['reason']}"))
  stages = report.get("stages")
  if stages:
    text = ", ".join(f"{k} {ms(v)}" for k, v in stages["per_batch_s"].items())
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
          f"{m['tokens_per_s']:,.0f} tokens/s, {ms(m['step_time_s'])}/step,"
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
        f" {prof['idle_share']['max']:.0%}); {gaps['count']} gaps, {ms(gaps['seconds'])};"
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
    _profile_panel(axes[-1][0], profile)
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


def _number(value: float | None, spec: str) -> str:
  return "n/a" if value is None else format(value, spec)


def _jsonable(value):
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, Path):
    return str(value)
  raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _profile_panel(ax, profile: dict) -> None:
  """Per step, the idle share of the accelerator, split by what the host did in the gaps."""
  steps = profile["steps"]
  x = [s["step"] for s in steps]
  bottom = np.zeros(len(steps))
  colors = {
    bench_profile.DATA: "tab:red",
    bench_profile.DEVICE_READ: "tab:purple",
    bench_profile.HOST: "tab:gray",
  }
  # Stacked steps as one filled band per cause: bars are one patch each, and a trace cut into
  # tens of thousands of runs took minutes to draw that way.
  for cause, color in colors.items():
    share = np.array(
      [sum(g["seconds"] for g in s["gaps"] if g["cause"] == cause) / s["seconds"] for s in steps]
    )
    top = bottom + share * 100
    ax.fill_between(x, bottom, top, step="mid", color=color, label=f"gap: {cause}")
    bottom = top
  ax.plot(x, [s["idle_share"] * 100 for s in steps], "k.", label="idle, all")
  ax.set_ylim(0, 100)
  ax.set_xlabel("step (profiled)")
  ax.set_ylabel("% of step idle")
  ax.set_title(f"Profile: accelerator idle per step ({profile['source']})")
  ax.legend(fontsize="small", loc="upper right")
