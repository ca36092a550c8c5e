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
from collections.abc import Iterator

import yaml

from maxtext_netdata.config import configs_dir, parse_override, unknown_key_message
from maxtext_netdata.errors import UserError
from maxtext_netdata.maxtext import plugin as maxtext_plugin
from maxtext_netdata.maxtext.patch_config import MaxTextPluginError


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


def absolute_output_directory(path: str, overrides: list[str]) -> list[str]:
  """`overrides` with a local, relative `base_output_directory` (given there, else in the YAML
  at `path` itself) made absolute against the working directory: Orbax refuses a relative
  checkpoint path, and MaxText would fail at its first checkpoint with a traceback."""
  key = "base_output_directory="
  given = [o for o in overrides if o.startswith(key)]
  if given:
    value = given[-1].removeprefix(key)
  else:
    with open(path, encoding="utf-8") as f:
      value = (yaml.safe_load(f) or {}).get("base_output_directory")
  if not isinstance(value, str) or not value or "://" in value or os.path.isabs(value):
    return overrides
  return [*overrides, key + os.path.abspath(value)]


def install_checking(overrides: list[str]) -> None:
  """Installs the plugin, then checks the keys of `overrides` against MaxText's config (ours
  included): a bad override is one line before MaxText's trainer is imported."""
  keys = [parse_override(override)[0] for override in overrides]
  check_keys(keys, maxtext_plugin.install().model_fields)


def check_keys(keys: list[str], fields: dict) -> None:
  """Raises for the first override key MaxText's config would refuse.

  Checked before the trainer module is imported (about 6 s of MaxText's 13-14 s on two quiet
  cores; `install()` has imported the rest), after which MaxText's own check ends the same
  way, having logged every one of its ~1000 keys (23 KB). As lenient as that check: a key of
  a nested model (`lora`, `dpo`) is known too, and a dotted key (`a.b=1`) is its first part.
  """
  known = set(_field_names(fields))
  for key in keys:
    if key.split(".", 1)[0] not in known:
      raise MaxTextPluginError(unknown_key_message(key, fields, "MaxText config"))


def _field_names(fields: dict) -> Iterator[str]:
  """The names of pydantic `fields` and of the fields of the models nested in them."""
  for name, field in fields.items():
    yield name
    nested = getattr(field.annotation, "model_fields", None)
    if nested:
      yield from _field_names(nested)


def run(args: argparse.Namespace) -> int:
  """Runs MaxText's trainer; returns its exit status (2 for a config MaxText rejects)."""
  path = resolve_config(args.config)
  if not path.endswith(".yml"):
    raise UserError(f"{path}: MaxText reads its config only from a .yml file")
  install_checking(args.overrides)
  overrides = absolute_output_directory(path, args.overrides)
  from absl import app  # noqa: PLC0415
  from maxtext.trainers.pre_train import train  # noqa: PLC0415

  try:
    app.run(train.main, argv=["maxtext-train", path, *overrides])
  except SystemExit as e:  # absl's app.run always exits; report its status instead
    if e.code is None or isinstance(e.code, int):
      return e.code or 0
    raise
  finally:  # however training ended: its loading processes end now, not at interpreter exit
    maxtext_plugin.close_iterators()
  return 0


if __name__ == "__main__":
  from maxtext_netdata import cli  # noqa: PLC0415

  sys.exit(cli.main(["maxtext-train", *sys.argv[1:]]))
