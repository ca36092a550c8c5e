"""The figures, verdict and outputs of `maxtext-netdata bench`.

Everything here works on plain timings, so the decision can be checked on constructed numbers:
`loading_summary` and `training_summary` condense measurements, `recommend_workers` reads a
worker-count sweep, and `decide` turns the figures into a verdict in plain words, which
`amend_verdict` corrects by a profile's analysis (`bench.profile`) when there is one; `render`
presents the resulting report dict.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from maxtext_netdata.bench import kernel_time
from maxtext_netdata.bench import profile as bench_profile

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
# The profile's finding (`amend_verdict`): an accelerator busy throughout slower real
# steps, computing more on the real batches than on the reference one.
SLOWER_ON_DEVICE = "real_data_slower_on_device"

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
          "reason": f"the fewest workers loading a batch in {ms(s['batch_s'])},"
          f" {target_step_s / s['batch_s']:.1f}x under the {ms(target_step_s)} step"
          f" (>= {SWEEP_HEADROOM:g}x wanted)",
        }
  best = min(s["batch_s"] for s in by_workers)
  pick = next(s for s in by_workers if s["batch_s"] <= best * SWEEP_NEAR_BEST)
  return {
    "workers": pick["workers"],
    "reason": f"the fewest workers within {int((SWEEP_NEAR_BEST - 1) * 100)}% of the fastest"
    f" ({ms(pick['batch_s'])} per batch)",
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
    f"loading takes {ms(batch_s)} per batch (p90 {ms(loading['batch_time_s']['p90'])},"
    f" {loading['workers']} workers) against a {ms(target_step_s)} step ({target_source})"
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
      "text": f"{fast} Real-data steps take {ms(real_step)}, as fast as the"
      f" {ms(reference_step_s)} reference step.",
    }
  slower = (
    f"real-data steps take {ms(real_step)}, {slowdown:.2f}x the {ms(reference_step_s)}"
    f" reference step"
  )
  if wait >= WAIT_EXPLAINS_SHARE * (real_step - reference_step_s):
    return {
      "kind": STARVED,
      "text": f"Loading is fast alone but starved in training: {loading_words}; yet"
      f" {slower}, and waiting {ms(wait)} for data is most of the difference. Training and"
      " loading compete for the host (CPU threads of the step, memory bandwidth) or the"
      " prefetch is too shallow: give the loader dedicated cores (fewer XLA host threads),"
      " raise grain_per_worker_buffer_size and grain_prefetch_buffer_size. A loop that waits"
      " for the device every step also stops loading from overlapping the step.",
    }
  return {
    "kind": FORCED_SYNC,
    "text": f"Forced synchronization suspected: loading is fast ({ms(batch_s)} per batch,"
    f" {ratio:.1f}x under the step), yet {slower}, and waiting for data ({ms(wait)})"
    " explains little of it."
    " Something in the loop makes the host wait for the device each step: host reads of"
    " device values (print(loss), float(metric), .item(), np.asarray on a jax.Array),"
    " jax.device_get or block_until_ready in the loop, blocking checkpoint saves, or"
    " logging that is not asynchronous. Read metrics one step late and checkpoint"
    " asynchronously. --profile tells this from an accelerator that is busy throughout,"
    " computing more on the real batches.",
  }


def ms(seconds: float | None) -> str:
  if seconds is None:
    return "n/a"
  if seconds >= 1.0:
    return f"{seconds:.2f} s"
  return f"{seconds * 1e3:.2f} ms"


def amend_verdict(verdict: dict, profile: dict) -> dict:
  """`verdict` with the profile's words, and its kind corrected by what the trace shows.

  `profile` is `bench.profile`'s analysis of real-data steps. "Not the bottleneck" turns into
  the cause of the gaps when the accelerator idles for more than
  `profile.IDLE_SHARE_NOTABLE` of a step. "Forced synchronization suspected" (slower real steps
  with little data wait) is withdrawn when the accelerator never idles: the steps ran slower,
  they were not held up. On a CPU platform that is loading and the step sharing the same
  cores; on an accelerator (its own device tracks) it is more work on the device for the real
  batches than for the reference one (`real_data_slower_on_device`), named by the heaviest
  kernels of the real step.
  """
  if "error" in profile:
    return {"kind": verdict["kind"], "text": f"{verdict['text']} No profile: {profile['error']}"}
  text = f"{verdict['text']} {bench_profile.describe(profile)}"
  kind = verdict["kind"]
  cause = profile["host_waiting_on"]
  idle = profile["idle_share"]["median"]
  if kind == FORCED_SYNC and idle <= bench_profile.IDLE_SHARE_NOTABLE:
    if profile["source"].startswith(bench_profile.DEVICE_TRACKS):
      return {"kind": SLOWER_ON_DEVICE, "text": f"{text} {_busier_device(profile)}"}
    return {
      "kind": STARVED,
      "text": f"{text} So the slower steps are no forced synchronization: the accelerator was"
      " busy throughout and computed more slowly, as when the loader and the step compete for"
      " the same cores (always so on a CPU platform); give the loader cores of its own.",
    }
  if kind == NOT_BOTTLENECK and idle > bench_profile.IDLE_SHARE_NOTABLE:
    if cause == bench_profile.DEVICE_READ:
      kind = FORCED_SYNC
      text += (
        " Forced synchronization: the host reads a device value each step, so nothing is"
        " queued while it works; read metrics one step late."
      )
    elif cause == bench_profile.DATA:
      kind = STARVED
      text += " The loader does not keep up inside training: see loading_starved_in_training."
  return {"kind": kind, "text": text}


def _busier_device(profile: dict) -> str:
  """Why an accelerator busy throughout slower real steps was slower, and its heaviest kernels."""
  words = (
    "So the slower steps are no forced synchronization and no wait for the host: the"
    " accelerator was busy throughout and had more to compute on the real batches than on the"
    " reference batch. A kernel whose time depends on the token values does this: the"
    " gradient of an embedding lookup is a scatter-add whose updates collide on frequent"
    " tokens (use_iota_embed: true, MaxText's key, makes it a matmul)."
  )
  device = profile.get("device_time")
  if not device:
    return words
  top = ", ".join(
    f"{name} ({kernel_time.kernel_class(name)}) {seconds * 1e3:.2f} ms"
    for name, seconds in list(device["top_kernels_s"].items())[:3]
  )
  return f"{words} The heaviest kernels of a real-data step: {top}."
