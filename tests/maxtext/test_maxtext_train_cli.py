"""`maxtext-netdata maxtext-train`'s own handling of its arguments (MaxText itself runs in
test_maxtext_plugin.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from maxtext_netdata.maxtext import plugin as maxtext_plugin
from maxtext_netdata.maxtext import train
from maxtext_netdata.maxtext.patch_config import MaxTextPluginError
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


@pytest.mark.parametrize(
  ("override", "message"),
  [
    ("x", "override 'x' is not of the form key=value"),
    ("stepz=3", "MaxText config: unknown config key 'stepz'; did you mean 'steps'?"),
  ],
)
def test_a_bad_override_is_one_line_before_maxtexts_trainer_starts(override, message):
  # MaxText's config check logs every key it knows before it fails: it did not run when stderr
  # ends in the one line and holds no such log.
  result = _maxtext_train(override)
  assert result.returncode == 2
  assert result.stderr.splitlines()[-1] == f"maxtext-netdata maxtext-train: error: {message}"
  assert "MAXTEXT CONFIG ERROR" not in result.stderr


def test_a_value_maxtext_refuses_ends_in_one_line_not_a_traceback():
  # The type is MaxText's to check (its config, its parsing of the value): its log of the
  # error stays, pydantic's traceback goes.
  result = _maxtext_train("steps=abc")
  assert result.returncode == 2
  assert result.stderr.splitlines()[-1] == (
    "maxtext-netdata maxtext-train: error: MaxText config: steps='abc' should be a valid"
    " integer, unable to parse string as an integer"
  )
  assert "Traceback" not in result.stderr


def test_override_keys_are_checked_as_leniently_as_maxtext_does():
  fields = maxtext_plugin.install().model_fields
  # Top-level keys, ours among them, keys of nested models (LoRA's), dotted keys: all pass.
  train.check_keys(["steps", "network_split", "lora_rank", "lora.lora_rank"], fields)
  with pytest.raises(MaxTextPluginError, match="unknown config key 'lora_rnak'"):
    train.check_keys(["steps", "lora_rnak"], fields)


def _maxtext_train(override: str) -> subprocess.CompletedProcess:
  return subprocess.run(
    [
      sys.executable,
      "-m",
      "maxtext_netdata",
      "maxtext-train",
      "configs/maxtext/smoke.yml",
      "steps=5",
      override,
    ],
    cwd=REPO,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
    capture_output=True,
    text=True,
    timeout=120,
  )
