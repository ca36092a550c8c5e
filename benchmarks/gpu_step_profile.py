"""Where a training step's time goes on the device, for synthetic and for real data.

Trains a few steps of the config on `dataset_type=synthetic` and then on `network_grain`
(a store generated and prepared here), each traced by the trainer's profiler window over the
steps after the warm-up (`profiler: xplane`), and prints per run: the median step time (the
trainer's metrics), the device's busy time per step (the union of its op and stream events
between the step program's first and last steady run), the XLA programs
and the kernels that took the most device time, and the device plane's lines as the profiler
wrote them. What the profile analysis reads of each trace (`bench.profile.write_events`,
`--steps` steps of it) goes to `--out` as `<run>.events.json.gz`. This is the measurement behind a
step ratio network/synthetic above 1 with no data wait: is the device busier, or idle?

  python benchmarks/gpu_step_profile.py [--config configs/latency_network.yml] [--out DIR]
      [--steps 8] [--rows 300000] [--dry-run] [key=value ...]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import time
from pathlib import Path

import jax

from maxtext_netdata import config
from maxtext_netdata.bench import accelerator_check, accelerator_data, benchmark
from maxtext_netdata.bench import profile as bench_profile
from maxtext_netdata.bench.arguments import WARMUP_STEPS
from maxtext_netdata.trainer.profiler import trace_dir


def device_summary(xplane: Path, top: int = 12) -> dict:
  """The device plane's lines, busy time and heaviest programs and kernels."""
  from jax.profiler import ProfileData

  data = ProfileData.from_file(str(xplane))
  planes = [p for p in data.planes if p.name.startswith("/device:") and "CPU" not in p.name]
  if not planes:
    return {"device_plane": None}
  plane = planes[0]
  lines, kernels, modules, spans = {}, collections.Counter(), collections.Counter(), []
  for line in plane.lines:
    events = list(line.events)
    lines[line.name] = {
      "events": len(events),
      "busy_ms": sum(e.duration_ns for e in events) / 1e6,
      "first": [
        {"name": e.name[:80], "ms": e.duration_ns / 1e6, "stats": sorted(k for k, _ in e.stats)}
        for e in events[:5]
      ],
    }
    if line.name.lower().startswith("stream") or line.name == "XLA Ops":
      for e in events:
        kernels[e.name[:80]] += e.duration_ns
        spans.append((e.start_ns, e.end_ns))
    if line.name == "XLA Modules":
      for e in events:
        modules[e.name[:80]] += e.duration_ns
  spans.sort()
  busy, end = 0, None
  for lo, hi in spans:  # union of the busy intervals
    if end is None or lo > end:
      busy += hi - lo
      end = hi
    elif hi > end:
      busy += hi - end
      end = hi
  window = (spans[-1][1] - spans[0][0]) if spans else 0
  return {
    "device_plane": plane.name,
    "lines": lines,
    "busy_ms": busy / 1e6,
    "window_ms": window / 1e6,
    "busy_share": busy / window if window else None,
    "top_kernels_ms": {k: v / 1e6 for k, v in kernels.most_common(top)},
    "top_modules_ms": {k: v / 1e6 for k, v in modules.most_common(top)},
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default=accelerator_check.DEFAULT_CONFIG)
  parser.add_argument("--work", default="runs/gpu_step_profile")
  parser.add_argument("--out", default=os.environ.get("OUT") or "runs/gpu_step_profile")
  parser.add_argument("--steps", type=int, default=8, help="measured steps after the warm-up")
  parser.add_argument("--rows", type=int, default=300_000, help="generated measurements")
  parser.add_argument(
    "--kinds", default="synthetic,network_grain", help="dataset_type of each run, in order"
  )
  parser.add_argument("--dry-run", action="store_true", help="the CPU and a tiny model")
  parser.add_argument("overrides", nargs="*", metavar="key=value")
  args = parser.parse_args()
  if args.dry_run:
    jax.config.update("jax_platforms", "cpu")
  work, out = Path(args.work).resolve(), Path(args.out).resolve()
  shutil.rmtree(work, ignore_errors=True)
  out.mkdir(parents=True, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", str(work / "xla_cache"))
  sizes = accelerator_check.DRY_RUN if args.dry_run else accelerator_check.ACCELERATOR
  cfg = config.load(
    args.config,
    [
      *sizes.overrides,
      *args.overrides,
      f"base_output_directory={work / 'runs'}",
      f"grain_train_files={work / 'raw' / '*.parquet'}",
      "num_epoch=-1",
    ],
  )
  started = time.perf_counter()
  store = accelerator_data.make_store(cfg, args.rows, work / "raw", jax.device_count())
  print(f"store: {store['rows']:,} rows in {time.perf_counter() - started:.1f} s", flush=True)
  report = {}
  for number, kind in enumerate(args.kinds.split(",")):
    name = f"{number}_{kind}"
    run_dir = work / "runs" / name
    summary = benchmark.train_and_read_metrics(
      cfg,
      args.steps,
      run_dir,
      dataset_type=kind,
      **benchmark.profiler_window(args.steps, perfetto=False),
    )
    xplane = bench_profile.find_xplane(trace_dir(run_dir))
    events = bench_profile.read_events(xplane)
    bench_profile.write_events(events, out / f"{name}.events.json.gz", steps=args.steps)
    entry = {"step_time": summary["step_time"], "data_wait": summary["data_wait"]}
    entry.update(device_summary(xplane))
    steps = max(summary["step_time"]["n"], 1)
    entry["busy_ms_per_step"] = entry.get("busy_ms", 0) / steps  # the trace: those steps only
    try:
      analyzed = bench_profile.analyze_events(events, "train_step", first_step=WARMUP_STEPS)
      entry["profile"] = {k: analyzed[k] for k in ("source", "module", "step_time_s", "idle_share")}
      entry["profile"]["steps"] = len(analyzed["steps"])
    except ValueError as e:
      entry["profile"] = {"error": str(e)}
    report[name] = entry
    print(
      f"{name}: median step {summary['step_time']['median'] * 1e3:.2f} ms, data wait"
      f" {summary['data_wait']['median'] * 1e3:.2f} ms; device busy"
      f" {entry.get('busy_ms', 0):.1f} ms of a {entry.get('window_ms', 0):.1f} ms window"
      f" ({(entry.get('busy_share') or 0):.0%}); top programs"
      f" {json.dumps(entry.get('top_modules_ms', {}))[:300]}",
      flush=True,
    )
    print(f"  top kernels {json.dumps(entry.get('top_kernels_ms', {}))[:900]}", flush=True)
    print(f"  lines {[(n, v['events']) for n, v in entry.get('lines', {}).items()]}", flush=True)
    print(f"  profile {entry['profile']}", flush=True)
  (out / "gpu_step_profile.json").write_text(json.dumps(report, indent=1, default=float))
  print(f"wrote {out / 'gpu_step_profile.json'} in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
  main()
