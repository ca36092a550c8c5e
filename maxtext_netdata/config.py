"""MaxText-style configuration: a YAML file plus `key=value` overrides.

`initialize(["prog", "configs/smoke.yml", "steps=10"])` reads `configs/base.yml` (every key
with its default), the named YAML on top (which may chain further through `base_config`),
then the overrides, and returns a read-only `Config`. Types come from the defaults in
`base.yml`: an unknown key is an error that suggests the closest known key, a value of the
wrong type is an error naming key, value and expected type.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

_PACKAGE_CONFIGS = Path(__file__).resolve().parent / "configs"
_REPO_CONFIGS = Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
  """A configuration that cannot be used, with a message meant for the user."""


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
  """Every key of base.yml with its default value."""
  return _read_yaml(configs_dir() / "base.yml")


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


def _coerce(key: str, value: Any, default: Any, source: str) -> Any:
  """`value` as the type of `default`, or a ConfigError naming key, value and type."""
  expected = _type_name(default)
  if expected == "float" and _type_name(value) == "int":
    return float(value)
  if expected == "float" and isinstance(value, str):
    try:
      return float(value)  # YAML 1.1 reads "1e-3" (no dot) as text
    except ValueError:
      pass
  if expected == "list" and isinstance(value, tuple):
    value = list(value)
  if expected == "str" and value is None:
    return ""
  if _type_name(value) != expected:
    raise ConfigError(
      f"{source}: {key}={value!r} has type {_type_name(value)}, expected {expected}"
      f" (default {default!r})"
    )
  return value


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


def unknown_key_message(key: str, known: Iterable[str], source: str) -> str:
  close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.5)
  hint = f"; did you mean {close[0]!r}?" if close else ""
  return f"{source}: unknown config key {key!r}{hint}"


class Config:
  """Read-only attribute access to validated config values."""

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
    base = defaults()
    values = dict(self._values)
    for key, value in updates.items():
      if key not in base:
        raise ConfigError(unknown_key_message(key, base, "replace"))
      values[key] = _coerce(key, value, base[key], "replace")
    return _validated(Config(values, self.config_path))

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


_CHOICES = {
  "dataset_type": ("network_grain", "synthetic"),
  "network_split": ("probe", "time"),
  "network_field_order": ("random", "fixed", "hashed"),
  "dtype": ("bfloat16", "float32", "float16"),
  "weight_dtype": ("bfloat16", "float32"),
}


def _validated(config: Config) -> Config:
  for key, choices in _CHOICES.items():
    if config[key] not in choices:
      raise ConfigError(f"{key}={config[key]!r} is not one of {', '.join(choices)}")
  weights = config.network_mode_weights
  if (
    len(weights) != 3
    or not all(isinstance(w, (int, float)) and w >= 0 for w in weights)
    or sum(weights) <= 0
  ):
    raise ConfigError(
      f"network_mode_weights={weights!r} must be three non-negative numbers (full, partial,"
      " none) with a positive sum"
    )
  if not 0.0 <= config.network_test_fraction < 1.0:
    raise ConfigError(f"network_test_fraction={config.network_test_fraction} must be in [0, 1)")
  for key in ("max_target_length", "steps", "log_period", "checkpoint_period", "eval_steps"):
    if config[key] <= 0:
      raise ConfigError(f"{key}={config[key]} must be positive")
  if config.grain_worker_count < -1:
    raise ConfigError(f"grain_worker_count={config.grain_worker_count} must be -1, 0 or more")
  if config.num_epoch == 0 or config.num_epoch < -1:
    raise ConfigError(f"num_epoch={config.num_epoch} must be -1 (forever) or >= 1")
  return config


def load(path: str | os.PathLike | None, overrides: Iterable[str] = ()) -> Config:
  """The config of YAML `path` (None: base.yml alone) with `key=value` overrides."""
  base = defaults()
  values = dict(base)
  source = str(path) if path is not None else "base.yml"
  if path is not None:
    config_path = _resolve_config_path(str(path), None)
    for key, value in _load_chain(config_path).items():
      if key not in base:
        raise ConfigError(unknown_key_message(key, base, str(config_path)))
      values[key] = _coerce(key, value, base[key], str(config_path))
    source = str(config_path)
  for text in overrides:
    key, value = parse_override(text)
    if key not in base:
      raise ConfigError(unknown_key_message(key, base, "command line"))
    if isinstance(base[key], str):
      value = text.split("=", 1)[1]  # verbatim: YAML would make run_name=2025-07-01 a date
    values[key] = _coerce(key, value, base[key], "command line")
  return _validated(Config(values, source))


def initialize(argv: list[str]) -> Config:
  """MaxText's entry: `argv = [prog, CONFIG.yml, "key=value", ...]`."""
  if len(argv) < 2:
    raise ConfigError("usage: PROG CONFIG.yml [key=value ...]")
  return load(argv[1], argv[2:])
