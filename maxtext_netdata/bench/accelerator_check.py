"""One prepared check on an accelerator VM: how fast is the step, and is it fed?

`bash scripts/accelerator_check.sh` runs this module on a bare GPU or TPU VM without network
(docs/performance.md, "On an accelerator"); `--dry-run` runs the same code on the CPU with a
tiny model and tiny sizes. The parts, in order:

1. environment: package versions, the devices, the chip's bf16 peak, host cores and memory;
2. synthetic: the configured model on `dataset_type=synthetic` (when its step fails, once
   more with `FALLBACK`, and the parts after measure that): the first step (compile
   included), the median step, tokens/s and MFU counting the configured token slots
   (MaxText's figure, padding included) and real tokens (the trainer's), device memory;
3. placed: the synthetic batch again, but placed on the devices anew every step the way
   `network_grain`'s batches are (`device_prefetch` ahead): with the network run below, it
   tells a step ratio that comes from placing batches from one that comes from loading them;
4. data: generated measurements (`maxtext-netdata generate`) prepared into a store here, and
   the batch kernel made ready (compiled on a machine's first run), which the network runs
   then measure rather than its Python stand-in;
5. network: the same model on `network_grain` from that store: median step, the share of the
   step spent waiting for data, the step ratio network/synthetic; then once more with each
   batch placed on the device when its step asks (`device_prefetch=0`), which measures what
   placing batches ahead is worth there; then one real batch placed once and handed out at
   every step (`real batch fixed`), as the synthetic batch is: what the real data's values
   cost the device, and the same with the other embedding lookup (`use_iota_embed` flipped:
   the gradient a scatter-add, whose time depends on the tokens, or a matmul);
6. attention: one layer's attention, forward and backward, on the real batch's segments by
   `cudnn` and by cuDNN's packed layout with room for the batch's own most runs
   (`bench.attention_kernels`, `Sizes.attention_kernels`): time, and the error against the
   float32 reference, which keeps the packed layout shown exact on the device;
7. bench: `maxtext-netdata bench --profile` with a worker sweep: the verdict, the profile's
   idle share and gaps, the real-data step's device time by kernel class, and loading alone
   (real tokens/s) per `grain_worker_count`;
8. switch sweep: the configured batch on synthetic data with each switch of the mode (wider
   heads, Pallas's attention, what each block keeps for the backward pass, fused
   projections), the MFU of each and the fastest; a switch that fails (out of memory) is
   recorded and the next one runs;
9. batch sweep: `per_device_batch_size` around the configured one on synthetic data, with the
   fastest switches, the MFU of each and the best; it stops at the first size that fails (out
   of memory) and before a size whose compile would overrun the time budget;
10. the synthetic step under the profiler, its device time beside the real one's;
11. in-process loading alone per `grain_num_threads` (real tokens/s a core): measured alike
   on both GPU hosts so far;
12. XLA option sweep: the configured batch on synthetic data compiled with each of
   `Sizes.xla_options` as `compile_xla_flags` (`xla_flags.CANDIDATES` on a device), each
   against the configured run. Last, as experimental compiler options are the likeliest to
   end the process (a failed check inside XLA) rather than raise, which would lose the parts
   after them; an option XLA refuses is recorded and the next one runs.
The switch and batch sweeps come before parts 10 and 11, which repeat what earlier runs
measured, as the budget may end the check early. The training runs and sweeps are
`bench.accelerator_runs`'; the store, the attention on a real batch and loading alone
`bench.accelerator_data`'s; how much each part measures on a device and in the dry run
(`ACCELERATOR`, `DRY_RUN`) `bench.accelerator_sizes`'.

The machine is lent for minutes, so a part that fails is recorded with its error and the next
one runs, and report.json is rewritten after every part. Compiled programs are cached on disk
for the check's duration (a fresh cache each time): the first synthetic step pays the compile,
later runs of the same shapes load it. Outputs in `--out`: report.json, report.png (bench's
plot), trace.json.gz (the profile's Perfetto trace, trimmed to TRACE_BYTES),
profile_events.json.gz (what the profile analysis read of the trace, PROFILE_STEPS steps: the
fixture of tests/bench/test_profile.py's device test), synthetic_profile_events.json.gz (the
same of the synthetic step); the last lines printed are a short table.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import jax

from maxtext_netdata import config
from maxtext_netdata.bench import (
  accelerator_report,
  accelerators,
  benchmark,
  flops,
  render,
)
from maxtext_netdata.bench import profile as bench_profile
from maxtext_netdata.bench.accelerator_data import (
  attention_on_a_real_batch,
  loading_by_threads,
  loading_by_workers,
  make_store,
)
from maxtext_netdata.bench.accelerator_runs import (
  Budget,
  Sizes,
  error_line,
  measure_fixed_network,
  measure_placed_synthetic,
  measure_training,
  profile_synthetic,
  sweep_batch_sizes,
  sweep_switches,
  with_ratio,
)
from maxtext_netdata.bench.accelerator_sizes import ACCELERATOR, DRY_RUN
from maxtext_netdata.config import Config, ConfigError
from maxtext_netdata.trainer import attention, model, xla_flags
from maxtext_netdata.trainer.profiler import trace_dir

DEFAULT_CONFIG = "configs/latency_network.yml"
DEFAULT_WORK = "runs/accelerator_check"
# The check's own time limit: the machine allows 10 minutes a command, start-up included.
BUDGET_S = 480.0
# The trimmed profile trace (gzip), small enough to come back from the machine.
TRACE_BYTES = 4 * 2**20
# Steps of the profile's events kept in profile_events.json.gz.
PROFILE_STEPS = 6
# The parts `--skip` may leave out: all but the synthetic reference and the outputs.
SKIPPABLE = (
  "synthetic_placed",
  "data",
  "network",
  "network_on_demand",
  "network_fixed",
  "network_fixed_embed",
  "attention_kernels",
  "bench",
  "switch_sweep",
  "batch_sweep",
  "synthetic_profile",
  "loading_threads",
  "xla_option_sweep",
)
# The configuration the check falls back to when the configured step fails: XLA's attention
# and every block recomputed, the least memory.
FALLBACK = {"attention": "xla", "remat_policy": "full"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
  parser.add_argument(
    "--config", default=DEFAULT_CONFIG, help=f"YAML config (default {DEFAULT_CONFIG})"
  )
  parser.add_argument(
    "--dry-run",
    action="store_true",
    help="the same check on the CPU with a tiny model and tiny sizes (~2 minutes on 2 cores)",
  )
  parser.add_argument(
    "--work",
    default=DEFAULT_WORK,
    help=f"folder of the generated data, the store and the runs (default {DEFAULT_WORK})",
  )
  parser.add_argument(
    "--out", help="folder of report.json, report.png and trace.json.gz (default: --work)"
  )
  parser.add_argument(
    "--peak-tflops",
    type=float,
    metavar="X",
    help="the chip's bf16 peak TFLOP/s (default: the listed chip of the device, else no MFU)",
  )
  parser.add_argument(
    "--budget-s",
    type=float,
    default=BUDGET_S,
    metavar="S",
    help=f"time budget: no part starts once it is spent (but the outputs), and the sweeps stop"
    f" before overrunning it (default {BUDGET_S:g})",
  )
  parser.add_argument(
    "--skip",
    type=_part_names,
    default=(),
    metavar="PART[,PART]",
    help="parts not to run, as report.json names them (a later run on the same kind of machine"
    f" spends its minutes on what is still unmeasured): {', '.join(SKIPPABLE)}",
  )


def _part_names(text: str) -> tuple[str, ...]:
  names = tuple(n.strip() for n in text.split(",") if n.strip())
  unknown = [n for n in names if n not in SKIPPABLE]
  if unknown:
    raise argparse.ArgumentTypeError(
      f"no part {', '.join(unknown)} to skip (parts: {', '.join(SKIPPABLE)})"
    )
  return names


def run(args: argparse.Namespace) -> dict:
  """Every part in order; returns the report (also written to `<out>/report.json`)."""
  started = time.perf_counter()
  if args.dry_run:
    jax.config.update("jax_platforms", "cpu")
  sizes = DRY_RUN if args.dry_run else ACCELERATOR
  budget = Budget(args.budget_s)
  work = Path(args.work).resolve()
  out = Path(args.out or work).resolve()
  out.mkdir(parents=True, exist_ok=True)
  cache = work / "xla_cache"
  shutil.rmtree(cache, ignore_errors=True)  # the first step must pay the compile
  jax.config.update("jax_compilation_cache_dir", str(cache))

  env = accelerators.environment(args.peak_tflops)
  _progress(accelerator_report.environment_line(env, env["packages"]))
  overrides = [
    *sizes.overrides,
    *args.overrides,
    f"base_output_directory={work / 'runs'}",
    f"grain_train_files={work / 'raw' / '*.parquet'}",
    "num_epoch=-1",  # the runs take what they need of a small store
  ]
  if env["peak_tflops"]:
    overrides.append(f"peak_tflops_per_device={env['peak_tflops']}")
  cfg = config.load(args.config, overrides)
  report = {
    "dry_run": args.dry_run,
    "config": args.config,
    "overrides": overrides,
    "sizes": sizes._asdict(),
    "environment": env,
    "model": model_figures(cfg, env["devices"]),
    "synthetic": None,
    "synthetic_placed": None,
    "data": None,
    "network": None,
    "network_on_demand": None,
    "network_fixed": None,
    "network_fixed_embed": None,
    "attention_kernels": None,
    "bench": None,
    "loading": None,
    "loading_threads": None,
    "switch_sweep": None,
    "batch_sweep": None,
    "xla_option_sweep": None,
    "outputs": None,
    "synthetic_profile": None,
    "errors": {},
    "skipped": {},
    "fallback": None,
    "out": str(out),
    "elapsed_s": None,
  }

  def save() -> None:
    report["elapsed_s"] = time.perf_counter() - started
    render.write_json(report, out / "report.json")

  def part(
    name: str, measure: Callable[[], dict | list], needs: tuple[str, ...] = (), always=False
  ) -> None:
    """Runs `measure` into report[name], unless a part it needs has no result, or the budget
    is spent (`always`: the synthetic reference, and the part that writes what the others
    measured)."""
    missing = [n for n in needs if report[n] is None]
    if name in args.skip:
      report["skipped"][name] = "left out by --skip"
    elif missing:
      report["skipped"][name] = f"needs {', '.join(missing)}"
    elif budget.left() <= 0 and not always:
      over = -budget.left()
      report["skipped"][name] = f"the {args.budget_s:g} s budget was spent ({over:.0f} s ago)"
    else:
      _progress(f"{name} ({budget.left():.0f} s of the budget left)")
      try:
        report[name] = measure()
      except Exception as e:  # the other parts' figures must still come back
        traceback.print_exc()
        report["errors"][name] = error_line(e)
    save()

  peak, devices = env["peak_tflops"], env["devices"]

  def synthetic() -> dict:
    return measure_training(
      cfg, sizes.steps, work / "runs" / "synthetic", peak, devices, dataset_type="synthetic"
    )

  part("synthetic", synthetic, always=True)  # the reference of every ratio
  if report["synthetic"] is None:
    # The configured step did not run (out of memory, a kernel refused at compile time): the
    # safest kernels still measure the rest; the error stays in the report.
    report["errors"]["synthetic (configured)"] = report["errors"].pop("synthetic", None)
    cfg = cfg.replace(**FALLBACK)
    report["fallback"] = ", ".join(f"{k}={v}" for k, v in FALLBACK.items())
    report["model"] = model_figures(cfg, devices)
    part("synthetic", synthetic, always=True)

  def against_synthetic(name: str, measure=measure_training, **overrides) -> Callable[[], dict]:
    """The training run `name` (into runs/<name>) with its median step over the synthetic's."""
    run_dir = work / "runs" / name
    return lambda: with_ratio(
      measure(cfg, sizes.steps, run_dir, peak, devices, **overrides), report["synthetic"]
    )

  part(
    "synthetic_placed",
    against_synthetic("synthetic_placed", measure_placed_synthetic),
    needs=("synthetic",),
  )
  part("data", lambda: make_store(cfg, sizes.rows, work / "raw", devices))
  part("network", against_synthetic("network"), needs=("data",))
  part(
    "network_on_demand", against_synthetic("network_on_demand", device_prefetch=0), needs=("data",)
  )
  part("network_fixed", against_synthetic("network_fixed", measure_fixed_network), needs=("data",))
  part(
    "network_fixed_embed",
    against_synthetic(
      "network_fixed_embed", measure_fixed_network, use_iota_embed=not cfg.use_iota_embed
    ),
    needs=("data",),
  )
  part("attention_kernels", lambda: attention_on_a_real_batch(cfg, sizes), needs=("data",))
  part("bench", lambda: run_bench(cfg, args, sizes, env, work / "bench"), needs=("data",))
  if report["bench"] is not None:
    report["loading"] = loading_by_workers(report["bench"])
  part(
    "outputs",
    lambda: write_outputs(report["bench"], work / "bench", out),
    needs=("bench",),
    always=True,
  )
  part(
    "switch_sweep",
    lambda: sweep_switches(cfg, sizes, work / "runs", report["synthetic"], env, budget),
    needs=("synthetic",),
  )
  fastest = (report["switch_sweep"] or {}).get("best_run") or report["synthetic"]
  part(
    "batch_sweep",
    lambda: sweep_batch_sizes(
      cfg.replace(**fastest.get("switches", {})), sizes, work / "runs", fastest, env, budget
    ),
    needs=("synthetic",),
  )
  part(
    "synthetic_profile",
    lambda: profile_synthetic(cfg, work, out, peak, devices, PROFILE_STEPS),
    needs=("synthetic",),
  )
  part("loading_threads", lambda: loading_by_threads(cfg, sizes), needs=("data",))
  part(
    "xla_option_sweep",
    lambda: sweep_switches(
      cfg,
      sizes,
      work / "runs",
      report["synthetic"],
      env,
      budget,
      switches=tuple({"compile_xla_flags": flags} for flags in sizes.xla_options),
      name="xla_options",
    ),
    needs=("synthetic",),
  )
  save()
  print(accelerator_report.format_table(report), flush=True)
  return report


def model_figures(cfg: Config, devices: int) -> dict:
  """Parameters, FLOPs per token (model, its attention term, executed) and the batch."""
  sequences = cfg.global_batch_size(devices)
  return {
    "params": model.num_params(cfg),
    "flops_per_token": model.training_flops_per_token(cfg),
    "attention_flops_per_token": flops.attention_flops_per_token(cfg),
    "executed_flops_per_token": flops.executed_flops_per_token(cfg),
    "per_device_batch_size": cfg.per_device_batch_size,
    "sequences": sequences,
    "max_target_length": cfg.max_target_length,
    "tokens_per_step": sequences * cfg.max_target_length,
    "attention": attention.attention_used(cfg),
    "remat_policy": cfg.remat_policy,
    "use_iota_embed": cfg.use_iota_embed,
    "scan_layers": cfg.scan_layers,
  }


def run_bench(cfg: Config, args: argparse.Namespace, sizes: Sizes, env: dict, out_dir: Path):
  """`maxtext-netdata bench CONFIG --profile --sweep-workers ...`'s report, not printed: the
  synthetic run, loading alone per worker count (those of `sizes` up to the cores), the
  profiled real run and the verdict."""
  chip_known = env["chip"] is not None and not args.peak_tflops
  bench_args = argparse.Namespace(
    overrides=list(args.overrides),
    peak_tflops=None if chip_known else env["peak_tflops"],
    accelerator=env["chip"] if chip_known else None,
    steps=sizes.steps,
    batches=sizes.batches,
    target_step_time=None,
    profile=True,
  )
  sweep = [w for w in sizes.workers if w <= env["cpu_cores"]]
  return benchmark.measure(cfg, bench_args, sweep, out_dir)


def write_outputs(bench: dict, bench_dir: Path, out: Path) -> dict:
  """bench's plot as `out/report.png`, its profile's Perfetto trace, trimmed, as
  `out/trace.json.gz`, and what the profile analysis read of the trace, PROFILE_STEPS steps
  of it, as `out/profile_events.json.gz` (`bench.profile.write_events`: a test fixture of this
  device's trace); None for what the profiler did not write."""
  plot = render.write_plot(bench, out / "report.png")
  trace = _newest(trace_dir(bench_dir / "real"), "perfetto_trace.json.gz")
  xplane = (bench.get("profile") or {}).get("trace")
  events = None
  if xplane:
    events = bench_profile.write_events(
      bench_profile.read_events(xplane), out / "profile_events.json.gz", steps=PROFILE_STEPS
    )
  return {
    "plot": str(plot),
    "trace": accelerator_report.trim_trace(trace, out / "trace.json.gz", TRACE_BYTES)
    if trace
    else None,
    "profile_events": str(events) if events else None,
  }


def _newest(folder: Path, name: str) -> Path | None:
  found = sorted(folder.rglob(name), key=lambda p: p.stat().st_mtime)
  return found[-1] if found else None


def _progress(message: str) -> None:
  print(f"[accelerator_check] {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
  """Runs the check; exit status 1 when a part failed, 2 for a bad config or override."""
  parser = argparse.ArgumentParser(
    prog="python -m maxtext_netdata.bench.accelerator_check", description=__doc__.split("\n")[0]
  )
  add_arguments(parser)
  args = parser.parse_args(argv)
  xla_flags.apply()  # before the first backend starts
  from absl import flags

  # Grain reads its absl flags when it starts worker processes; only an entry point may
  # parse them, and this one takes every setting from the config.
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  try:
    report = run(args)
  except ConfigError as e:  # a bad config or override: before any part runs
    print(f"{parser.prog}: error: {e}", file=sys.stderr)
    return 2
  return 1 if report["errors"] else 0


if __name__ == "__main__":
  sys.exit(main())
