"""The main job's verdict: a network_grain run against the synthetic baseline of the same model.

`python -m maxtext_netdata.trainer.report NETWORK_SUMMARY SYNTHETIC_SUMMARY` reads the two
`summary.json` files written by `train` and prints step times side by side with the ratio of
their medians (the steady step: a mean also carries checkpoint saves and other one-off steps),
the data-wait share, real tokens/s, and the eval loss on RTT bytes against the unigram
baseline of the training split. It exits 1 when the model does not beat that baseline by
`MIN_RTT_GAIN_NATS` (no signal learnt, or targets not shifted), else 0; timing goals are
reported, not enforced, since they depend on the machine's load.
"""

from __future__ import annotations

import json
import sys
from typing import Any

STEP_TIME_RATIO_GOAL = 1.03
DATA_WAIT_SHARE_GOAL = 0.02
MIN_RTT_GAIN_NATS = 0.1


def _mark(ok: bool) -> str:
  return "ok" if ok else "MISSED"


def compare(network: dict[str, Any], synthetic: dict[str, Any]) -> tuple[list[str], bool]:
  """Report lines for two train summaries, and whether the RTT loss beats the baseline."""
  ratio = network["median_step_time_s"] / synthetic["median_step_time_s"]
  wait = network["data_wait_share"]
  lines = [
    f"{'':28}{'network_grain':>16}{'synthetic':>16}",
    f"{'median step time (ms)':28}{network['median_step_time_s'] * 1e3:16.1f}"
    f"{synthetic['median_step_time_s'] * 1e3:16.1f}",
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
    f"median step time ratio network/synthetic: {ratio:.3f} (goal <= {STEP_TIME_RATIO_GOAL}:"
    f" {_mark(ratio <= STEP_TIME_RATIO_GOAL)})",
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
  if len(argv) != 2:
    print("usage: python -m maxtext_netdata.trainer.report NETWORK_SUMMARY SYNTHETIC_SUMMARY")
    return 2
  network, synthetic = (json.loads(open(path, encoding="utf-8").read()) for path in argv)
  lines, beats = compare(network, synthetic)
  print("\n".join(lines))
  return 0 if beats else 1


if __name__ == "__main__":
  sys.exit(main())
