"""The main job's comparison of a network_grain run with its synthetic baseline."""

import json
import math

import pytest

from maxtext_netdata.trainer import report


def _summary(step_time, wait, **extra):
  return {
    "median_step_time_s": step_time,
    "mean_step_time_s": step_time * 1.5,  # one-off slow steps (checkpoints) do not count
    "data_wait_share": wait,
    "real_tokens_per_s": 2048 / step_time,
    "padding_share": 0.03,
    "logger_write_s_per_step": 0.002,
    "first_loss": 6.0,
    "final_loss": 1.5,
    "metrics_path": "runs/x/metrics.jsonl",
    "tensorboard_dir": "runs/x/tensorboard",
    **extra,
  }


def test_compare_reports_ratio_wait_and_rtt_verdict():
  network = _summary(0.102, 0.01, eval_loss=2.0, eval_rtt_loss=3.5, eval_rtt_unigram_loss=4.2)
  lines, beats = report.compare(network, _summary(0.100, 0.0))
  text = "\n".join(lines)
  assert beats
  assert "median step time ratio network/synthetic: 1.020 (goal <= 1.03: ok)" in text
  assert "data-wait share of step time: 1.00% (goal <= 2%: ok)" in text
  assert "model 3.500 nats vs unigram baseline 4.200 nats (+0.700)" in text


def test_main_fails_when_the_model_does_not_beat_the_baseline(tmp_path, capsys):
  network = _summary(0.2, 0.05, eval_loss=2.0, eval_rtt_loss=4.15, eval_rtt_unigram_loss=4.2)
  paths = []
  for name, summary in (("network", network), ("synthetic", _summary(0.1, 0.0))):
    paths.append(tmp_path / f"{name}.json")
    paths[-1].write_text(json.dumps(summary))
  assert report.main([str(p) for p in paths]) == 1
  out = capsys.readouterr().out
  assert "ratio network/synthetic: 2.000 (goal <= 1.03: MISSED)" in out
  assert "MISSED: the model must beat the baseline by 0.1 nats" in out


def test_median_standard_error_carries_the_drift_between_blocks_of_steps():
  assert report.median_standard_error([0.1] * 11) is None  # under two steps a block
  assert report.median_standard_error([0.125] * 60) == 0.0
  # A machine 10% slower for the second half: block medians 1.0, 1.0, 1.0, 1.1, 1.1, 1.1,
  # whose standard deviation is 0.05 * sqrt(6 / 5), over sqrt(6) blocks.
  drifting = [1.0] * 50 + [1.1] * 50
  assert report.median_standard_error(drifting) == pytest.approx(0.05 * math.sqrt(1.2 / 6))


@pytest.mark.parametrize(
  ("network_step", "error", "verdict"),
  [
    (0.102, 0.001, "ok"),
    (0.105, 0.0005, "MISSED"),  # 2 standard errors of the ratio: 0.015
    (0.105, 0.002, "within this machine's noise"),  # 0.058
  ],
)
def test_ratio_goal_is_missed_only_beyond_two_standard_errors(network_step, error, verdict):
  network = _summary(network_step, 0.0, median_step_time_se_s=error)
  synthetic = _summary(0.100, 0.0, median_step_time_se_s=error)
  lines, _ = report.compare(network, synthetic)
  ratio = network_step / 0.100
  spread = 2 * ratio * math.hypot(error / network_step, error / 0.100)
  expected = f"ratio network/synthetic: {ratio:.3f} ± {spread:.3f} (goal <= 1.03: {verdict})"
  assert expected in "\n".join(lines)


def test_a_baseline_in_two_halves_around_the_run_cancels_a_steady_drift(tmp_path, capsys):
  """The machine slows steadily: the baseline's half before the run takes 90 ms a step, the
  half after 110, the run 100 between them. Against either half alone the ratio would be 1.11
  (MISSED) or 0.91; against their mean it is 1.00."""
  network = _summary(0.100, 0.0, median_step_time_se_s=0.001, eval_loss=2.0,
                     eval_rtt_loss=3.5, eval_rtt_unigram_loss=4.2)  # fmt: skip
  before = _summary(0.090, 0.0, median_step_time_se_s=0.001, steps=150)
  after = _summary(0.110, 0.01, median_step_time_se_s=0.002, steps=150)
  after["metrics_path"] = "runs/y/metrics.jsonl"
  baseline = report.pooled(before, after)
  assert baseline["median_step_time_s"] == pytest.approx(0.100)
  assert baseline["median_step_time_se_s"] == pytest.approx(math.hypot(0.001, 0.002) / 2)
  assert baseline["mean_step_time_s"] == pytest.approx(0.150)
  assert baseline["data_wait_share"] == pytest.approx(0.005)
  paths = []
  for name, summary in (("network", network), ("before", before), ("after", after)):
    paths.append(tmp_path / f"{name}.json")
    paths[-1].write_text(json.dumps(summary))
  assert report.main([str(p) for p in paths]) == 0
  out = capsys.readouterr().out
  assert "100.0  (mean of 90.0 before, 110.0 after)" in out
  assert "ratio network/synthetic: 1.000 ± " in out and "(goal <= 1.03: ok)" in out
  assert "baseline:    runs/x/metrics.jsonl, runs/y/metrics.jsonl" in out
