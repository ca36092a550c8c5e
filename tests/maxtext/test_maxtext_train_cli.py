"""`maxtext-netdata maxtext-train`'s own handling of its arguments (MaxText itself runs in
test_maxtext_plugin.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from maxtext_netdata.maxtext import train
from tests.helpers import REPO


@pytest.mark.parametrize(
  ("in_yaml", "overrides", "added"),
  [
    ("runs", [], "runs"),  # the smoke config's relative folder
    ("runs", ["base_output_directory=out/x"], "out/x"),  # the override wins
    ("/abs/runs", [], None),
    ("gs://bucket/runs", [], None),
    ("runs", ["base_output_directory=s3://b/r"], None),
    (None, [], None),  # MaxText's default applies
  ],
)
def test_a_relative_output_directory_is_made_absolute(tmp_path, in_yaml, overrides, added):
  path = tmp_path / "c.yml"
  path.write_text("" if in_yaml is None else f"base_output_directory: {in_yaml!r}\n")
  result = train.absolute_output_directory(str(path), overrides)
  if added is None:
    assert result == overrides
  else:
    assert result == [*overrides, f"base_output_directory={os.path.abspath(added)}"]


def test_an_override_without_a_value_is_one_line_before_maxtext_starts():
  # MaxText's import alone takes ~13 s and its config check logs every key it knows: the one
  # line, alone on stderr, says neither ran.
  result = subprocess.run(
    [sys.executable, "-m", "maxtext_netdata", "maxtext-train", "configs/maxtext/smoke.yml", "x"],
    cwd=REPO,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert result.returncode == 2
  assert result.stderr.splitlines() == [
    "maxtext-netdata maxtext-train: error: override 'x' is not of the form key=value"
  ]
