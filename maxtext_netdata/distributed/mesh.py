"""The device mesh: one `data` axis over every device (pure data parallelism)."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from maxtext_netdata.config import Config
from maxtext_netdata.errors import ConfigError

DATA_AXIS = "data"


def make_mesh(config: Config, devices: list[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh named `data` over `devices` (default: all devices of all processes).

  `config.data_sharding` must name only axes of this mesh, since the input pipeline shards
  the batch dimension over them.
  """
  devices = jax.devices() if devices is None else devices
  unknown = [axis for axis in config.data_sharding if axis != DATA_AXIS]
  if unknown:
    raise ConfigError(
      f"data_sharding={config.data_sharding!r} names axes {unknown} that the mesh"
      f" ({DATA_AXIS!r} only) does not have"
    )
  return Mesh(np.asarray(devices), (DATA_AXIS,))


def batch_sharding(config: Config, mesh: Mesh) -> NamedSharding:
  """Batch dimension split over `config.data_sharding`, sequence dimension whole."""
  return NamedSharding(mesh, PartitionSpec(tuple(config.data_sharding)))


def replicated(mesh: Mesh) -> NamedSharding:
  """Every device holds the whole array (parameters and optimizer state)."""
  return NamedSharding(mesh, PartitionSpec())
