"""The `maxtext-netdata` dispatcher: overrides around options, one-line errors, `--help`
that answers before the commands' heavy imports."""

import importlib.metadata
import json
import subprocess
import sys

import pytest

from maxtext_netdata import cli


def test_overrides_after_options_reach_the_config(capsys):
  # Unknown keys fail in the config loader, so the message proves where the override went.
  assert cli.main(["batches", "configs/smoke.yml", "--steps", "1", "stepz=3"]) == 2
  assert "unknown config key 'stepz'; did you mean 'steps'?" in capsys.readouterr().err


def test_stray_arguments_are_rejected(capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["batches", "configs/smoke.yml", "--steps", "1", "--bogus"])
  assert exit_info.value.code == 2
  assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_commands_without_overrides_reject_key_value(capsys, tmp_path):
  with pytest.raises(SystemExit):
    cli.main(["generate", "--out", str(tmp_path), "rows=5"])
  assert "unrecognized arguments: rows=5" in capsys.readouterr().err


def test_version_names_the_installed_package_and_its_token_format(capsys):
  with pytest.raises(SystemExit) as ended:
    cli.main(["--version"])
  assert ended.value.code == 0
  installed = importlib.metadata.version("maxtext_netdata")
  assert capsys.readouterr().out == f"maxtext-netdata {installed} (tokens netdata-v1)\n"


def test_trainer_module_entry_point_prints_the_train_help(capsys):
  from maxtext_netdata.trainer import train  # noqa: PLC0415

  with pytest.raises(SystemExit) as ended:
    train.main(["python -m maxtext_netdata.trainer.train", "--help"])
  assert ended.value.code == 0
  assert capsys.readouterr().out.startswith("usage: maxtext-netdata train")


# What no command's `--help` may import (seconds each: jax and flax ~2 s, numba ~0.4 s), and
# the two commands whose own module is light enough to give its arguments: `generate` writes
# with pyarrow (0.2 s), `batches` names the batch keys of the numba kernel's module.
HEAVY = ("jax", "flax", "optax", "orbax", "grain", "maxtext", "numba", "pyarrow", "duckdb")
ALLOWED = {"generate": {"pyarrow"}, "batches": {"numba"}}


def test_every_commands_help_comes_before_its_heavy_imports():
  # One fresh process: after each command's --help, the heavy modules imported so far; the
  # commands allowed some come last, so that what the others import is seen.
  order = sorted(cli.COMMANDS, key=lambda name: name in ALLOWED)
  script = f"""
import json, sys
from maxtext_netdata import cli
loaded = {{}}
for name in {order!r}:
  try:
    cli.main([name, "--help"])
  except SystemExit as ended:
    assert ended.code == 0, name
  loaded[name] = sorted(m for m in {HEAVY!r} if m in sys.modules)
print(json.dumps(loaded))
"""
  result = subprocess.run(
    [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
  )
  loaded = json.loads(result.stdout.splitlines()[-1])
  assert list(loaded) == order
  seen = set()
  for name, modules in loaded.items():  # each command answered for what it added
    added = set(modules) - seen
    assert added <= ALLOWED.get(name, set()), f"{name} --help imports {sorted(added)}"
    seen |= added


def test_a_misspelt_config_key_answers_before_the_heavy_imports():
  # `train` imported jax, flax and grain before it read its config: 2.7 s to say "did you mean".
  readers = [name for name, command in cli.COMMANDS.items() if command.reads_config]
  assert {"train", "bench", "batches"} <= set(readers)
  script = f"""
import json, sys
from maxtext_netdata import cli
loaded = {{}}
for name in {readers!r}:
  options = {{"batches": ["--steps", "1"], "predict": ["--src", "192.0.2.1", "--dst", "192.0.2.2"]}}
  options = options.get(name, [])
  assert cli.main([name, "configs/smoke.yml", *options, "stepz=3"]) == 2, name
  loaded[name] = sorted(m for m in {HEAVY!r} if m in sys.modules)
print(json.dumps(loaded))
"""
  result = subprocess.run(
    [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
  )
  errors = result.stderr.splitlines()
  assert errors == [
    f"maxtext-netdata {name}: error: command line: unknown config key 'stepz';"
    " did you mean 'steps'?"
    for name in readers
  ]
  for name, modules in json.loads(result.stdout.splitlines()[-1]).items():
    assert set(modules) <= set().union(*ALLOWED.values()), f"{name} imports {modules} first"
