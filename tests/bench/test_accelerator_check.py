"""The accelerator check (bench/accelerator_check.py, scripts/accelerator_check.sh): its
dry run end to end on the CPU, and its parts on constructed inputs (the chip of a device,
the batch sweep's stops, the trimmed trace)."""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from packaging.requirements import Requirement

from maxtext_netdata import config
from maxtext_netdata.bench import (
  accelerator_check,
  accelerator_report,
  accelerator_runs,
  accelerator_sizes,
  accelerators,
  flops,
  profile,
)
from maxtext_netdata.bench import report as bench_report
from maxtext_netdata.distributed.mesh import make_mesh
from maxtext_netdata.input_pipeline import interface
from maxtext_netdata.trainer import xla_flags
from tests.helpers import REPO

TABLE_ROWS = (
  "device",
  "model",
  "kernels",
  "synthetic",
  "data",
  "placed each step",
  "network_grain",
  "placed on demand",
  "real batch fixed",
  "fixed, gather embed",
  "attention",
  "verdict",
  "profile",
  "device time",
  "loading alone",
  "synthetic device",
  "in-process",
  "batch sweep",
  "xla options",
  "elapsed",
)


def _accelerator_image(folder: Path) -> tuple[str, str, Path]:
  """What the accelerator VM will have, made here from the package index as set-up is: a venv
  like its image (`scripts/accelerator_venv.sh`: jax at setup.py's lower bound, no Grain) and
  the wheels the check installs there (`scripts/accelerator_wheels.sh`): the venv's python,
  its jax version and the wheel folder."""
  venv, wheels = folder / "venv", folder / "wheels"
  made = _script("accelerator_venv.sh", venv)  # its last line: "DIR: python X, jax Y"
  _script("accelerator_wheels.sh", wheels)
  jax_version = made.strip().splitlines()[-1].rpartition("jax ")[2]
  return str(venv / "bin" / "python"), jax_version, wheels


def _script(script: str, target: Path) -> str:
  """`bash scripts/SCRIPT TARGET` with the project's python: its stdout."""
  made = subprocess.run(
    ["bash", f"scripts/{script}", str(target)],
    cwd=REPO,
    env={k: v for k, v in os.environ.items() if k != "PYTHON"},
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert made.returncode == 0, f"scripts/{script} (it needs the package index): " + (
    made.stdout[-2000:] + made.stderr[-2000:]
  )
  return made.stdout


@pytest.mark.slow
@pytest.mark.timeout(1500)  # the image's download (the package index's pace) and the check
def test_dry_run_writes_the_report_the_plot_the_trace_and_ends_with_the_table(tmp_path):
  """The check as the VM runs it: its image's jax, which is the lowest setup.py admits, and the
  wheels it lacks installed by the script."""
  python, jax_version, wheels = _accelerator_image(tmp_path / "image")
  [lowest] = [
    spec.version
    for req in map(Requirement, importlib.metadata.requires("maxtext_netdata"))
    if req.name == "jax"
    for spec in req.specifier
    if spec.operator == ">="
  ]
  assert jax_version == lowest
  out, work = tmp_path / "out", tmp_path / "work"
  result = subprocess.run(
    ["bash", "scripts/accelerator_check.sh", "--dry-run", "--out", str(out)]
    + ["--wheels", str(wheels), "--work", str(work), "--peak-tflops", "1"],
    cwd=REPO,
    env={**os.environ, "PYTHON": python},
    capture_output=True,
    text=True,
    timeout=400,
  )
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  count = len(list(wheels.glob("*.whl")))
  assert f"installing {count} wheels from {wheels} into" in result.stdout
  table = result.stdout.rstrip().splitlines()[-len(TABLE_ROWS) :]
  assert [line.split("  ")[0] for line in table] == list(TABLE_ROWS), "\n".join(table)
  assert (out / "check.log").read_text().rstrip().endswith("\n".join(table))
  assert f"jax {jax_version}, jaxlib {jax_version}" in table[0]

  report = json.loads((out / "report.json").read_text())
  assert report["errors"] == {} and report["skipped"] == {}
  assert report["environment"]["platform"] == "cpu"
  assert report["environment"]["peak_tflops"] == 1.0
  # The entry point added the project's XLA flags before the backend started (and says so).
  assert "--xla_gpu_enable_triton_gemm=false" in report["environment"]["xla_flags"]
  assert "XLA_FLAGS --xla_gpu_enable_triton_gemm=false" in table[0]

  shape = report["model"]
  assert (shape["sequences"], shape["max_target_length"]) == (4, 128)
  synthetic = report["synthetic"]
  assert synthetic["first_step_s"] > synthetic["step_time"]["median"] > 0  # the compile
  assert synthetic["tokens_per_step"] == 4 * 128 > synthetic["real_tokens_per_step"] > 0
  assert synthetic["mfu"] == pytest.approx(
    flops.utilization(shape["flops_per_token"], synthetic["tokens_per_s"], 1, 1.0)
  )
  assert synthetic["mfu"] > synthetic["mfu_real_tokens"] > 0
  assert f"MFU {synthetic['mfu']:.1%}" in table[TABLE_ROWS.index("synthetic")]
  kernels = table[TABLE_ROWS.index("kernels")]
  assert kernels.endswith(
    "attention xla, remat_policy minimal_with_context, embedding by matmul, layers unrolled"
  )

  placed = report["synthetic_placed"]  # the synthetic batch, placed anew every step
  assert placed["real_tokens_per_step"] == synthetic["real_tokens_per_step"]
  assert placed["step_ratio_to_synthetic"] == pytest.approx(
    placed["step_time"]["median"] / synthetic["step_time"]["median"]
  )
  assert "placed/synthetic" in table[TABLE_ROWS.index("placed each step")]

  network = report["network"]
  assert 0 <= network["data_wait_share"] < 1
  assert network["step_ratio_to_synthetic"] == pytest.approx(
    network["step_time"]["median"] / synthetic["step_time"]["median"]
  )
  assert report["data"]["rows"] == accelerator_sizes.DRY_RUN.rows
  on_demand = report["network_on_demand"]
  assert on_demand["step_ratio_to_synthetic"] > 0
  assert on_demand["real_tokens_per_step"] == network["real_tokens_per_step"]  # same batches
  # One real batch, repeated: the first batch of the network runs, with the configured
  # embedding lookup (a matmul: use_iota_embed) and with the other one (a gather).
  fixed, fixed_gather = report["network_fixed"], report["network_fixed_embed"]
  assert (fixed["use_iota_embed"], fixed_gather["use_iota_embed"]) == (True, False)
  steps = accelerator_sizes.DRY_RUN.steps
  assert fixed["step_time"]["n"] == fixed_gather["step_time"]["n"] == steps
  assert fixed["real_tokens_per_step"] == fixed_gather["real_tokens_per_step"] > 0
  assert fixed_gather["step_ratio_to_synthetic"] == pytest.approx(
    fixed_gather["step_time"]["median"] / synthetic["step_time"]["median"]
  )
  assert "fixed/synthetic" in table[TABLE_ROWS.index("fixed, gather embed")]

  # One layer's attention on the real batch's segments: XLA's kernel and Pallas's (run by
  # its interpreter here) within float32's error of the reference; cuDNN's kernels recorded
  # as not running on a CPU.
  attention = report["attention_kernels"]
  assert attention["shape"] == [4, 128, 2, 2, 32] and attention["runs_per_row"]["max"] >= 1
  kernels = attention["kernels"]
  for name in ("xla", "pallas"):
    assert max(kernels[name]["max_abs_error"].values()) < 1e-4 and kernels[name]["seconds"] > 0
  assert set(kernels) == set(accelerator_sizes.DRY_RUN.attention_kernels)
  assert all("error" in kernels[name] for name in ("cudnn", "cudnn_packed_fit"))
  assert attention["speedup"]["xla"] == 1.0 and set(attention["speedup"]) == {"xla", "pallas"}
  assert "xla" in table[TABLE_ROWS.index("attention")]

  bench = report["bench"]
  assert bench["verdict"]["kind"] in {
    bench_report.NOT_BOTTLENECK,
    bench_report.BOTTLENECK,
    bench_report.STARVED,
    bench_report.FORCED_SYNC,
  }
  assert bench["profile"]["idle_share"]["median"] >= 0, bench["profile"]
  assert [s["workers"] for s in report["loading"]] == [0, 1]
  assert all(s["real_tokens_per_s"] > 0 for s in report["loading"])
  assert [s["threads"] for s in report["loading_threads"]] == [0, 1]
  assert all(s["real_tokens_per_s_per_core"] > 0 for s in report["loading_threads"])
  assert "0 threads" in table[TABLE_ROWS.index("in-process")]

  sweep = report["batch_sweep"]
  assert [r["per_device_batch_size"] for r in sweep["runs"]] == [2, 4]
  assert sweep["best"] in (2, 4) and sweep["stopped"] is None
  # Every candidate compiled and ran under the VM's XLA, each against the configured run.
  options = report["xla_option_sweep"]
  candidates = [{"compile_xla_flags": flags} for flags in xla_flags.CANDIDATES.values()]
  assert [r["switches"] for r in options["runs"]] == candidates
  assert all(r["tokens_per_s"] > 0 for r in options["runs"]) and options["stopped"] is None
  assert table[TABLE_ROWS.index("xla options")].endswith(
    f"the configured run: {report['synthetic']['tokens_per_s']:,.0f} tokens/s,"
    f" MFU {report['synthetic']['mfu']:.1%}"
  )

  assert report["outputs"]["plot"] == str(out / "report.png")
  assert (out / "report.png").read_bytes().startswith(b"\x89PNG")
  trace = out / "trace.json.gz"
  assert 0 < trace.stat().st_size <= accelerator_check.TRACE_BYTES
  assert json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
  # The profile's events, cut to a few steps, analyse as the profile did.
  events = profile.load_events(out / "profile_events.json.gz")
  assert events["source"] == report["bench"]["profile"]["source"]
  assert len(profile.analyze_events(events, "train_step")["steps"]) >= 1
  # The synthetic step profiled too: its device time beside the real step's, its events saved.
  synthetic = report["synthetic_profile"]
  assert synthetic["device_time"]["by_class_s"]["matmul"] > 0, synthetic
  saved = profile.analyze_events(profile.load_events(synthetic["events"]), "train_step")
  assert len(saved["steps"]) == accelerator_check.PROFILE_STEPS


def _dry_run_module(*args: str) -> subprocess.CompletedProcess:
  """`python -m maxtext_netdata.bench.accelerator_check --dry-run ARGS` on the CPU."""
  return subprocess.run(
    [sys.executable, "-m", "maxtext_netdata.bench.accelerator_check", "--dry-run", *args],
    cwd=REPO,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
    capture_output=True,
    text=True,
    timeout=300,
  )


def test_no_part_starts_once_the_budget_is_spent(tmp_path):
  """A budget spent from the start: the synthetic reference runs all the same, every later
  part is recorded as skipped for the budget (or for a part it needs), and the table still
  ends the output, so a check cut short by its budget ends before the machine's time limit
  kills it."""
  result = _dry_run_module("--work", str(tmp_path), "--budget-s", "0")
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads((tmp_path / "report.json").read_text())
  assert report["synthetic"]["step_time"]["median"] > 0 and report["errors"] == {}
  spent = {name for name, why in report["skipped"].items() if "0 s budget was spent" in why}
  later = {"synthetic_placed", "data", "synthetic_profile", "switch_sweep", "batch_sweep"}
  assert later <= spent
  assert report["skipped"]["network"] == report["skipped"]["bench"] == "needs data"
  assert report["skipped"]["outputs"] == "needs bench"  # outputs run whatever the budget
  assert report["bench"] is None and report["switch_sweep"] is None
  lines = result.stdout.rstrip().splitlines()
  assert lines[-1].startswith("elapsed")
  assert any(line.startswith("batch_sweep skipped") and "budget" in line for line in lines)


def test_skipped_parts_do_not_run_and_the_parts_that_need_them_say_so(tmp_path):
  """`--skip`: a later run on a machine lent for minutes spends them on what is unmeasured.
  The parts named are recorded as left out, those that need them as needing them, and the
  rest still run."""
  skip = "data,switch_sweep,batch_sweep,synthetic_profile"
  result = _dry_run_module("--work", str(tmp_path), "--skip", skip)
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads((tmp_path / "report.json").read_text())
  assert report["errors"] == {}
  assert report["synthetic"]["step_time"]["median"] > 0
  assert report["synthetic_placed"]["step_time"]["median"] > 0  # not named: it ran
  for name in skip.split(","):
    assert report[name] is None and report["skipped"][name] == "left out by --skip"
  assert report["skipped"]["network"] == report["skipped"]["bench"] == "needs data"
  assert any(line.startswith("data skipped") for line in result.stdout.splitlines())


def test_an_unknown_part_to_skip_is_one_line_before_any_part(tmp_path):
  result = _dry_run_module("--work", str(tmp_path), "--skip", "data,netwrk")
  assert result.returncode == 2
  last = result.stderr.strip().splitlines()[-1]
  assert "argument --skip: no part netwrk to skip (parts: synthetic_placed, data," in last
  assert not (tmp_path / "report.json").exists()


def test_a_bad_override_is_one_line_before_any_part(tmp_path):
  result = _dry_run_module("--work", str(tmp_path), "bogus_key=1")
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1] == (
    "python -m maxtext_netdata.bench.accelerator_check: error: command line: unknown config"
    " key 'bogus_key'"
  )
  assert "Traceback" not in result.stderr
  assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
  ("device_kind", "chip"),
  [
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", None),
    ("NVIDIA H200", "h200"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("TPU v5 lite", "v5e"),
    ("TPU v5", "v5p"),
    ("TPU v6 lite", "v6e"),
    ("cpu", None),
  ],
)
def test_chip_of_device_kind(device_kind, chip):
  assert accelerators.chip_of_device_kind(device_kind) == chip


def test_placed_synthetic_hands_out_the_synthetic_batch_anew_every_step():
  cfg = config.load("configs/smoke.yml", ["dataset_type=synthetic", "device_prefetch=2"])
  device_mesh = make_mesh(cfg)
  expected, _ = interface.create_data_iterator(cfg, device_mesh)
  expected = {key: np.asarray(value) for key, value in next(expected).items()}
  placed, evaluation = accelerator_runs.placed_synthetic(cfg, device_mesh)
  assert evaluation is None
  first, second = next(placed), next(placed)
  for batch in (first, second):
    assert set(batch) == set(expected)
    for key, value in expected.items():
      np.testing.assert_array_equal(np.asarray(batch[key]), value, err_msg=key)
  assert first["inputs"] is not second["inputs"]
  assert placed.get_state() == {"count": 2}  # the position after the batches handed out
  # Each step's host batch is a new buffer, as a loader's batches are.
  host = placed.local_iterator
  assert not np.shares_memory(next(host)["inputs"], next(host)["inputs"])
  placed.close()


def test_fixed_network_hands_out_the_first_real_batch_at_every_step(sample_dir, tmp_path):
  cfg = config.load(
    "configs/smoke.yml",
    [f"grain_train_files={sample_dir}/*.parquet", f"base_output_directory={tmp_path}"],
  )
  device_mesh = make_mesh(cfg)
  loader, _ = interface.create_data_iterator(cfg, device_mesh)
  try:
    expected = {key: np.asarray(value) for key, value in next(loader).items()}
  finally:
    loader.close()
  fixed, evaluation = accelerator_runs.fixed_network(cfg, device_mesh)
  assert evaluation is None
  first, second = next(fixed), next(fixed)
  assert set(first) == set(expected)
  for key, value in expected.items():
    np.testing.assert_array_equal(np.asarray(first[key]), value, err_msg=key)
    assert second[key] is first[key]  # on the devices once, as the synthetic batch is
  assert fixed.get_state() == {"count": 2}
  # Real batches are skewed: their most frequent token takes far more of the embedding
  # gradient's updates than the synthetic batch's does (what the run measures on a GPU).
  counts = np.bincount(expected["inputs"].ravel())
  synthetic_counts = np.bincount(
    np.asarray(
      next(interface.create_data_iterator(cfg.replace(dataset_type="synthetic"), device_mesh)[0])[
        "inputs"
      ]
    ).ravel()
  )
  assert counts.max() > 10 * synthetic_counts.max()


def _configured_run(size: float, tokens_per_s: float, wall_s: float = 10.0) -> dict:
  return {
    "per_device_batch_size": size,
    "wall_s": wall_s,
    "tokens_per_s": tokens_per_s,
    "real_tokens_per_s": tokens_per_s * 0.9,
    "mfu": None,
    "mfu_real_tokens": None,
    "step_time": {"median": 1.0},
  }


class _Left:
  def __init__(self, seconds: float):
    self.seconds = seconds

  def left(self) -> float:
    return self.seconds


def _sweep(monkeypatch, tmp_path, fails_from: int, budget_left: float = 1e9) -> dict:
  """The sweep of 16/32/48/64 around a configured 32, each size's run made up: tokens/s
  grows with the batch until `fails_from`, which runs out of memory."""

  def fake_measure(cfg, steps, run_dir, peak, devices, dataset_type, per_device_batch_size):
    if per_device_batch_size >= fails_from:
      raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate\ndetails")
    return _configured_run(per_device_batch_size, 1000.0 * per_device_batch_size)

  monkeypatch.setattr(accelerator_runs, "measure_training", fake_measure)
  cfg = config.load(None, ["per_device_batch_size=32"])
  env = {"peak_tflops": None, "devices": 1}
  configured = _configured_run(32.0, 30_000.0)
  sizes = accelerator_sizes.ACCELERATOR._replace(batch_scales=(0.5, 1.0, 1.5, 2.0))
  return accelerator_runs.sweep_batch_sizes(
    cfg, sizes, tmp_path, configured, env, _Left(budget_left)
  )


def test_batch_sweep_picks_the_most_tokens_per_second(monkeypatch, tmp_path):
  sweep = _sweep(monkeypatch, tmp_path, fails_from=1000)
  assert [r["per_device_batch_size"] for r in sweep["runs"]] == [16, 32, 48, 64]
  assert sweep["runs"][1]["tokens_per_s"] == 30_000.0  # the configured run, not re-run
  assert sweep["best"] == 64 and sweep["stopped"] is None


def test_batch_sweep_stops_at_the_first_failed_size(monkeypatch, tmp_path):
  sweep = _sweep(monkeypatch, tmp_path, fails_from=48)
  assert [r["per_device_batch_size"] for r in sweep["runs"]] == [16, 32, 48]
  error = "RuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate"
  assert sweep["runs"][-1]["error"] == error
  assert sweep["best"] == 32 and sweep["stopped"] == "per_device_batch_size=48 failed"


def test_batch_sweep_stops_before_overrunning_the_budget(monkeypatch, tmp_path):
  # 5 s left, and the configured run took 10 s: no new size fits.
  sweep = _sweep(monkeypatch, tmp_path, fails_from=1000, budget_left=5.0)
  assert [r["per_device_batch_size"] for r in sweep["runs"]] == [32]
  assert sweep["best"] == 32
  assert sweep["stopped"] == "per_device_batch_size=16 and the sizes after it: 5 s left"


def test_switch_sweep_records_a_failing_switch_and_picks_the_fastest(monkeypatch, tmp_path):
  """A switch running out of memory is a result, not the end of the sweep; the fastest of the
  others is picked."""
  switches = accelerator_sizes.ACCELERATOR.switches
  names = [" ".join(f"{key}={value}" for key, value in s.items()) for s in switches]
  # The first switch runs out of memory; the second is the fastest of the others.
  assert len(names) >= 3
  tokens_per_s = {name: 20_000.0 / (i + 1) for i, name in enumerate(names[1:])}

  def fake_measure(cfg, steps, run_dir, peak, devices, dataset_type, **switches):
    name = " ".join(f"{key}={value}" for key, value in switches.items())
    if name == names[0]:
      raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate\ndetails")
    return _configured_run(32.0, tokens_per_s[name])

  monkeypatch.setattr(accelerator_runs, "measure_training", fake_measure)
  cfg = config.load(None, ["per_device_batch_size=32"])
  configured = _configured_run(32.0, 15_000.0)
  sweep = accelerator_runs.sweep_switches(
    cfg,
    accelerator_sizes.ACCELERATOR,
    tmp_path,
    configured,
    {"peak_tflops": None, "devices": 1},
    _Left(1e9),
  )
  assert [r["switches"] for r in sweep["runs"]] == list(accelerator_sizes.ACCELERATOR.switches)
  assert sweep["runs"][0]["error"].startswith("RuntimeError: RESOURCE_EXHAUSTED: Out of memory")
  assert [r.get("tokens_per_s") for r in sweep["runs"]] == [None, *tokens_per_s.values()]
  assert sweep["best"] == switches[1] and sweep["stopped"] is None
  assert sweep["best_run"]["tokens_per_s"] == 20_000.0

  stopped = accelerator_runs.sweep_switches(
    cfg,
    accelerator_sizes.ACCELERATOR,
    tmp_path,
    configured,
    {"peak_tflops": None, "devices": 1},
    _Left(5.0),
  )
  assert stopped["runs"] == [] and stopped["best"] == {}
  assert stopped["stopped"] == f"{names[0]} and the switches after it: 5 s left"


def _trace(path: Path, events: int) -> None:
  timed = [
    {"ph": "X", "pid": 1, "tid": 2, "ts": float(i), "dur": 0.5, "name": f"op {i} " + "x" * 40}
    for i in range(events)
  ]
  meta = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}}]
  text = json.dumps({"displayTimeUnit": "ns", "traceEvents": meta + timed})
  path.write_bytes(gzip.compress(text.encode()))


def test_trimmed_trace_keeps_the_middle_and_the_names_within_the_size(tmp_path):
  source, target = tmp_path / "perfetto_trace.json.gz", tmp_path / "trace.json.gz"
  _trace(source, 200_000)
  max_bytes = source.stat().st_size // 10
  info = accelerator_report.trim_trace(source, target, max_bytes)
  assert 0 < target.stat().st_size <= max_bytes
  trace = json.loads(gzip.decompress(target.read_bytes()))
  assert trace["displayTimeUnit"] == "ns"
  assert trace["traceEvents"][0]["ph"] == "M"
  stamps = [e["ts"] for e in trace["traceEvents"][1:]]
  assert len(stamps) == info["events"] < info["of_events"] == 200_000
  middle = (stamps[0] + stamps[-1]) / 2
  assert abs(middle - 100_000) <= 1
  assert stamps == sorted(stamps) and stamps[-1] - stamps[0] == len(stamps) - 1  # contiguous


def test_small_trace_is_kept_whole(tmp_path):
  source, target = tmp_path / "perfetto_trace.json.gz", tmp_path / "trace.json.gz"
  _trace(source, 100)
  info = accelerator_report.trim_trace(source, target, accelerator_check.TRACE_BYTES)
  assert info["events"] == info["of_events"] == 100
