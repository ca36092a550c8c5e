"""`maxtext-netdata maxtext-train MAXTEXT_YAML [key=value ...]`: MaxText's own trainer, plugin on.

Runs `maxtext.trainers.pre_train.train` exactly as `python -m maxtext.trainers.pre_train.train`
would, after `maxtext_plugin.install()`, so `dataset_type=network_grain` and the `network_*` keys
are MaxText config like any other. The YAML is a MaxText config (e.g. configs/maxtext/smoke.yml,
whose `base_config: base.yml` is MaxText's own base.yml). Also `python -m
maxtext_netdata.maxtext.train MAXTEXT_YAML key=value ...`.
"""

from __future__ import annotations

import argparse
import os
import sys

from maxtext_netdata.config import configs_dir
from maxtext_netdata.errors import UserError
from maxtext_netdata.maxtext import plugin as maxtext_plugin


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("config", help="MaxText YAML, e.g. configs/maxtext/smoke.yml")
  parser.add_argument("overrides", nargs="*", metavar="key=value", help="MaxText config overrides")


def resolve_config(name: str) -> str:
  """`name` as given, else inside our configs folder (also when installed, without `configs/`)."""
  if os.path.isfile(name):
    return name
  relative = name.removeprefix("configs/")
  candidate = configs_dir() / relative
  if candidate.is_file():
    return str(candidate)
  raise UserError(f"MaxText config not found: {name}")


def run(args: argparse.Namespace) -> int:
  """Runs MaxText's trainer; returns its exit status (2 for a config MaxText rejects)."""
  path = resolve_config(args.config)
  if not path.endswith(".yml"):
    raise UserError(f"{path}: MaxText reads its config only from a .yml file")
  maxtext_plugin.install()
  from absl import app  # noqa: PLC0415
  from maxtext.trainers.pre_train import train  # noqa: PLC0415

  try:
    app.run(train.main, argv=["maxtext-train", path, *args.overrides])
  except SystemExit as e:  # absl's app.run always exits; report its status instead
    if e.code is None or isinstance(e.code, int):
      return e.code or 0
    raise
  return 0


if __name__ == "__main__":
  from maxtext_netdata import cli  # noqa: PLC0415

  sys.exit(cli.main(["maxtext-train", *sys.argv[1:]]))
