"""Real MaxText with `dataset_type=network_grain`.

MaxText (pip `maxtext`, SUPPORTED_MAXTEXT) has no plugin hook: `dataset_type` is a pydantic enum,
unknown config keys are rejected, and the input pipeline dispatches on a fixed table.
`install()` teaches an imported MaxText our dataset type, through its public module attributes:

- config: `pyconfig.initialize` / `initialize_pydantic` default to `NetworkMaxTextConfig`, a
  subclass of MaxText's `MaxTextConfig` with every `network_*` field of our `config.ConfigModel`
  (type, default, description and value checks from there), whose `dataset_type` also admits
  every name of our `input_pipeline.registry`. Every other key, and every unknown one, goes
  through MaxText's own validation.
- data: `input_pipeline_interface.create_data_iterator` builds our Grain pipeline for
  `network_grain` (`network_config` maps MaxText's keys to ours) and hands every other dataset
  type to MaxText. Each loading process gets its rows of each global batch in a
  `MultiHostDataLoadIterator`, as MaxText's own Grain pipeline does.
- checkpoints: MaxText saves and restores the data iterator only for `dataset_type == "grain"`;
  `checkpointing.save_checkpoint` and `load_state_if_possible` see `network_grain` as `grain`,
  so the data position (`network_grain.POSITION_FORMAT`: next global step and what identifies
  the data) goes into each checkpoint's `iter` item and a restart continues with exactly the
  next batch, whatever `grain_worker_count` / `grain_num_threads` either run used.
  `grain_utility.for_restore` restores our iterator from the checkpoint's per-process files
  whatever process count wrote them (MaxText's own restore needs one file per process or
  `expansion_factor_real_data`): the position is global, so every file holds the same one.
- processes: the train iterator's Grain workers start at its first batch; the eval iterator
  loads in-process, and each MaxText `reset()` closes the iterator it replaces.
- metrics: each training step's scalars (TensorBoard, `metrics_file`) gain
  `perf/data_wait_seconds` (time the step waited for its batch) and
  `learning/padding_fraction` (share of this host's target slots that are padding).
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import json
import math
import re
import time
from typing import Annotated, Any

import numpy as np
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from pydantic import BeforeValidator, Field, create_model

from maxtext_netdata import config as netdata_config
from maxtext_netdata.errors import UserError
from maxtext_netdata.maxtext import checkpoints

NETWORK_GRAIN = checkpoints.NETWORK_GRAIN
SUPPORTED_MAXTEXT = ">=0.2.5,<0.3"

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

# What install() patches: (module, attribute).
_REQUIRED = (
  ("maxtext.configs.types", "MaxTextConfig"),
  ("maxtext.configs.types", "DatasetType"),
  ("maxtext.configs.pyconfig", "initialize"),
  ("maxtext.configs.pyconfig", "initialize_pydantic"),
  ("maxtext.input_pipeline.input_pipeline_interface", "create_data_iterator"),
  ("maxtext.input_pipeline.input_pipeline_interface", "get_process_loading_real_data"),
  ("maxtext.input_pipeline.input_pipeline_interface", "create_process_specific_iterator"),
  ("maxtext.input_pipeline.multihost_dataloading", "MultiHostDataLoadIterator"),
  ("maxtext.common.checkpointing", "save_checkpoint"),
  ("maxtext.common.checkpointing", "load_state_if_possible"),
  ("maxtext.common.grain_utility", "for_restore"),
  ("maxtext.common.grain_utility", "GrainCheckpointable"),
  ("maxtext.common.metric_logger", "MetricLogger"),
)


class MaxTextPluginError(UserError):
  """The installed MaxText cannot take the plugin, or a MaxText config it cannot use."""


def _maxtext_version() -> str:
  try:
    return importlib.metadata.version("maxtext")
  except importlib.metadata.PackageNotFoundError:
    raise MaxTextPluginError(
      f"MaxText is not installed; install maxtext{SUPPORTED_MAXTEXT} with"
      " `pip install 'maxtext_netdata[maxtext]'` (see docs/maxtext.md)"
    ) from None


def _modules() -> dict[str, Any]:
  """The MaxText modules install() patches, checked for every attribute it relies on."""
  version = _maxtext_version()
  if Version(version) not in SpecifierSet(SUPPORTED_MAXTEXT):
    raise MaxTextPluginError(
      f"maxtext {version} is installed; the network_grain plugin supports maxtext"
      f"{SUPPORTED_MAXTEXT}"
    )
  modules = {}
  for module_name, attribute in _REQUIRED:
    try:
      module = modules.get(module_name) or importlib.import_module(module_name)
    except ImportError as e:
      raise MaxTextPluginError(
        f"maxtext {version}: cannot import {module_name} ({e}); install the runtime"
        " dependencies with `pip install 'maxtext_netdata[maxtext]'`"
      ) from e
    if not hasattr(module, attribute):
      raise MaxTextPluginError(
        f"maxtext {version}: {module_name}.{attribute} is missing; the network_grain plugin"
        f" supports maxtext{SUPPORTED_MAXTEXT}"
      )
    modules[module_name] = module
  return modules


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


class _Feed:
  """The latest batch a network_grain train iterator handed to MaxText, for its metrics."""

  data_wait_s: float | None = None
  padding_fraction: float | None = None


_TRAIN_FEED = _Feed()


def _make_iterator_class(multihost_dataloading):
  class NetworkDataLoadIterator(multihost_dataloading.MultiHostDataLoadIterator):
    """MaxText's multi-host iterator over our host batches, timing each and measuring padding.

    `local_iterator` is our `_PositionIterator`, whose data position MaxText's checkpointing
    saves and restores (`get_state`/`set_state`).
    """

    def __init__(self, dataloader, global_mesh, feed: _Feed | None):
      super().__init__(dataloader, global_mesh)
      self._feed = feed

    def __next__(self):
      start = time.perf_counter()
      batch = super().__next__()
      if self._feed is not None:
        self._feed.data_wait_s = time.perf_counter() - start
        targets = self.last_local_data["targets_segmentation"]
        self._feed.padding_fraction = float(np.count_nonzero(targets == 0) / targets.size)
      return batch

  return NetworkDataLoadIterator


class _PositionIterator:
  """A `network_grain.HostBatchIterator` whose state is the data position as JSON bytes.

  MaxText's Grain checkpointing (`grain_utility.GrainCheckpointable`) writes
  `get_state().decode()` and restores with `set_state(text.encode())` for any iterator that is
  not a Grain `DatasetIterator`, into the same `process_<i>-of-<n>.json` files.
  """

  def __init__(self, iterator):
    self._iterator = iterator

  def __iter__(self):
    return self

  def __next__(self):
    return next(self._iterator)

  def get_state(self) -> bytes:
    return json.dumps(self._iterator.get_state(), indent=2).encode()

  def set_state(self, state: bytes) -> None:
    self._iterator.set_state(json.loads(state))

  def close(self) -> None:
    self._iterator.close()


class _HostBatches:
  """Iterable of our host batches: each `iter()` starts at step 0 and closes the previous one.

  MaxText's `reset()` re-iterates its dataloader before every eval and drops the old iterator
  without closing it; closing it here ends its read threads (and, for train, its workers).
  Eval (`in_process`) never starts worker processes: a few batches per eval would not repay
  their start.
  """

  def __init__(self, config, builder, lo: int, hi: int, num_steps: int | None, split: str):
    self._args = (config, builder, lo, hi, num_steps)
    self._split = split
    self._current: _PositionIterator | None = None

  def __iter__(self):
    from maxtext_netdata.input_pipeline import network_grain  # noqa: PLC0415

    self.close()
    local = network_grain.HostBatchIterator(
      *self._args, split=self._split, in_process=self._split != "train"
    )
    self._current = _PositionIterator(local)
    return self._current

  def close(self) -> None:
    if self._current is not None:
      self._current.close()
      self._current = None


def _make_create_data_iterator(interface, original, iterator_class):
  """`create_data_iterator(config, mesh)` that serves network_grain and defers the rest."""

  def create_data_iterator(config, mesh):
    if config.dataset_type != NETWORK_GRAIN:
      return original(config, mesh)
    if config.expansion_factor_real_data not in (-1, 1) or config.colocated_python_data_input:
      raise MaxTextPluginError(
        "dataset_type=network_grain loads real data on every host: set"
        " expansion_factor_real_data=-1 and colocated_python_data_input=false"
      )
    import jax  # noqa: PLC0415

    from maxtext_netdata.distributed import multihost  # noqa: PLC0415
    from maxtext_netdata.input_pipeline import shared_store  # noqa: PLC0415
    from maxtext_netdata.input_pipeline.sequences import BatchBuilder  # noqa: PLC0415

    ours = network_config(config)
    splits = shared_store.prepare_shared_store(ours)  # process 0 first; all hold the same store

    def loader(batch_size, store, is_training):
      processes = interface.get_process_loading_real_data(
        config.data_sharding, batch_size, batch_size, config.max_target_length, mesh
      )

      def make(_, host_mesh, process_indices):
        lo, hi = multihost.process_row_range(
          batch_size, process_indices.index(jax.process_index()), len(process_indices)
        )
        if is_training:
          builder = BatchBuilder.from_config(ours, store, batch_size)
          batches = _HostBatches(ours, builder, lo, hi, builder.num_steps, "train")
          return iterator_class(batches, host_mesh, _TRAIN_FEED)
        builder = BatchBuilder.from_config(ours, store, batch_size, num_epoch=1)
        steps = builder.steps_per_epoch
        if config.eval_steps > 0:
          steps = min(steps, config.eval_steps)
        batches = _HostBatches(ours, builder, lo, hi, steps, "eval")
        return iterator_class(batches, host_mesh, None)

      return interface.create_process_specific_iterator(
        config, mesh, processes, make, is_training=is_training
      )

    train = loader(config.global_batch_size_to_load, splits.train, True)
    evaluation = None
    if config.eval_interval > 0:
      evaluation = loader(config.global_batch_size_to_load_eval, splits.eval, False)
    return train, evaluation

  return create_data_iterator


def _make_buffer_and_write_metrics(original):
  @functools.wraps(original)
  def buffer_and_write_metrics(self, metrics, step, step_time_delta=None, is_training=True):
    if is_training and metrics and _TRAIN_FEED.data_wait_s is not None:
      metrics["scalar"]["perf/data_wait_seconds"] = _TRAIN_FEED.data_wait_s
      metrics["scalar"]["learning/padding_fraction"] = _TRAIN_FEED.padding_fraction
    return original(self, metrics, step, step_time_delta, is_training)

  return buffer_and_write_metrics


def _default_config_class(original, config_class):
  """`original` with `config_class` as default; MaxText's unknown-key error made one line."""

  @functools.wraps(original)
  def initialize(argv=None, config_class=config_class, **kwargs):
    try:
      return original(argv, config_class=config_class, **kwargs)
    except ValueError as e:
      # MaxText lists all of its ~1000 keys after the unknown one; name the closest instead.
      unknown = re.match(r"'(\w+)' not in ", str(e))
      if unknown is None:
        raise
      raise MaxTextPluginError(
        netdata_config.unknown_key_message(unknown[1], config_class.model_fields, "MaxText config")
      ) from None

  return initialize


_INSTALLED: dict[str, Any] = {}


def install():
  """Registers network_grain with the imported MaxText; returns `NetworkMaxTextConfig`.

  Idempotent. Call it before MaxText reads its config (`maxtext_train` does).

  Raises:
    MaxTextPluginError: MaxText is missing, outside SUPPORTED_MAXTEXT, or lacks an attribute
      the plugin relies on.
  """
  if _INSTALLED:
    return _INSTALLED["config_class"]
  modules = _modules()
  types = modules["maxtext.configs.types"]
  pyconfig = modules["maxtext.configs.pyconfig"]
  interface = modules["maxtext.input_pipeline.input_pipeline_interface"]
  checkpointing = modules["maxtext.common.checkpointing"]
  metric_logger = modules["maxtext.common.metric_logger"]
  multihost_dataloading = modules["maxtext.input_pipeline.multihost_dataloading"]
  grain_utility = modules["maxtext.common.grain_utility"]

  config_class = _make_config_class(types)
  pyconfig.initialize = _default_config_class(pyconfig.initialize, config_class)
  pyconfig.initialize_pydantic = _default_config_class(pyconfig.initialize_pydantic, config_class)
  iterator_class = _make_iterator_class(multihost_dataloading)
  interface.create_data_iterator = _make_create_data_iterator(
    interface, interface.create_data_iterator, iterator_class
  )
  grain_utility.for_restore = checkpoints.make_for_restore(
    grain_utility, grain_utility.for_restore, iterator_class
  )
  checkpointing.save_checkpoint = checkpoints.make_save_checkpoint(checkpointing.save_checkpoint)
  checkpointing.load_state_if_possible = checkpoints.make_load_state(
    checkpointing.load_state_if_possible
  )
  logger = metric_logger.MetricLogger
  logger.buffer_and_write_metrics = _make_buffer_and_write_metrics(logger.buffer_and_write_metrics)
  _INSTALLED["config_class"] = config_class
  return config_class
