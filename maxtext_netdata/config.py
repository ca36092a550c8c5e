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

`ConfigModel` is defined on first use (`config.ConfigModel`, `load`): importing this module, as
every Grain worker does to unpickle a Config, costs no pydantic.

Over 400 lines for a reason: the model holds one field per key (57), most of them two lines.
"""

from __future__ import annotations

import difflib
import functools
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml

_PACKAGE_CONFIGS = Path(__file__).resolve().parent / "configs"
_REPO_CONFIGS = Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
  """A configuration that cannot be used, with a message meant for the user."""


# Value checks. Each raises ValueError("<reason>"); errors read "<source>: key=value <reason>".


def _positive(value: int) -> int:
  if value <= 0:
    raise ValueError("must be positive")
  return value


def _worker_count(value: int) -> int:
  if value < -1:
    raise ValueError("must be -1, 0 or more")
  return value


def _epochs(value: int) -> int:
  if value == 0 or value < -1:
    raise ValueError("must be -1 (forever) or >= 1")
  return value


def _fraction(value: float) -> float:
  if not 0.0 <= value < 1.0:
    raise ValueError("must be in [0, 1)")
  return value


def _mode_weights(value: list[float]) -> list[float]:
  if len(value) != 3 or min(value) < 0 or sum(value) <= 0:
    raise ValueError("must be three non-negative numbers (full, partial, none) with a positive sum")
  return value


def _registered_dataset_type(value: str) -> str:
  # The registry is a leaf module without JAX: reading it here keeps one list of dataset types.
  from maxtext_netdata.input_pipeline import registry  # noqa: PLC0415

  if value not in registry.dataset_types():
    raise ValueError(f"is not one of {', '.join(registry.dataset_types())}")
  return value


def _float_text(value: Any) -> Any:
  """YAML 1.1 reads "1e-3" (no dot) as text; MaxText users write it."""
  if isinstance(value, str):
    try:
      return float(value)
    except ValueError:
      pass
  return value


def _as_list(value: Any) -> Any:
  return list(value) if isinstance(value, tuple) else value


def _empty_if_none(value: Any) -> Any:
  return "" if value is None else value


@functools.cache
def _model():
  """ConfigModel, defined on first use: pydantic costs ~0.1 s to import, and Grain worker
  processes, which import this module to unpickle a Config, never validate one."""
  from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field  # noqa: PLC0415

  Text = Annotated[str, BeforeValidator(_empty_if_none)]
  Real = Annotated[float, BeforeValidator(_float_text)]
  Positive = Annotated[int, AfterValidator(_positive)]
  WorkerCount = Annotated[int, AfterValidator(_worker_count)]
  Epochs = Annotated[int, AfterValidator(_epochs)]
  Fraction = Annotated[float, BeforeValidator(_float_text), AfterValidator(_fraction)]
  Names = Annotated[list[str], BeforeValidator(_as_list)]
  ModeWeights = Annotated[list[float], BeforeValidator(_as_list), AfterValidator(_mode_weights)]
  DatasetType = Annotated[str, AfterValidator(_registered_dataset_type)]

  class ConfigModel(BaseModel):
    """Every key maxtext_netdata knows: type, default and the description base.yml shows.

    Strict like our YAML: an int is no bool, a float no int; an int is a float, None is "" and
    "1e-3" is 1e-3 (see the Annotated types above).
    """

    model_config = ConfigDict(strict=True, extra="forbid")

    run_name: Text = Field(
      "netdata_run", description="sub-directory of base_output_directory for this run's outputs"
    )
    base_output_directory: Text = Field(
      "runs", description="where runs write metrics, TensorBoard logs and checkpoints"
    )
    steps: Positive = Field(100, description="training steps")
    log_period: Positive = Field(
      10, description="a stdout metrics line every this many steps (metrics.jsonl gets every step)"
    )
    enable_tensorboard: bool = Field(
      True, description="write TensorBoard event files beside metrics.jsonl"
    )
    enable_checkpointing: bool = Field(
      True, description="save model, optimizer and data-iterator state with Orbax"
    )
    checkpoint_period: Positive = Field(
      50, description="save a checkpoint every this many steps (and at the end)"
    )
    eval_interval: int = Field(-1, description="run eval every this many steps; -1 never")
    eval_steps: Positive = Field(4, description="batches per eval")
    peak_tflops_per_device: Real = Field(
      989.0, description="bf16 dense peak used for MFU (H100 SXM); set for your chip"
    )
    jax_distributed_initialization_timeout: int = Field(
      300, description="seconds for all hosts of a multi-host run to connect"
    )

    dataset_type: DatasetType = Field(
      "network_grain",
      description="input pipeline: network_grain, synthetic, or one added by register_dataset_type",
    )
    grain_train_files: Text = Field(
      "", description="raw parquet: paths, globs or gs:// / s3:// URIs, comma-separated"
    )
    grain_eval_files: Text = Field(
      "", description="raw parquet for eval; empty: the test split of grain_train_files"
    )
    grain_worker_count: WorkerCount = Field(
      -1, description="Grain worker processes; 0 in-process; -1 picks from cores and memory"
    )
    grain_per_worker_buffer_size: int = Field(2, description="batches each worker keeps ready")
    grain_num_threads: int = Field(
      2, description="read threads of to_iter_dataset (in-process prefetch)"
    )
    grain_prefetch_buffer_size: int = Field(4, description="batches prefetched by those threads")
    grain_ram_budget_mb: int = Field(2048, description="memory the -1 worker count may use")
    data_shuffle_seed: int = Field(
      0, description="seed of every random choice of the data pipeline"
    )
    enable_data_shuffling: bool = Field(
      True, description="false: slots in store order (still deterministic)"
    )
    num_epoch: Epochs = Field(
      1, description="passes over the data; the iterator ends after them; -1 repeats forever"
    )
    packing: bool = Field(
      True, description="fill sequences with several contexts (segment ids 1..k); false pads"
    )
    max_target_length: Positive = Field(1024, description="tokens per sequence")
    per_device_batch_size: Real = Field(8.0, description="sequences per device per step")
    global_batch_size_to_load: int = Field(
      -1, description="sequences per step over all hosts; -1: per_device_batch_size x devices"
    )
    data_sharding: Names = Field(
      ["data"], description="mesh axes the batch dimension is sharded over"
    )

    network_prepared_dir: Text = Field(
      "",
      description="prepared store location (a folder, or gs:// / s3:// shared by every host);"
      " empty: <base_output_directory>/prepared",
    )
    network_store_cache_dir: Text = Field(
      "",
      description="local folder for the copy of a gs:// / s3:// store;"
      " empty: ~/.cache/maxtext_netdata/stores",
    )
    network_split: Literal["probe", "time"] = Field(
      "probe", description="probe: test set = probes by stable address hash; time: the latest rows"
    )
    network_test_fraction: Fraction = Field(
      0.1, description="share of probes (or of time) held out as the test split"
    )
    network_mode_weights: ModeWeights = Field(
      [0.4, 0.3, 0.3], description="weights of the full / partial / none context modes"
    )
    network_field_order: Literal["random", "fixed", "hashed"] = Field(
      "random", description="random | fixed | hashed order of a measurement's field blocks"
    )
    network_skip_bad_rows: bool = Field(
      False, description="true: drop unparsable rows and count them in the prepare summary"
    )
    network_prepare_memory_mb: int = Field(
      1024, ge=256, description="memory prepare may use, whatever the row count (sets its buckets)"
    )
    network_remote_retries: int = Field(
      5,
      description="S3: the SDK's attempts per request (AWS standard retry strategy, its own"
      " backoff); GCS: sizes the retry window with network_remote_backoff_s",
    )
    network_remote_backoff_s: Real = Field(
      0.5,
      description="GCS only: the client retries transient errors for"
      " backoff_s x (2^network_remote_retries - 1) seconds",
    )
    network_s3_endpoint: Text = Field(
      "", description="S3-compatible endpoint URL; empty: AWS_ENDPOINT_URL or AWS default"
    )
    network_s3_region: Text = Field(
      "", description="S3 region; empty: AWS_REGION / AWS_DEFAULT_REGION"
    )

    vocab_size: int = Field(268, description="netdata-v1 vocabulary (a model may round it up)")
    base_emb_dim: int = Field(640, description="model width")
    base_num_query_heads: int = Field(10, description="attention heads")
    base_num_kv_heads: int = Field(
      10, description="key/value heads (grouped-query attention when fewer)"
    )
    head_dim: int = Field(64, description="width of one head")
    base_mlp_dim: int = Field(2048, description="MLP hidden width")
    base_num_decoder_layers: int = Field(20, description="decoder blocks")
    dtype: Literal["bfloat16", "float32", "float16"] = Field(
      "bfloat16", description="activation dtype"
    )
    weight_dtype: Literal["bfloat16", "float32"] = Field("float32", description="parameter dtype")
    logits_dot_in_fp32: bool = Field(True, description="compute the output projection in float32")

    learning_rate: Real = Field(0.0003, description="peak learning rate")
    warmup_steps_fraction: Real = Field(
      0.1, description="share of steps spent warming up linearly from 0"
    )
    cosine_learning_rate_final_fraction: Real = Field(
      0.1, description="final learning rate as a fraction of the peak"
    )
    learning_rate_schedule_steps: int = Field(
      -1, description="steps the warmup + cosine schedule spans; -1: steps"
    )
    adam_b1: Real = Field(0.9, description="AdamW beta1")
    adam_b2: Real = Field(0.95, description="AdamW beta2")
    adam_eps: Real = Field(1e-08, description="AdamW epsilon")
    adam_weight_decay: Real = Field(0.1, description="AdamW decoupled weight decay")
    gradient_clipping_threshold: Real = Field(
      1.0, description="global-norm gradient clipping; 0 disables"
    )

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
# model (maxtext_netdata/config.py), not this file.
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


if __name__ == "__main__":
  print(base_yml(), end="")
