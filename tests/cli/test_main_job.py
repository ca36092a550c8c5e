"""The README's first command, `bash scripts/run.sh`, as a new user runs it: sample data
generated, the store prepared, the smoke model trained on network_grain and on synthetic data,
and the summary's verdicts, with exit status 0 only when the model beats the RTT baseline."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from tests.helpers import REPO


@pytest.mark.slow  # 300 steps of the smoke model and 2 x 150: 2.3 minutes, 5 beside a busy core
@pytest.mark.timeout(1200)  # beyond the run's own 900 s, which then reports its output
def test_main_job_trains_compares_and_beats_the_rtt_baseline(tmp_path):
  runs, sample = tmp_path / "runs", tmp_path / "sample"
  env = {**os.environ, "NETDATA_RUNS": str(runs), "NETDATA_SAMPLE": str(sample)}
  result = subprocess.run(
    ["bash", "scripts/run.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
  )
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  out = result.stdout
  assert (sample / ".complete").exists()  # generated where NETDATA_SAMPLE says
  network, before, after = (
    json.loads((runs / name / "summary.json").read_text())
    for name in ("smoke_network", "smoke_synthetic", "smoke_synthetic_after")
  )
  assert network["dataset_type"] == "network_grain"
  assert before["dataset_type"] == after["dataset_type"] == "synthetic"
  # The baseline as long as the run, in two halves around it; its median their medians' mean.
  assert network["steps"] == 300 and before["steps"] == after["steps"] == 150
  baseline = (before["median_step_time_s"] + after["median_step_time_s"]) / 2
  ratio = network["median_step_time_s"] / baseline
  line = re.search(r"ratio network/synthetic: ([\d.]+) ± ([\d.]+) \(goal <= 1.03: (.+)\)", out)
  assert line, out[-3000:]
  assert float(line[1]) == pytest.approx(ratio, abs=5e-4)
  assert float(line[2]) > 0
  assert line[3] in ("ok", "MISSED", "within this machine's noise")
  assert "the model predicts latency from context" in out
  assert network["eval_rtt_loss"] <= network["eval_rtt_unigram_loss"] - 0.1
