"""MaxText-style configuration: one typed model, a YAML file and `key=value` overrides.

`ConfigModel` (pydantic, like MaxText's `MaxTextConfig`) is the one list of keys: each field's
type, default and description. From it derive `load`'s validation and its one-line errors (an
unknown key names the closest known one; a value of the wrong type names key, value and
expected type), the documented defaults of `configs/base.yml` (`python -m
maxtext_netdata.config` writes it; a test checks the file matches) and the MaxText plugin's
config subclass. Adding a key is one field here (then regenerate base.yml).

`initialize(["prog", "configs/smoke.yml", "steps=10"])` starts from the model's defaults, applies
the named YAML (which may chain further through `base_config`), then the overrides, and returns
a read-only `Config`: plain values, cheap to pickle to Grain workers.

`ConfigModel` lives in `config.model` and is imported on first use (`config.ConfigModel`,
`load`): importing this package, as every Grain worker does to unpickle a Config, costs no
pydantic. `ConfigError` is `errors.ConfigError`, importable from here too.
"""

from __future__ import annotations

import datetime
import difflib
import functools
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, get_args

import yaml

from maxtext_netdata.errors import ConfigError

__all__ = ["Config", "ConfigError", "ConfigModel", "initialize", "load"]

_PACKAGE_CONFIGS = Path(__file__).resolve().parents[1] / "configs"
_REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@functools.cache
def _model():
  """ConfigModel (`config.model`), imported on first use: pydantic costs ~0.1 s to import, and
  Grain worker processes, which import this module to unpickle a Config, never validate one."""
  from maxtext_netdata.config.model import ConfigModel  # noqa: PLC0415

  return ConfigModel


def __getattr__(name: str):
  if name == "ConfigModel":
    return _model()
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# base.yml's section headings, before the key that opens each.
_SECTIONS = {
  "run_name": "run",
  "dataset_type": "data",
  "network_prepared_dir": "network data",
  "vocab_size": "model",
  "learning_rate": "optimizer",
}
_BASE_YML_HEADER = """\
# Every key maxtext_netdata knows, with its default. Other configs name this file in
# `base_config` and override what they change; `key=value` on the command line wins last.
# Written by `python -m maxtext_netdata.config > configs/base.yml` from ConfigModel: edit the
# model (maxtext_netdata/config/model.py), not this file.
"""


def _yaml_value(value: Any) -> str:
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, str):
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
  if isinstance(value, float):
    text = repr(value)
    # YAML 1.1 reads an exponent without a dot as text.
    return text.replace("e", ".0e") if "e" in text and "." not in text else text
  if isinstance(value, list):
    return "[" + ", ".join(_yaml_value(item) for item in value) + "]"
  return str(value)


def base_yml() -> str:
  """The text of `configs/base.yml`: every key, its default and its description."""
  lines = [_BASE_YML_HEADER.rstrip("\n")]
  for key, field in _model().model_fields.items():
    if key in _SECTIONS:
      heading = f"# --- {_SECTIONS[key]} "
      lines += ["", heading + "-" * (91 - len(heading))]
    lines.append(f"{key}: {_yaml_value(field.default)}  # {field.description}")
  return "\n".join(lines) + "\n"


def configs_dir() -> Path:
  """The folder holding `base.yml` (the repository's `configs/`, or the installed copy)."""
  for candidate in (_REPO_CONFIGS, _PACKAGE_CONFIGS):
    if (candidate / "base.yml").is_file():
      return candidate
  raise ConfigError(f"base.yml not found in {_REPO_CONFIGS} or {_PACKAGE_CONFIGS}")


def _read_yaml(path: Path) -> dict[str, Any]:
  try:
    with open(path, encoding="utf-8") as f:
      data = yaml.safe_load(f)
  except FileNotFoundError:
    raise ConfigError(f"config file not found: {path}") from None
  except yaml.YAMLError as e:
    raise ConfigError(f"{path}: not valid YAML: {e}") from None
  if data is None:
    return {}
  if not isinstance(data, dict):
    raise ConfigError(f"{path}: expected a mapping of keys to values, got {type(data).__name__}")
  return data


def _resolve_config_path(name: str, relative_to: Path | None) -> Path:
  path = Path(name)
  if path.is_absolute() or path.exists():
    return path
  for folder in (relative_to, configs_dir()):
    if folder is not None and (folder / name).exists():
      return folder / name
  return path


def _load_chain(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
  """Values of `path` on top of those of its `base_config` chain (not including base.yml)."""
  resolved = path.resolve()
  if resolved in seen:
    raise ConfigError(f"{path}: base_config forms a cycle")
  data = _read_yaml(path)
  parent_name = data.pop("base_config", None)
  if parent_name is None:
    return data
  parent = _resolve_config_path(str(parent_name), path.parent)
  if parent.resolve() == (configs_dir() / "base.yml").resolve():
    return data
  merged = _load_chain(parent, seen + (resolved,))
  merged.update(data)
  return merged


def defaults() -> dict[str, Any]:
  """Every key with its default value (those of base.yml)."""
  return _model()().model_dump()


def _type_name(value: Any) -> str:
  if isinstance(value, bool):
    return "bool"
  if isinstance(value, int):
    return "int"
  if isinstance(value, float):
    return "float"
  if isinstance(value, str):
    return "str"
  if isinstance(value, list):
    return "list"
  return type(value).__name__


def _expected(key: str) -> str:
  annotation = _model().model_fields[key].annotation
  return getattr(annotation, "__name__", None) if not get_args(annotation) else str(annotation)


def _error_message(error: Mapping[str, Any], values: Mapping[str, Any], origin) -> str:
  """One line for pydantic's `error`: "<source>: key=value <what is wrong>"."""
  key = str(error["loc"][0])
  source = origin(key)
  if error["type"] == "extra_forbidden":
    return unknown_key_message(key, _model().model_fields, source)
  value = values[key]
  if error["type"] == "value_error":
    return f"{source}: {key}={value!r} {error['ctx']['error']}"
  if error["type"] == "literal_error":
    choices = get_args(_model().model_fields[key].annotation)
    return f"{source}: {key}={value!r} is not one of {', '.join(choices)}"
  if error["type"].endswith("_type"):
    default = _model().model_fields[key].default
    return (
      f"{source}: {key}={value!r} has type {_type_name(value)}, expected {_expected(key)}"
      f" (default {default!r})"
    )
  # A Field constraint (ge=, max_length=, ...): pydantic's own words.
  return f"{source}: {key}={value!r} {error['msg'].replace('Input should', 'should')}"


def validate(values: Mapping[str, Any], origin=lambda key: "config") -> dict[str, Any]:
  """`values` (any subset of the keys) over the defaults, checked and converted.

  `origin(key)` names where a key's value came from, for the error.

  Raises:
    ConfigError: the first problem, in one line.
  """
  from pydantic import ValidationError  # noqa: PLC0415

  try:
    return _model().model_validate(dict(values)).model_dump()
  except ValidationError as e:
    errors = e.errors(include_url=False)
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    raise ConfigError(_error_message(errors[0], values, origin) + more) from None


def parse_override(text: str) -> tuple[str, Any]:
  """`key=value` → (key, value), the value read as YAML like MaxText does (1, 1.5, true, [a, b])."""
  if "=" not in text:
    raise ConfigError(f"override {text!r} is not of the form key=value")
  key, raw = text.split("=", 1)
  key = key.strip()
  try:
    value = yaml.safe_load(raw) if raw.strip() else ""
  except yaml.YAMLError:
    value = raw
  if isinstance(value, (dict, type(None))) and raw.strip() not in ("null", "~", ""):
    value = raw
  return key, value


_XLA_OPTION = re.compile(r"--([A-Za-z0-9_]+)=(.+)")


def iso_seconds(text: str) -> int:
  """Unix seconds of an ISO 8601 time: a date (its midnight) or a date and time, UTC unless
  it names a zone; ValueError otherwise. `ingest --since/--until` and `network_since` /
  `network_until` read times with it.

  A time between two whole seconds is the next one: the rows' times are whole seconds, so a
  bound kept as that second keeps exactly the rows at or after `since` and before `until`
  (`data.raw.schema.in_time`); a bound cut down to its second would take in the second
  before `since` and leave out the second before `until`."""
  when = datetime.datetime.fromisoformat(text)
  if when.tzinfo is None:
    when = when.replace(tzinfo=datetime.UTC)
  whole, part = divmod(when - _EPOCH, datetime.timedelta(seconds=1))
  return whole + bool(part)


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def compile_options(flags: str) -> dict[str, str | bool]:
  """`compile_xla_flags` as `jax.jit`'s `compiler_options`: whitespace-separated `--name=value`
  tokens, as MaxText's `max_utils.parse_libtpu_flags_to_dict` reads them, with `true` and
  `false` (any case) as bools, which XLA's option parser wants for a bool option.

  Raises:
    ValueError: a token that is not `--name=value`, or a name given twice.
  """
  options: dict[str, str | bool] = {}
  for token in flags.replace("\\", " ").split():
    match = _XLA_OPTION.fullmatch(token)
    if not match:
      raise ValueError(f"has {token!r}, not --name=value")
    name, value = match.groups()
    if name in options:
      raise ValueError(f"names --{name} twice")
    options[name] = {"true": True, "false": False}.get(value.lower(), value)
  return options


def unknown_key_message(key: str, known: Iterable[str], source: str) -> str:
  close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.5)
  hint = f"; did you mean {close[0]!r}?" if close else ""
  return f"{source}: unknown config key {key!r}{hint}"


class Config:
  """Read-only attribute access to validated config values (`ConfigModel`'s keys)."""

  def __init__(self, values: Mapping[str, Any], path: str | None = None):
    object.__setattr__(self, "_values", dict(values))
    object.__setattr__(self, "config_path", path)

  def __getattr__(self, name: str) -> Any:
    try:
      return self._values[name]
    except KeyError:
      raise AttributeError(unknown_key_message(name, self._values, "config")) from None

  def __setattr__(self, name: str, value: Any) -> None:
    raise AttributeError("Config is read-only; use replace(key=value)")

  def __getitem__(self, name: str) -> Any:
    return self._values[name]

  def __contains__(self, name: str) -> bool:
    return name in self._values

  def __reduce__(self):
    return (Config, (self._values, self.config_path))

  def get_keys(self) -> dict[str, Any]:
    """A copy of all values (MaxText's name for it)."""
    return dict(self._values)

  def replace(self, **updates: Any) -> Config:
    """A new Config with `updates` validated and applied."""
    values = validate({**self._values, **updates}, lambda key: "replace")
    return Config(values, self.config_path)

  @property
  def run_dir(self) -> Path:
    """`<base_output_directory>/<run_name>`."""
    return Path(self.base_output_directory) / self.run_name

  @property
  def prepared_dir(self) -> str:
    """Where the prepared store lives."""
    return self.network_prepared_dir or os.path.join(self.base_output_directory, "prepared")

  def global_batch_size(self, num_devices: int) -> int:
    """Sequences per step over all hosts."""
    if self.global_batch_size_to_load > 0:
      return self.global_batch_size_to_load
    size = self.per_device_batch_size * num_devices
    if size < 1 or size != int(size):
      raise ConfigError(
        f"per_device_batch_size={self.per_device_batch_size} x {num_devices} devices ="
        f" {size} is not a whole number of sequences >= 1"
      )
    return int(size)

  def __repr__(self) -> str:
    return f"Config({self.config_path!r}, {len(self._values)} keys)"


def load(path: str | os.PathLike | None, overrides: Iterable[str] = ()) -> Config:
  """The config of YAML `path` (None: the defaults alone) with `key=value` overrides."""
  fields = _model().model_fields
  values: dict[str, Any] = {}
  origin: dict[str, str] = {}
  source = "base.yml"
  if path is not None:
    config_path = _resolve_config_path(str(path), None)
    source = str(config_path)
    for key, value in _load_chain(config_path).items():
      values[key], origin[key] = value, source
  for text in overrides:
    key, value = parse_override(text)
    if key in fields and isinstance(fields[key].default, str):
      value = text.split("=", 1)[1]  # verbatim: YAML would make run_name=2025-07-01 a date
    values[key], origin[key] = value, "command line"
  return Config(validate(values, origin.__getitem__), source)


def initialize(argv: list[str]) -> Config:
  """MaxText's entry: `argv = [prog, CONFIG.yml, "key=value", ...]`."""
  if len(argv) < 2:
    raise ConfigError("usage: PROG CONFIG.yml [key=value ...]")
  return load(argv[1], argv[2:])
