"""The main job's verdict: a network_grain run against the synthetic baseline of the same model.

`python -m maxtext_netdata.trainer.report NETWORK_SUMMARY SYNTHETIC_SUMMARY` reads the two
`summary.json` files written by `train` and prints step times side by side with the ratio of
their medians (the steady step: a mean also carries checkpoint saves and other one-off steps),
the data-wait share, real tokens/s, and the eval loss on RTT bytes against the unigram
baseline of the training split. It exits 1 when the model does not beat that baseline by
`MIN_RTT_GAIN_NATS` (no signal learnt, or targets not shifted), else 0; timing goals are
reported, not enforced, since they depend on the machine's load.

The runs follow each other, so a shared machine whose speed drifts makes their medians
differ with no input cost at all (measured on a 2-core VM: ratios of 0.96-1.05 for the same
command, and once 1.17, its second half slower). So the baseline may run in two halves, one
before the network run and one after (`python -m maxtext_netdata.trainer.report NETWORK
SYNTHETIC_BEFORE SYNTHETIC_AFTER`, as `scripts/run.sh` runs them): the mean of their medians
is the baseline at the network run's time under a drift that is steady over the three runs
(`pooled`). Each summary carries the standard error of its median
(`median_standard_error`), and the ratio's goal reads "ok" at or under the goal, "MISSED"
only when the ratio exceeds it by more than twice its standard error, and otherwise says the
difference is within this machine's noise.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import numpy as np

STEP_TIME_RATIO_GOAL = 1.03
DATA_WAIT_SHARE_GOAL = 0.02
MIN_RTT_GAIN_NATS = 0.1


# Blocks of consecutive steps whose medians give a median's standard error.
SPREAD_BLOCKS = 6


def _mark(ok: bool) -> str:
  return "ok" if ok else "MISSED"


def median_standard_error(step_times: list[float]) -> float | None:
  """The standard error of the median of `step_times`, from the medians of SPREAD_BLOCKS
  blocks of consecutive steps: it carries the drift of a shared machine's speed over the run,
  which the scatter of single steps would not. None under two steps a block.

  Why not a bootstrap over steps: resampling single steps treats them as independent and
  misses the slow drift that makes two runs differ.
  """
  if len(step_times) < 2 * SPREAD_BLOCKS:
    return None
  blocks = [float(np.median(b)) for b in np.array_split(np.asarray(step_times), SPREAD_BLOCKS)]
  return float(np.std(blocks, ddof=1) / math.sqrt(SPREAD_BLOCKS))


def _ratio_line(network: dict[str, Any], synthetic: dict[str, Any]) -> str:
  """The step time ratio against its goal, with its spread where both runs carry one."""
  ratio = network["median_step_time_s"] / synthetic["median_step_time_s"]
  line = f"median step time ratio network/synthetic: {ratio:.3f}"
  errors = [run.get("median_step_time_se_s") for run in (network, synthetic)]
  if None in errors:
    return f"{line} (goal <= {STEP_TIME_RATIO_GOAL}: {_mark(ratio <= STEP_TIME_RATIO_GOAL)})"
  relative = (
    errors[0] / network["median_step_time_s"],
    errors[1] / synthetic["median_step_time_s"],
  )
  spread = 2 * ratio * math.hypot(*relative)  # two standard errors of the ratio
  if ratio <= STEP_TIME_RATIO_GOAL:
    verdict = "ok"
  elif ratio - spread > STEP_TIME_RATIO_GOAL:
    verdict = "MISSED"
  else:
    verdict = "within this machine's noise"
  return f"{line} ± {spread:.3f} (goal <= {STEP_TIME_RATIO_GOAL}: {verdict})"


def pooled(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
  """One baseline of two synthetic runs, one before the network run and one after: the mean
  of their medians (and of the other figures; the mean step time weighted by steps), its
  standard error the two combined, both metrics files named."""
  out = dict(before)
  means = ("median_step_time_s", "real_tokens_per_s", "data_wait_share", "padding_share")
  for key in (*means, "logger_write_s_per_step"):
    out[key] = (before[key] + after[key]) / 2
  steps = [run.get("steps", 1) for run in (before, after)]
  out["mean_step_time_s"] = (
    before["mean_step_time_s"] * steps[0] + after["mean_step_time_s"] * steps[1]
  ) / sum(steps)
  errors = [run.get("median_step_time_se_s") for run in (before, after)]
  out["median_step_time_se_s"] = None if None in errors else math.hypot(*errors) / 2
  out["metrics_path"] = f"{before['metrics_path']}, {after['metrics_path']}"
  out["halves_ms"] = [before["median_step_time_s"] * 1e3, after["median_step_time_s"] * 1e3]
  return out


def compare(network: dict[str, Any], synthetic: dict[str, Any]) -> tuple[list[str], bool]:
  """Report lines for two train summaries, and whether the RTT loss beats the baseline."""
  wait = network["data_wait_share"]
  halves = synthetic.get("halves_ms")
  lines = [
    f"{'':28}{'network_grain':>16}{'synthetic':>16}",
    f"{'median step time (ms)':28}{network['median_step_time_s'] * 1e3:16.1f}"
    f"{synthetic['median_step_time_s'] * 1e3:16.1f}"
    + (f"  (mean of {halves[0]:.1f} before, {halves[1]:.1f} after)" if halves else ""),
    f"{'mean step time (ms)':28}{network['mean_step_time_s'] * 1e3:16.1f}"
    f"{synthetic['mean_step_time_s'] * 1e3:16.1f}",
    f"{'real tokens/s':28}{network['real_tokens_per_s']:16,.0f}"
    f"{synthetic['real_tokens_per_s']:16,.0f}",
    f"{'data-wait share':28}{wait:16.2%}{synthetic['data_wait_share']:16.2%}",
    f"{'padding share':28}{network['padding_share']:16.2%}{synthetic['padding_share']:16.2%}",
    f"{'logger write per step (ms)':28}{network['logger_write_s_per_step'] * 1e3:16.2f}"
    f"{synthetic['logger_write_s_per_step'] * 1e3:16.2f}",
    f"{'train loss first -> final':28}{network['first_loss']:8.3f} ->{network['final_loss']:6.3f}",
    "",
    _ratio_line(network, synthetic),
    f"data-wait share of step time: {wait:.2%} (goal <= {DATA_WAIT_SHARE_GOAL:.0%}:"
    f" {_mark(wait <= DATA_WAIT_SHARE_GOAL)})",
  ]
  model_loss = network.get("eval_rtt_loss")
  baseline = network.get("eval_rtt_unigram_loss")
  if model_loss is None or baseline is None:
    lines.append("RTT bytes: no eval of the network run (set eval_interval)")
    return lines, False
  beats = model_loss <= baseline - MIN_RTT_GAIN_NATS
  lines += [
    f"eval loss on RTT bytes: model {model_loss:.3f} nats vs unigram baseline"
    f" {baseline:.3f} nats ({baseline - model_loss:+.3f}): "
    + (
      "the model predicts latency from context"
      if beats
      else f"MISSED: the model must beat the baseline by {MIN_RTT_GAIN_NATS} nats"
    ),
    f"eval loss, all targets: {network['eval_loss']:.3f} nats",
    "",
    f"metrics:     {network['metrics_path']}",
    f"TensorBoard: {network['tensorboard_dir']}",
    f"baseline:    {synthetic['metrics_path']}",
  ]
  return lines, beats


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if len(argv) not in (2, 3):
    print(
      "usage: python -m maxtext_netdata.trainer.report NETWORK_SUMMARY SYNTHETIC_SUMMARY"
      " [SYNTHETIC_AFTER_SUMMARY]"
    )
    return 2
  network, *synthetic = (json.loads(open(path, encoding="utf-8").read()) for path in argv)
  lines, beats = compare(network, synthetic[0] if len(synthetic) == 1 else pooled(*synthetic))
  print("\n".join(lines))
  return 0 if beats else 1


if __name__ == "__main__":
  sys.exit(main())
