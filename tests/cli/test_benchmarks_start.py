"""Every script in benchmarks/ starts: its imports resolve and `--help` exits 0. The docs
give their commands; a moved helper module must not leave one that crashes on start."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

SCRIPTS = sorted(p.name for p in (REPO / "benchmarks").glob("*.py") if not p.name.startswith("_"))


@pytest.mark.slow  # a second or two of imports per script
@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_script_starts(script):
  result = subprocess.run(
    [sys.executable, f"benchmarks/{script}", "--help"],
    cwd=REPO,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert result.returncode == 0, result.stderr[-2000:]
  assert "usage:" in result.stdout
