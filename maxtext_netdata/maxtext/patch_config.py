"""The config patch: MaxText's config admits `network_grain` and every `network_*` key.

`pyconfig.initialize` / `initialize_pydantic` default to `NetworkMaxTextConfig`, a subclass of
MaxText's `MaxTextConfig` with every `network_*` field of our `config.ConfigModel` (type,
default, description and value checks from there), whose `dataset_type` also admits every
name of our `input_pipeline.registry`. Every other key, and every unknown one, goes through
MaxText's own validation. `network_config` translates such a MaxText config into ours.
"""

from __future__ import annotations

import copy
import functools
import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, ValidationError, create_model

from maxtext_netdata import config as netdata_config
from maxtext_netdata.errors import UserError

NETWORK_GRAIN = "network_grain"

# What install() patches: (module, attribute).
REQUIRED = (
  ("maxtext.configs.types", "MaxTextConfig"),
  ("maxtext.configs.types", "DatasetType"),
  ("maxtext.configs.pyconfig", "initialize"),
  ("maxtext.configs.pyconfig", "initialize_pydantic"),
)

# MaxText keys with the same meaning in our Config, copied as they are.
_SHARED_KEYS = (
  "grain_train_files",
  "grain_eval_files",
  "grain_worker_count",
  "grain_per_worker_buffer_size",
  "grain_num_threads",
  "grain_ram_budget_mb",
  "data_shuffle_seed",
  "enable_data_shuffling",
  "num_epoch",
  "packing",
  "max_target_length",
  "base_output_directory",
  "run_name",
)


class MaxTextPluginError(UserError):
  """The installed MaxText cannot take the plugin, or a MaxText config it cannot use."""


def _network_fields() -> dict[str, tuple[Any, Any]]:
  """pydantic fields of every `network_*` key: our ConfigModel's, with their types and checks."""
  return {
    key: (field.annotation, copy.copy(field))
    for key, field in netdata_config.ConfigModel.model_fields.items()
    if key.startswith("network_")
  }


def _dataset_type_field(types) -> tuple[Any, Any]:
  """MaxText's `dataset_type` field, also admitting every type of our registry.

  Read at validation time, so a type registered after install() is admitted too. MaxText's own
  names stay its enum members.
  """
  from maxtext_netdata.input_pipeline import registry  # noqa: PLC0415

  maxtext_names = {member.value: member for member in types.DatasetType}

  def check(value):
    if isinstance(value, str) and not isinstance(value, types.DatasetType):
      if value in maxtext_names:
        return maxtext_names[value]
      if value not in registry.dataset_types():
        names = sorted({*maxtext_names, *registry.dataset_types()})
        raise ValueError(f"dataset_type={value!r} is not one of {', '.join(names)}")
    return value

  description = netdata_config.ConfigModel.model_fields["dataset_type"].description
  return (
    Annotated[types.DatasetType | str, BeforeValidator(check)],
    Field(types.DatasetType.SYNTHETIC, description=f"MaxText's pipelines or ours ({description})"),
  )


def _make_config_class(types):
  """`NetworkMaxTextConfig`: MaxText's config model plus our dataset types and network_* keys."""
  return create_model(
    "NetworkMaxTextConfig",
    __base__=types.MaxTextConfig,
    __module__=__name__,
    dataset_type=_dataset_type_field(types),
    **_network_fields(),
  )


def _default_config_class(original, config_class):
  """`original` with `config_class` as default; MaxText's refusals (an unknown key, a value of
  the wrong type or range) made one line, not pydantic's traceback."""

  @functools.wraps(original)
  def initialize(argv=None, config_class=config_class, **kwargs):
    try:
      return original(argv, config_class=config_class, **kwargs)
    except ValidationError as e:
      raise MaxTextPluginError(validation_message(e)) from None
    except ValueError as e:
      # MaxText lists all of its ~1000 keys after the unknown one; name the closest instead.
      unknown = re.match(r"'(\w+)' not in ", str(e))
      if unknown is None:
        raise
      raise MaxTextPluginError(
        netdata_config.unknown_key_message(unknown[1], config_class.model_fields, "MaxText config")
      ) from None

  return initialize


def validation_message(error: ValidationError) -> str:
  """pydantic's refusal of a MaxText config in one line: the first error's key, its value and
  pydantic's words ("MaxText config: steps='abc' should be a valid integer, ...")."""
  errors = error.errors(include_url=False)
  first = errors[0]
  key = ".".join(str(part) for part in first["loc"])
  value = repr(first.get("input"))
  value = value if len(value) <= 80 else value[:77] + "..."
  if first["type"] == "value_error":  # a validator's own words, without pydantic's prefix
    words = str(first["ctx"]["error"])
  else:
    words = first["msg"].replace("Input should", "should")
  words = " ".join(words.split())
  more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
  # A model-wide check has no key, and its input is the whole config: its words alone; so
  # are words that name the key and value themselves.
  if key and not words.startswith(f"{key}="):
    words = f"{key}={value} {words}"
  return f"MaxText config: {words}{more}"


def network_config(maxtext_config) -> netdata_config.Config:
  """Our `Config` for a MaxText config with `dataset_type=network_grain`.

  The data keys MaxText shares with us keep their meaning; `network_*` keys are copied.
  MaxText counts `grain_prefetch_buffer_size` in examples while our Grain element is a whole
  host batch, so it becomes the same number of examples' worth of batches.

  Raises:
    ConfigError: a value our pipeline cannot use.
  """
  batch = maxtext_config.global_batch_size_to_load
  values = {key: getattr(maxtext_config, key) for key in _SHARED_KEYS}
  values["grain_eval_files"] = values["grain_eval_files"] or ""
  values.update({key: getattr(maxtext_config, key) for key in _network_fields()})
  values["dataset_type"] = NETWORK_GRAIN
  values["global_batch_size_to_load"] = int(batch)
  values["grain_prefetch_buffer_size"] = max(
    1, math.ceil(maxtext_config.grain_prefetch_buffer_size / batch)
  )
  return netdata_config.load(None).replace(**values)


def install(types, pyconfig):
  """Makes `NetworkMaxTextConfig` the default config class of `pyconfig`; returns it."""
  config_class = _make_config_class(types)
  pyconfig.initialize = _default_config_class(pyconfig.initialize, config_class)
  pyconfig.initialize_pydantic = _default_config_class(pyconfig.initialize_pydantic, config_class)
  return config_class
