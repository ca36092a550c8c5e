"""The profile check on real GPU traces: what `bench --profile` read of the device tracks of an
NVIDIA H200 running the latency model (docs/performance.md, "On an H200"), saved by the
accelerator check (`profile_events.json.gz`, six steps each):

- `h200_scanned`: layers scanned, remat_policy minimal; XLA ran the scanned blocks as CUDA
  command buffers, so most kernels sit under `command_buffer_*` ops. Its run measured a median
  real-data step of 87.29 ms.
- `h200_unrolled`: layers unrolled, remat_policy minimal_with_context (the latency config's
  settings since); plain fusion ops. Its run measured 74.01 ms.
- `h200_one_graph`: the same settings in a later run (the fourth on an H200), whose profile
  records only the steps after the warm-up: XLA ran each whole step as one command buffer (a
  CUDA graph), so every kernel carries the same op, `command_buffer_1`, and only the kernels'
  names tell a step's ops apart. Its run measured 74.60 ms.

The step medians are the runs' own wall-clock figures (report.json), not the trace's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from maxtext_netdata.bench import profile
from maxtext_netdata.bench import report as bench_report

FIXTURES = Path(__file__).parent / "fixtures"
MEASURED_STEP_S = {"h200_scanned": 0.08729, "h200_unrolled": 0.07401, "h200_one_graph": 0.07460}
STEPS = 6


@pytest.fixture(params=sorted(MEASURED_STEP_S), scope="module")
def trace(request) -> tuple[str, dict, dict]:
  events = profile.load_events(FIXTURES / f"{request.param}_profile_events.json.gz")
  return request.param, events, profile.analyze_events(events, "train_step")


def test_the_steps_are_found_on_the_device_tracks(trace):
  name, _, result = trace
  assert result["source"] == "device tracks of /device:GPU:0"
  assert result["module"] == "jit__train_step"
  assert len(result["steps"]) == STEPS
  seconds = [s["seconds"] for s in result["steps"]]
  assert np.median(seconds) == pytest.approx(MEASURED_STEP_S[name], rel=0.03)
  starts = [s["start_s"] for s in result["steps"]]
  assert np.diff(starts) == pytest.approx(seconds[:-1], rel=1e-6)  # back to back


def test_a_busy_gpu_has_no_idle_time_and_no_gaps(trace):
  _, _, result = trace
  assert result["idle_share"]["max"] < profile.IDLE_SHARE_NOTABLE
  assert result["gaps"]["count"] == 0 and result["host_waiting_on"] is None
  assert "no gaps" in profile.describe(result)


def test_kernel_time_by_class_adds_up_to_the_kernels_of_the_steps(trace):
  """The classes sum to the kernel time, which is the kernels' own durations inside the
  steps, counted here from the raw events; cuDNN's attention leads, and the one-hot embedding
  leaves no scatter-add."""
  _, events, result = trace
  device = result["device_time"]
  lo = result["steps"][0]["start_s"]
  hi = result["steps"][-1]["start_s"] + result["steps"][-1]["seconds"]
  first_ns = min(op[2] for op in events["ops"] if op[0] == "jit__train_step")
  inside = [
    (end - start) / 1e9
    for module, _, start, end, *_ in events["ops"]
    if module == "jit__train_step" and lo <= (start - first_ns) / 1e9 < hi
  ]
  assert device["kernels_s"] == pytest.approx(sum(inside) / STEPS, rel=0.01)
  assert device["kernels_s"] == pytest.approx(sum(device["by_class_s"].values()))
  # The device was busy throughout: kernel time is the step, give or take overlaps.
  assert device["kernels_s"] == pytest.approx(
    np.median([s["seconds"] for s in result["steps"]]), rel=0.02
  )
  classes = device["by_class_s"]
  assert classes["matmul"] > classes["attention"] > 0.2 * device["kernels_s"]
  assert classes["scatter"] < 1e-4
  assert next(iter(device["top_kernels_s"])).startswith("cudnn_generated_fort_native_sdpa_sm90")


def test_scanned_layers_copy_what_unrolled_layers_do_not():
  """Scanning the blocks costs device copies (the per-layer slices of the stacked weights,
  gradients and activations) that the unrolled step does without."""
  copies = {}
  for name in MEASURED_STEP_S:
    events = profile.load_events(FIXTURES / f"{name}_profile_events.json.gz")
    copies[name] = profile.analyze_events(events, "train_step")["device_time"]["by_class_s"]["copy"]
  assert copies["h200_scanned"] > 10 * copies["h200_unrolled"] > 0


def test_slower_real_steps_on_a_busy_gpu_are_blamed_on_the_device(trace):
  """With no idle time in a real trace, "forced synchronization suspected" becomes slower
  steps on the device, naming its heaviest kernel: not the loader's or the host's fault."""
  _, _, result = trace
  verdict = bench_report.amend_verdict(
    {"kind": bench_report.FORCED_SYNC, "text": "Forced."}, result
  )
  assert verdict["kind"] == bench_report.SLOWER_ON_DEVICE
  assert "cudnn_generated_fort_native_sdpa_sm90_flash_bprop" in verdict["text"]
