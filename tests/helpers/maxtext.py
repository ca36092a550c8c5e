"""The tiny MaxText model the MaxText tests train and bench: one decoder layer of width 64,
128-token sequences, 4 sequences per device, so a CPU step takes a fraction of a second; and
`bench --maxtext` run as a user runs it (`bench`), its report checked for a verdict (`ok`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers import REPO

SMOKE = str(REPO / "configs" / "maxtext" / "smoke.yml")
TINY_MODEL = [
  "base_num_decoder_layers=1",
  "base_emb_dim=64",
  "base_num_query_heads=4",
  "base_num_kv_heads=4",
  "head_dim=16",
  "base_mlp_dim=128",
  "max_target_length=128",
  "per_device_batch_size=4",
]


def bench(tmp_path, config, *args, env=None) -> tuple[subprocess.CompletedProcess, dict | None]:
  """`maxtext-netdata bench --maxtext` in its own process (hooks patch MaxText globally):
  the finished process and the JSON report (None when none was written)."""
  report = tmp_path / "bench" / "report.json"
  argv = [sys.executable, "-m", "maxtext_netdata", "bench", "--maxtext", config]
  argv += [f"base_output_directory={tmp_path}", *args, f"--report={report}"]
  env = dict(os.environ, JAX_PLATFORMS="cpu", **(env or {}))
  env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
  result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=500, cwd=REPO)
  if not report.exists():
    return result, None
  return result, json.loads(report.read_text())


def ok(result, report) -> dict:
  """The report of a bench that succeeded and printed its verdict."""
  assert result.returncode == 0, result.stderr[-3000:]
  assert report["verdict"]["text"] in result.stdout
  return report
