"""The profile check on real JAX profiler traces of a real jitted computation (CPU): gaps a loop
inserts on purpose are found and attributed; a loop without them shows none."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxtext_netdata.bench import profile
from maxtext_netdata.bench import report as bench_report

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
  with profile.trace(tmp_path / "trace"):
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
  assert result["gaps"]["count"] == 0, result["steps"]
  assert result["host_waiting_on"] is None
  assert result["idle_share"]["median"] < profile.IDLE_SHARE_NOTABLE
  assert "no gaps" in profile.describe(result)
  # Slower steps without gaps were computed more slowly, not held up by a synchronization.
  verdict = profile.amend_verdict({"kind": bench_report.FORCED_SYNC, "text": "Forced."}, result)
  assert verdict["kind"] == bench_report.STARVED
  assert "no forced synchronization" in verdict["text"]


def test_a_sleeping_loader_leaves_gaps_while_the_host_waits_for_data(tmp_path, step_s):
  result = _run(tmp_path, loader_sleep=SLEEP_S + step_s)
  # Every step but the first (whose batch came before the trace's first step started).
  assert result["gaps"]["steps_with_gaps"] >= STEPS - 1
  assert result["host_waiting_on"] == profile.DATA
  gaps = [g["seconds"] for s in result["steps"] for g in s["gaps"]]
  assert np.median(gaps) == pytest.approx(SLEEP_S, rel=0.5)
  assert result["idle_share"]["median"] > 0.2


def test_a_device_read_then_host_work_is_forced_synchronization(tmp_path):
  result = _run(tmp_path, read_then_sleep=SLEEP_S)
  assert result["gaps"]["steps_with_gaps"] >= STEPS - 1
  assert result["host_waiting_on"] == profile.DEVICE_READ
  gaps = [g["seconds"] for s in result["steps"] for g in s["gaps"]]
  assert np.median(gaps) == pytest.approx(SLEEP_S, rel=0.5)
  verdict = profile.amend_verdict(
    {"kind": bench_report.NOT_BOTTLENECK, "text": "Data loading is not the bottleneck."}, result
  )
  assert verdict["kind"] == bench_report.FORCED_SYNC
  assert "device-to-host read" in verdict["text"]


def test_too_few_steps_is_a_clear_error(tmp_path):
  with profile.trace(tmp_path / "trace"):
    jax.block_until_ready(_step(jnp.ones((8, 8))))
  with pytest.raises(ValueError, match="1 runs of the step"):
    profile.analyze(profile.find_xplane(tmp_path / "trace"))


def test_a_missing_trace_leaves_the_verdict_and_says_why(tmp_path):
  result = profile.read(tmp_path)
  assert result == {"error": f"{tmp_path}: no .xplane.pb profiler trace"}
  verdict = profile.amend_verdict({"kind": bench_report.BOTTLENECK, "text": "Slow."}, result)
  assert verdict == {
    "kind": bench_report.BOTTLENECK,
    "text": f"Slow. No profile: {result['error']}",
  }
