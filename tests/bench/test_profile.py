"""The profile check on real JAX profiler traces of a real jitted computation (CPU): gaps a loop
inserts on purpose are found and attributed; a loop without them shows none."""

from __future__ import annotations

import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxtext_netdata.bench import profile
from maxtext_netdata.bench import report as bench_report

FIXTURES = Path(__file__).parent / "fixtures"
STEPS = 8
SLEEP_S = 0.04


@jax.jit
def _step(x):
  for _ in range(3):
    x = jnp.tanh(x @ x) * 0.5
  return x, jnp.sum(x)


def _batches(sleep_s: float):
  while True:
    if sleep_s:
      time.sleep(sleep_s)
    yield np.full((768, 768), 0.01, np.float32)


def _run(tmp_path, *, loader_sleep=0.0, read_then_sleep=0.0) -> dict:
  """STEPS annotated steps of `_step` under the profiler, then the analysis of the trace."""
  batches = _batches(loader_sleep)
  x = jnp.ones((768, 768))
  jax.block_until_ready(_step(x + next(batches)))  # compiled before the trace
  with jax.profiler.trace(str(tmp_path / "trace")):
    for i in range(STEPS + 1):
      with jax.profiler.StepTraceAnnotation("train", step_num=i):
        batch = next(batches)
        x, loss = _step(x + batch)
      if read_then_sleep:
        float(loss)  # the host waits for the step...
        time.sleep(read_then_sleep)  # ...and the device idles while it logs
    jax.block_until_ready(x)  # the trace ends after the last step
  return profile.analyze(profile.find_xplane(tmp_path / "trace"))


@pytest.fixture(scope="module")
def step_s() -> float:
  x = jnp.ones((768, 768))
  jax.block_until_ready(_step(x))
  start = time.perf_counter()
  for _ in range(5):
    x, _ = _step(x)
  jax.block_until_ready(x)
  return (time.perf_counter() - start) / 5


def test_back_to_back_steps_have_no_gaps(tmp_path):
  result = _run(tmp_path)
  assert len(result["steps"]) == STEPS
  assert result["module"] == "jit__step"
  assert result["source"] == "XLA threads of the CPU host"
  # No gaps between back-to-back steps. A loaded machine may deschedule the host past a gap's
  # threshold (5% of a step) once or twice in a run (seen once with the other core busy); an
  # analysis taking the steps' own op spacing for gaps would find them in most steps. (A trace
  # with no gap at all is described as such: tests/bench/test_gpu_traces.py.)
  assert result["gaps"]["steps_with_gaps"] <= 2, result["steps"]
  assert result["idle_share"]["median"] < profile.IDLE_SHARE_NOTABLE
  # Each step is three 768 x 768 matmuls and a few elementwise ops: the matmuls dominate.
  device = result["device_time"]
  assert device["by_class_s"]["matmul"] > 2 * device["by_class_s"]["other"] > 0, device
  assert device["kernels_s"] == pytest.approx(sum(device["by_class_s"].values()))
  # Slower steps without gaps were computed more slowly, not held up by a synchronization.
  verdict = bench_report.amend_verdict(
    {"kind": bench_report.FORCED_SYNC, "text": "Forced."}, result
  )
  assert verdict["kind"] == bench_report.STARVED
  assert "no forced synchronization" in verdict["text"]


def test_a_sleeping_loader_leaves_gaps_while_the_host_waits_for_data(tmp_path, step_s):
  # The device computes a step while the loader sleeps for the next batch: a gap is the sleep
  # less the step, whose time here is the fixture's estimate. A loaded machine can slow the
  # traced steps by tens of ms (a 0.016 s median gap where 0.04 s was wanted, with the suite's
  # two worker processes beside a busy core), so the loader waits 0.1 s beyond the step.
  wait = 0.1
  result = _run(tmp_path, loader_sleep=wait + step_s)
  # Every step but the first (whose batch came before the trace's first step started).
  assert result["gaps"]["steps_with_gaps"] >= STEPS - 1
  assert result["host_waiting_on"] == profile.DATA
  gaps = [g["seconds"] for s in result["steps"] for g in s["gaps"]]
  assert np.median(gaps) == pytest.approx(wait, rel=0.5)
  assert result["idle_share"]["median"] > 0.2


def test_a_device_read_then_host_work_is_forced_synchronization(tmp_path):
  result = _run(tmp_path, read_then_sleep=SLEEP_S)
  assert result["gaps"]["steps_with_gaps"] >= STEPS - 1
  assert result["host_waiting_on"] == profile.DEVICE_READ
  gaps = [g["seconds"] for s in result["steps"] for g in s["gaps"]]
  assert np.median(gaps) == pytest.approx(SLEEP_S, rel=0.5)
  verdict = bench_report.amend_verdict(
    {"kind": bench_report.NOT_BOTTLENECK, "text": "Data loading is not the bottleneck."}, result
  )
  assert verdict["kind"] == bench_report.FORCED_SYNC
  assert "device-to-host read" in verdict["text"]


def test_a_read_that_waited_is_the_gap_s_cause_when_the_device_wraps_up_after_it():
  # MaxText's loop on a tiny model reading each step's loss, then logging for 40 ms
  # (tests/helpers/maxtext_hooks.py), traced on a 2-core host beside two busy processes. In one
  # of the 4 steps the read waited 295 ms for the step and returned 3.3 ms before the CPU's
  # last XLA event ended: the read caused that gap as much as the others.
  events = profile.load_events(FIXTURES / "cpu_loaded_read_each_step_profile_events.json.gz")
  result = profile.analyze_events(events, step_module="train_step")
  assert result["module"] == "jit_train_step" and len(result["steps"]) == 4
  causes = [g["cause"] for s in result["steps"] for g in s["gaps"]]
  assert causes == [profile.DEVICE_READ] * 4
  # The 13 reads of the previous step's scalars (already computed) in each step are not waits.
  reads = [(a, b) for name, a, b in events["python"] if name.endswith("__float__")]
  quick = [b - a for a, b in reads if b - a < profile.READ_WAITED_S * 1e9]
  assert len(quick) > 40 and max(quick) < 0.2e6


def test_saved_events_give_the_trace_s_analysis_and_a_window_of_it(tmp_path, step_s):
  """What `write_events` keeps of a trace analyses as the trace does; a window of 4 steps keeps
  those steps (a small fixture of a long trace) and their gaps. The loader sleeps 0.1 s beyond
  the step, as in the test above: at twice the step's quiet time, a loaded machine's slower
  steps left no gap, and the trace no cause to name (seen once beside a busy core)."""
  analyzed = _run(tmp_path, loader_sleep=0.1 + step_s)
  events = profile.read_events(profile.find_xplane(tmp_path / "trace"))
  whole = profile.load_events(profile.write_events(events, tmp_path / "all.json.gz"))
  assert profile.analyze_events(whole) == analyzed
  window = profile.load_events(profile.write_events(events, tmp_path / "four.json.gz", steps=4))
  assert (tmp_path / "four.json.gz").stat().st_size < (tmp_path / "all.json.gz").stat().st_size
  cut = profile.analyze_events(window)
  assert len(cut["steps"]) == 4
  middle = {round(s["seconds"], 6) for s in analyzed["steps"]}
  assert {round(s["seconds"], 6) for s in cut["steps"]} <= middle
  assert cut["host_waiting_on"] == analyzed["host_waiting_on"] == profile.DATA


def test_too_few_steps_is_a_clear_error(tmp_path):
  with jax.profiler.trace(str(tmp_path / "trace")):
    jax.block_until_ready(_step(jnp.ones((8, 8))))
  with pytest.raises(ValueError, match="1 runs of the step"):
    profile.analyze(profile.find_xplane(tmp_path / "trace"))


def test_a_missing_trace_leaves_the_verdict_and_says_why(tmp_path):
  result = profile.read(tmp_path)
  assert result == {"error": f"{tmp_path}: no .xplane.pb profiler trace"}
  verdict = bench_report.amend_verdict({"kind": bench_report.BOTTLENECK, "text": "Slow."}, result)
  assert verdict == {
    "kind": bench_report.BOTTLENECK,
    "text": f"Slow. No profile: {result['error']}",
  }


def _gpu_step_ops(steps: int, layers: int, period: int, first: int = 1000):
  """Kernels of `steps` back-to-back runs of a scanned train step as a GPU trace shows them:
  module and op, no run id; per run an embedding op, `layers` loop iterations of three ops,
  two update ops; an op cut by the trace's start runs once, and another module runs between."""
  ops = [("jit__train_step", "transpose.9", first - 50, first - 40, None)]
  for step in range(steps):
    t = first + step * period
    ops.append(("jit__train_step", "gather_fusion", t, t + 5, None))
    for layer in range(layers):
      for k, op in enumerate(("gemm_fusion_dot.1", "cudnn_sdpa", "loop_fusion.4")):
        start = t + 10 + layer * 30 + k * 10
        ops.append(("jit__train_step", op, start, start + 8, None))
    end = t + 10 + layers * 30
    ops += [("jit__train_step", "update.1", end, end + 5, None)]
    ops += [("jit__train_step", "update.2", end + 5, end + 9, None)]
    ops += [("jit_convert_element_type", "convert", end + 20, end + 21, None)]
  return ops


def test_gpu_kernels_without_run_ids_split_into_the_runs_of_the_step():
  """On a GPU the step's runs are found from its kernels alone: one run per step, each
  starting at an op that runs once a step, whatever the order the events come in."""
  ops = _gpu_step_ops(steps=5, layers=4, period=200)
  runs = profile.runs_of_ops(list(reversed(ops)))
  steps = sorted((lo, hi) for name, lo, hi in runs if name == "jit__train_step")
  assert [lo for lo, _ in steps] == [1000 + 200 * i for i in range(5)]
  assert all(hi == lo + 10 + 4 * 30 + 9 for lo, hi in steps)
  assert sorted(name for name, _, _ in runs).count("jit_convert_element_type") == 5
  # Ops with run ids (XLA on the CPU) stay grouped by them.
  numbered = [("jit_step", "a", 0, 5, 7), ("jit_step", "b", 6, 9, 7), ("jit_step", "a", 20, 25, 8)]
  assert sorted(profile.runs_of_ops(numbered)) == [("jit_step", 0, 9), ("jit_step", 20, 25)]


def test_gpu_kernel_time_per_step_by_class(tmp_path):
  """The kernel time of the analyzed steps, by what each kernel's name says it is: cuDNN's
  flash attention, cuBLAS and Triton GEMMs, copies, the rest (XLA's fusions)."""
  kernels = {
    "gemm_fusion_dot.1": "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT",
    "cudnn_sdpa": "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3",
    "loop_fusion.4": "loop_multiply_fusion_4",
    "gather_fusion": "input_gather_fusion",
    "update.1": "input_scatter_fusion_2",
    "update.2": "memcpy_d2d",
  }
  ops = [
    (*op, kernels.get(op[1], "transpose_kernel"))
    for op in _gpu_step_ops(steps=5, layers=4, period=200)
  ]
  events = {"source": "gpu", "busy": [o[2:4] for o in ops], "runs": None, "ops": ops}
  events["python"] = []
  result = profile.analyze_events(events, "train_step")
  assert len(result["steps"]) == 4  # five runs: four whole periods
  per_step = {label: s * 1e9 for label, s in result["device_time"]["by_class_s"].items()}
  # Per step: 4 layers x 8 ns of each op in the loop (other: the loop fusion), gather 5
  # (other), update.1 5 (scatter), update.2 4 (copy), and the other module's transpose (1 ns,
  # copy) between the steps.
  expected = {"attention": 32, "matmul": 32, "scatter": 5, "copy": 5, "other": 37}
  assert per_step == pytest.approx(expected)
  top = result["device_time"]["top_kernels_s"]
  assert list(top.values()) == sorted(top.values(), reverse=True) and len(top) == 6
  assert top[kernels["cudnn_sdpa"]] * 1e9 == pytest.approx(32)
  # A saved window of 2 steps of it: those steps, the same kernel time per step.
  window = profile.load_events(profile.write_events(events, tmp_path / "two.json.gz", steps=2))
  cut = profile.analyze_events(window, "train_step")
  assert len(cut["steps"]) == 2
  assert cut["device_time"]["by_class_s"] == pytest.approx(result["device_time"]["by_class_s"])
  # Saved events of traces without kernel names analyze as before, without the breakdown.
  events["ops"] = [op[:5] for op in ops]
  assert profile.analyze_events(events, "train_step")["device_time"] is None


def test_slower_real_steps_on_a_busy_accelerator_are_more_device_work():
  """Slower real steps with no data wait and an accelerator that never idles: on a GPU's own
  tracks that is more work on the device (the H100's real-data steps: one scatter kernel of
  17-70 ms each), named by the heaviest kernels; on a CPU platform, loading sharing the cores."""
  ops = [
    (*op, "input_scatter_fusion_2" if op[1] == "update.1" else "loop_multiply_fusion_4")
    for op in _gpu_step_ops(steps=5, layers=4, period=200)
  ]
  gpu = {"source": "device tracks of /device:GPU:0", "busy": [o[2:4] for o in ops]}
  gpu |= {"runs": None, "ops": ops, "python": []}
  result = profile.analyze_events(gpu, "train_step")
  assert result["idle_share"]["median"] <= profile.IDLE_SHARE_NOTABLE
  forced = {"kind": bench_report.FORCED_SYNC, "text": "Forced."}
  verdict = bench_report.amend_verdict(forced, result)
  assert verdict["kind"] == bench_report.SLOWER_ON_DEVICE
  assert "use_iota_embed: true" in verdict["text"]
  assert "input_scatter_fusion_2 (scatter)" in verdict["text"]
  cpu = profile.analyze_events({**gpu, "source": "XLA threads of the CPU host"}, "train_step")
  assert bench_report.amend_verdict(forced, cpu)["kind"] == bench_report.STARVED
