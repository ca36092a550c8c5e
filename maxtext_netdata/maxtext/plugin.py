"""Real MaxText with `dataset_type=network_grain`: `install()`.

MaxText (pip `maxtext`, SUPPORTED_MAXTEXT) has no plugin hook: `dataset_type` is a pydantic enum,
unknown config keys are rejected, and the input pipeline dispatches on a fixed table.
`install()` teaches an imported MaxText our dataset type through its public module attributes,
one patch per module:

- `patch_config`: MaxText's config admits `network_grain` and every `network_*` key;
  `network_config` translates it into ours.
- `patch_data`: `create_data_iterator` builds our Grain pipeline for `network_grain`.
- `patch_checkpoints`: MaxText's checkpoints save and restore our data position, across
  process counts.
- `patch_processes`: Grain workers start at the first train batch, eval loads in-process,
  and each `reset()` closes the iterator it replaces.
- `patch_metrics`: each training step's scalars gain `perf/data_wait_seconds` and
  `learning/padding_fraction`.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.metadata
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from maxtext_netdata.maxtext import (
  patch_checkpoints,
  patch_config,
  patch_data,
  patch_metrics,
  patch_processes,
)
from maxtext_netdata.maxtext.patch_config import MaxTextPluginError, network_config

__all__ = [
  "SUPPORTED_MAXTEXT",
  "MaxTextPluginError",
  "close_iterators",
  "install",
  "network_config",
]

SUPPORTED_MAXTEXT = ">=0.2.5,<0.3"

# What install() patches, in the order it checks them: (module, attribute).
_REQUIRED = (
  *patch_config.REQUIRED,
  *patch_data.REQUIRED,
  *patch_checkpoints.REQUIRED,
  *patch_metrics.REQUIRED,
)


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
  config_class = patch_config.install(
    modules["maxtext.configs.types"], modules["maxtext.configs.pyconfig"]
  )
  iterator_class = patch_data.install(
    modules["maxtext.input_pipeline.input_pipeline_interface"],
    modules["maxtext.input_pipeline.multihost_dataloading"],
  )
  patch_checkpoints.install(
    modules["maxtext.common.checkpointing"], modules["maxtext.common.grain_utility"], iterator_class
  )
  patch_metrics.install(modules["maxtext.common.metric_logger"])
  atexit.register(close_iterators)
  _INSTALLED["config_class"] = config_class
  return config_class


def close_iterators() -> None:
  """Ends the loading of every network_grain iterator MaxText was given (Grain workers,
  /dev/shm blocks). MaxText never closes its train iterator; `maxtext-train` calls this on
  its way out and `install` registers it to run at exit, while the interpreter still runs
  the threads that closing needs (`patch_processes`)."""
  patch_processes.close_all()
