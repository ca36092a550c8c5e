"""The main job's comparison of a network_grain run with its synthetic baseline."""

import json

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
