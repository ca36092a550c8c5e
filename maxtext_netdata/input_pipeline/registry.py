"""The `dataset_type` registry: the one list of input pipelines, by name.

Adding a dataset type is one call, `register_dataset_type(name, factory)`, where
`factory(config, mesh)` returns (train iterator, eval iterator or None) like
`create_data_iterator`. Our config's `dataset_type` check, `create_data_iterator` and the MaxText
plugin's config model all read the names from here.

A leaf module: it imports nothing of ours and no JAX, so `config` may read it while it checks a
config (the one import against the flow, kept to this module) and Grain workers stay light. The
built-in types are named by `"module:function"` so that their JAX-heavy modules load on use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

Factory = Callable[..., tuple]

_FACTORIES: dict[str, Factory | str] = {
  "network_grain": "maxtext_netdata.input_pipeline.interface:_network_grain",
  "synthetic": "maxtext_netdata.input_pipeline.interface:_synthetic",
}


def register_dataset_type(name: str, factory: Factory | str) -> None:
  """Makes `dataset_type=name` valid everywhere; `factory` is a callable or "module:function".

  Registering a name again replaces its factory (a test or a plugin may override a built-in).

  Raises:
    ValueError: `name` is not an identifier (config keys and MaxText enums need one).
  """
  if not name.isidentifier():
    raise ValueError(f"dataset_type name {name!r} must be an identifier")
  _FACTORIES[name] = factory


def unregister_dataset_type(name: str) -> None:
  """Removes `name` (for tests that register a type for their duration)."""
  _FACTORIES.pop(name, None)


def dataset_types() -> tuple[str, ...]:
  """Every registered name, sorted."""
  return tuple(sorted(_FACTORIES))


def factory(name: str) -> Factory:
  """The factory of `name`, imported on first use.

  Raises:
    KeyError: `name` is not registered.
  """
  found = _FACTORIES[name]
  if isinstance(found, str):
    module, _, attribute = found.partition(":")
    found = getattr(importlib.import_module(module), attribute)
    _FACTORIES[name] = found
  return found
