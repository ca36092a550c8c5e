"""The `maxtext-netdata` dispatcher: overrides around options, one-line errors."""

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


def test_trainer_module_entry_point_prints_the_train_help(capsys):
  from maxtext_netdata.trainer import train  # noqa: PLC0415

  with pytest.raises(SystemExit) as ended:
    train.main(["python -m maxtext_netdata.trainer.train", "--help"])
  assert ended.value.code == 0
  assert capsys.readouterr().out.startswith("usage: maxtext-netdata train")
