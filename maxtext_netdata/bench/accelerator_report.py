"""What the accelerator check writes besides report.json: the profile trace trimmed to a size
that travels back from a device machine (`trim_trace`) and the short table its run ends with
(`format_table`). `accelerator_check` measures; this module only formats and trims.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from maxtext_netdata.bench.report import ms


def trim_trace(source: Path, target: Path, max_bytes: int) -> dict:
  """Writes the Perfetto trace `source` (gzipped JSON) to `target`, cut to the events around
  its middle (steady steps) that gzip to `max_bytes` or less.

  Metadata events (process and thread names) are kept. The first cut keeps the share of the
  events that `max_bytes` is of the source file; each further one shrinks it by the excess.
  Returns where it went, how many events it kept of how many, and the seconds they span.
  """
  trace = json.loads(gzip.decompress(source.read_bytes()))
  timed = sorted((e for e in trace["traceEvents"] if "ts" in e), key=lambda e: e["ts"])
  untimed = [e for e in trace["traceEvents"] if "ts" not in e]
  share = min(1.0, max_bytes / source.stat().st_size)
  while True:
    keep = int(len(timed) * share)
    kept = timed[(len(timed) - keep) // 2 :][:keep]
    text = json.dumps({**trace, "traceEvents": untimed + kept}, separators=(",", ":"))
    data = gzip.compress(text.encode(), compresslevel=6)
    if len(data) <= max_bytes or not kept:
      break
    share *= min(0.9, max_bytes / len(data))
  target.write_bytes(data)
  return {
    "path": str(target),
    "source": str(source),
    "events": len(kept),
    "of_events": len(timed),
    # Perfetto's timestamps are microseconds.
    "span_s": (kept[-1]["ts"] - kept[0]["ts"]) / 1e6 if kept else 0.0,
  }


def format_table(report: dict) -> str:
  """The report's short table: one line per part, the errors and skipped parts last."""
  env, shape = report["environment"], report["model"]
  peak = f"{env['peak_tflops']:g} TFLOP/s" if env["peak_tflops"] else "no known peak: no MFU"
  rows = [
    ("device", environment_line(env, {k: env["packages"].get(k) for k in ("jax", "jaxlib")})),
    (
      "model",
      f"{shape['params'] / 1e6:.1f}M params, {shape['flops_per_token'] / 1e9:.3g} GFLOP per"
      f" token ({shape['attention_flops_per_token'] / shape['flops_per_token']:.0%}"
      f" attention), batch {shape['sequences']} x {shape['max_target_length']}, {peak}",
    ),
  ]
  if "attention" in shape:  # reports before these keys lack them
    embedding = {True: ", embedding by matmul", False: ", embedding by gather"}
    layers = {True: ", layers scanned", False: ", layers unrolled"}
    rows.append(
      (
        "kernels",
        f"attention {shape['attention']}, remat_policy {shape['remat_policy']}"
        # absent from older reports
        + embedding.get(shape.get("use_iota_embed"), "")
        + layers.get(shape.get("scan_layers"), ""),
      )
    )
  if report.get("fallback"):
    rows.append(("fallback", report["fallback"]))
  synthetic = report["synthetic"]
  if synthetic:
    rows.append(
      (
        "synthetic",
        f"first step {ms(synthetic['first_step_s'])} (compile), median"
        f" {ms(synthetic['step_time']['median'])}, {synthetic['tokens_per_s']:,.0f} tokens/s,"
        f" MFU {share(synthetic['mfu'])} (real tokens {share(synthetic['mfu_real_tokens'])}),"
        f" memory {gib(synthetic['device_memory_peak_bytes'])}"
        f" of {gib(env['device_memory_bytes'])}",
      )
    )
  data = report["data"]
  if data:
    rows.append(
      (
        "data",
        f"{data['rows']:,} rows generated in {data['generate_s']:.1f} s, prepared in"
        f" {data['prepare_s']:.1f} s, batch kernel ready in {data['batch_kernel_s']:.1f} s",
      )
    )
  runs = (
    ("synthetic_placed", "placed each step", "placed"),
    ("network", "network_grain", "network"),
    ("network_on_demand", "placed on demand", "network"),
    ("network_fixed", "real batch fixed", "fixed"),
    ("network_fixed_embed", "fixed, {} embed", "fixed"),
  )
  for key, label, name in runs:
    run = report.get(key)
    if run:
      label = label.format("iota" if run.get("use_iota_embed") else "gather")
      ratio = run["step_ratio_to_synthetic"]
      rows.append(
        (
          label,
          f"median {ms(run['step_time']['median'])}, data wait"
          f" {run['data_wait_share']:.1%} of the step, {name}/synthetic"
          f" {'n/a' if ratio is None else f'{ratio:.3f}'},"
          f" MFU real tokens {share(run['mfu_real_tokens'])}",
        )
      )
  if report.get("attention_kernels"):
    rows.append(("attention", _attention_row(report["attention_kernels"])))
  bench = report["bench"]
  if bench:
    rows.append(("verdict", bench["verdict"]["kind"]))
    profile = bench["profile"]
    if profile and "error" not in profile:
      gaps = profile["gaps"]
      rows.append(
        (
          "profile",
          f"idle {profile['idle_share']['median']:.0%} of a step (median, max"
          f" {profile['idle_share']['max']:.0%}); {gaps['count']} gaps, {ms(gaps['seconds'])};"
          f" host waiting on: {profile['host_waiting_on'] or 'nothing'}",
        )
      )
      if profile.get("device_time"):
        rows.append(("device time", "network_grain " + _device_time_row(profile)))
    elif profile:
      rows.append(("profile", f"not measured: {profile['error']}"))
    rows.append(("loading alone", _loading_row(report["loading"], "workers", per_core=False)))
  synthetic_profile = report.get("synthetic_profile")
  if synthetic_profile and synthetic_profile.get("device_time"):
    rows.append(("synthetic device", "synthetic " + _device_time_row(synthetic_profile)))
  if report.get("loading_threads"):
    rows.append(("in-process", _loading_row(report["loading_threads"], "threads")))
  switched = report.get("switch_sweep") or {"runs": [], "best": {}, "stopped": None}
  sweep = report["batch_sweep"]
  if sweep:
    # The switches tried on the configured batch first, then the sizes (with the best switches).
    entries = [_sweep_entry(_switches(r["switches"]), r) for r in switched["runs"]]
    entries += [_sweep_entry(f"{r['per_device_batch_size']:g}", r) for r in sweep["runs"]]
    stops = [why for why in (switched["stopped"], sweep["stopped"]) if why]
    stopped = f" ({'; '.join(stops)})" if stops else ""
    best = f" with {_switches(switched['best'])}" if switched["best"] else ""
    rows.append(("batch sweep", "; ".join(entries) + f"; best {sweep['best']:g}{best}{stopped}"))
  options = report.get("xla_option_sweep")
  if options:
    entries = [_sweep_entry(_switches(r["switches"]), r) for r in options["runs"]]
    entries.append(_sweep_entry("the configured run", report["synthetic"]))
    stopped = f" ({options['stopped']})" if options["stopped"] else ""
    rows.append(("xla options", "; ".join(entries) + stopped))
  for name, error in report["errors"].items():
    rows.append((f"{name} failed", error))
  for name, why in report["skipped"].items():
    rows.append((f"{name} skipped", why))
  width = max(len(k) for k, _ in rows)
  lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
  lines.append(f"{'elapsed'.ljust(width)}  {report['elapsed_s']:.0f} s; outputs in {report['out']}")
  return "\n".join(lines)


def environment_line(env: dict, packages: dict[str, str | None]) -> str:
  """Devices, chip, host and the versions of `packages`, in one line."""
  chip = env["chip"] or "not a listed chip"
  versions = ", ".join(f"{name} {version}" for name, version in packages.items())
  return (
    f"{env['devices']} x {env['device_kind']} ({env['platform']}, {chip}), {env['cpu_cores']}"
    f" cores, {env['host_memory_bytes'] / 2**30:.0f} GiB; python {env['python']}, {versions}"
    f"; XLA_FLAGS {env.get('xla_flags') or 'unset'}"
  )


def share(value: float | None) -> str:
  return "n/a" if value is None else f"{value:.1%}"


def gib(value: int | None) -> str:
  return "n/a" if value is None else f"{value / 2**30:.1f} GiB"


def _sweep_entry(label: str, run: dict) -> str:
  """One run of a sweep in the table: `label: N tokens/s, MFU x%`, or `label: failed`."""
  if "error" in run:
    return f"{label}: failed"
  return f"{label}: {run['tokens_per_s']:,.0f} tokens/s, MFU {share(run['mfu'])}"


def _switches(switches: dict[str, str]) -> str:
  return " ".join(f"{key}={value}" for key, value in switches.items())


def _device_time_row(profile: dict) -> str:
  """Kernel time per step of the profiled (real-data) step, by class and its top kernels."""
  device = profile["device_time"]
  classes = ", ".join(
    f"{label} {seconds * 1e3:.1f} ms" for label, seconds in device["by_class_s"].items() if seconds
  )
  top = ", ".join(f"{name[:48]} {s * 1e3:.1f} ms" for name, s in device["top_kernels_s"].items())
  return (
    f"per step {classes}; kernels {device['kernels_s'] * 1e3:.1f} ms of a"
    f" {profile['step_time_s'] * 1e3:.1f} ms step; top: {top}"
  )


def _attention_row(compared: dict) -> str:
  """One layer's attention forward and backward per kernel: time, speed against the
  reference kernel, largest error of the output and gradients; failed kernels last."""
  runs = compared["runs_per_row"]
  parts = []
  for name, kernel in compared["kernels"].items():
    if "error" in kernel:
      parts.append(f"{name} failed")
      continue
    speedup = compared["speedup"].get(name)
    parts.append(
      f"{name} {ms(kernel['seconds'])}"
      + (f" ({speedup:.2f}x)" if speedup else "")
      + f" err {max(kernel['max_abs_error'].values()):.2g}"
    )
  return (
    f"1 layer fwd+bwd on a real batch ({runs['max']} runs a row at most, {runs['mean']:.1f}"
    f" mean; x against {compared['speedup_over']}): " + ", ".join(parts)
  )


def _loading_row(runs: list[dict], key: str, per_core: bool = True) -> str:
  """ "0 threads 12.3M (11.8M a core), ..." real tokens/s of each loading-alone run; per core
  only where the runs were sized for the CPU clock (the threads sweep)."""
  return (
    ", ".join(
      f"{run[key]} {key} {run['real_tokens_per_s'] / 1e6:.1f}M"
      + (f" ({run['real_tokens_per_s_per_core'] / 1e6:.1f}M a core)" if per_core else "")
      for run in runs
    )
    + " real tokens/s"
  )
