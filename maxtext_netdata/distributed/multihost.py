"""Multi-process runs: starting `jax.distributed` and the rows each process loads.

A multi-host run is one process per host (a TPU VM worker, a GPU VM), all running the same
command. The environment says whether a run is one of several processes:

- `JAX_NUM_PROCESSES=N` (N > 1) with `JAX_COORDINATOR_ADDRESS=host:port` and
  `JAX_PROCESS_ID=i`: process i of N, the coordinator being process 0's address (the GPU-VM
  launcher sets these, one process id per host);
- `JAX_NUM_PROCESSES=auto`: JAX detects the cluster itself (Cloud TPU VM slices, GKE, Slurm,
  Open MPI; the TPU-VM launcher sets this);
- otherwise (unset or 1): a single process, and `jax.distributed` is not started.

Every process then loads only its own rows of each global batch (`process_row_range`), and
`jax.make_array_from_process_local_data` joins them into one global array. Because a row's
content depends only on (seed, epoch, global row index), the global batch is the same for any
process count, so a run can resume on a different number of hosts.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils

from maxtext_netdata.config import Config
from maxtext_netdata.errors import ConfigError

ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"
ENV_COORDINATOR_ADDRESS = "JAX_COORDINATOR_ADDRESS"
AUTO = "auto"
# jax.distributed.initialize's own default, used when no config is given.
_DEFAULT_TIMEOUT_S = 300


@dataclasses.dataclass(frozen=True)
class DistributedSetup:
  """How to start `jax.distributed`; None fields are left to JAX's cluster detection."""

  coordinator_address: str | None
  num_processes: int | None
  process_id: int | None


def _int_var(env: Mapping[str, str], name: str) -> int:
  text = env.get(name, "").strip()
  if not text:
    raise ConfigError(
      f"{ENV_NUM_PROCESSES}={env[ENV_NUM_PROCESSES]} asks for a multi-process run but {name}"
      " is not set"
    )
  try:
    return int(text)
  except ValueError:
    raise ConfigError(f"{name}={text!r} is not an integer") from None


def distributed_setup(env: Mapping[str, str]) -> DistributedSetup | None:
  """The multi-process setup `env` asks for, or None for a single-process run.

  Raises:
    ConfigError: the variables are incomplete or inconsistent (named in the message).
  """
  count_text = env.get(ENV_NUM_PROCESSES, "").strip()
  if not count_text:
    return None
  if count_text.lower() == AUTO:
    return DistributedSetup(None, None, None)
  try:
    count = int(count_text)
  except ValueError:
    raise ConfigError(
      f"{ENV_NUM_PROCESSES}={count_text!r} must be a process count or {AUTO!r}"
    ) from None
  if count < 1:
    raise ConfigError(f"{ENV_NUM_PROCESSES}={count} must be at least 1")
  if count == 1:
    return None
  address = env.get(ENV_COORDINATOR_ADDRESS, "").strip()
  if not address:
    raise ConfigError(
      f"{ENV_NUM_PROCESSES}={count} asks for a multi-process run but"
      f" {ENV_COORDINATOR_ADDRESS} (host:port of process 0) is not set"
    )
  if ":" not in address:
    raise ConfigError(f"{ENV_COORDINATOR_ADDRESS}={address!r} must be host:port")
  process_id = _int_var(env, ENV_PROCESS_ID)
  if not 0 <= process_id < count:
    raise ConfigError(f"{ENV_PROCESS_ID}={process_id} must be in [0, {count})")
  return DistributedSetup(address, count, process_id)


def initialize_distributed(
  config: Config | None = None, env: Mapping[str, str] | None = None
) -> bool:
  """Starts `jax.distributed` when the environment asks for a multi-process run.

  Must run before anything touches a JAX device (entry points call it right after reading
  their config). Calling it again, or after someone else started `jax.distributed`, does
  nothing.

  Args:
    config: gives `jax_distributed_initialization_timeout`, the seconds to wait for all
      processes to reach the coordinator (JAX then aborts the process).
    env: the environment to read (default `os.environ`).

  Returns:
    True when this is a multi-process run (`jax.distributed` is running), False otherwise.
  """
  setup = distributed_setup(os.environ if env is None else env)
  if setup is None:
    return False
  if jax.distributed.is_initialized():
    return True
  timeout = _DEFAULT_TIMEOUT_S if config is None else config.jax_distributed_initialization_timeout
  if timeout <= 0:
    raise ConfigError(f"jax_distributed_initialization_timeout={timeout} must be positive")
  # JAX aborts the process (no Python exception) when the coordinator cannot be reached, so
  # say first what is being attempted: the last line a user sees then names the cause.
  if setup.num_processes is None:
    print(
      f"multihost: starting jax.distributed with cluster auto-detection (timeout {timeout} s)",
      file=sys.stderr,
      flush=True,
    )
  else:
    print(
      f"multihost: process {setup.process_id} of {setup.num_processes} connecting to the"
      f" coordinator at {setup.coordinator_address} (timeout {timeout} s)",
      file=sys.stderr,
      flush=True,
    )
  try:
    jax.distributed.initialize(
      coordinator_address=setup.coordinator_address,
      num_processes=setup.num_processes,
      process_id=setup.process_id,
      initialization_timeout=timeout,
    )
  except ValueError as e:
    if setup.num_processes is not None:
      raise
    # JAX's cluster detection found nothing to fill in: not a TPU VM, GKE, Slurm or MPI job.
    raise ConfigError(
      f"{ENV_NUM_PROCESSES}={AUTO}: JAX detected no cluster here ({e}); set"
      f" {ENV_NUM_PROCESSES}, {ENV_PROCESS_ID} and {ENV_COORDINATOR_ADDRESS} instead"
    ) from None
  return True


def process_row_range(
  global_batch_size: int, process_index: int | None = None, process_count: int | None = None
) -> tuple[int, int]:
  """Rows [start, stop) of each global batch that one process loads.

  Process h of P loads rows [h·B/P, (h+1)·B/P): contiguous, disjoint and covering the batch in
  process order. That is where `jax.make_array_from_process_local_data` puts each process's
  data when the batch dimension is sharded over a mesh whose devices are grouped by process
  (true of `jax.devices()` order); `process_rows` answers for any sharding.

  Args:
    global_batch_size: B, sequences per step over all processes.
    process_index: h (default `jax.process_index()`).
    process_count: P (default `jax.process_count()`).

  Raises:
    ConfigError: B is not a multiple of P.
  """
  index = jax.process_index() if process_index is None else process_index
  count = jax.process_count() if process_count is None else process_count
  if not 0 <= index < count:
    raise ValueError(f"process index {index} is not in [0, {count})")
  if global_batch_size % count:
    raise ConfigError(
      f"global batch of {global_batch_size} sequences does not divide over {count} processes"
    )
  per_process = global_batch_size // count
  return index * per_process, (index + 1) * per_process


def process_rows(sharding: jax.sharding.Sharding, global_shape: tuple[int, ...]) -> np.ndarray:
  """Global row indices (along dimension 0) this process must load, in local-batch order.

  These are the rows of the devices this process addresses under `sharding` for an array of
  `global_shape`, sorted: exactly what `jax.make_array_from_process_local_data(sharding,
  local_batch, global_shape)` expects the local batch to hold, whatever the mesh's device
  order.
  """
  rows = set()
  for index in sharding.addressable_devices_indices_map(tuple(global_shape)).values():
    rows.update(range(global_shape[0])[index[0]])
  return np.array(sorted(rows), dtype=np.int64)


def sharded_row_range(
  sharding: jax.sharding.Sharding, global_shape: tuple[int, ...]
) -> tuple[int, int]:
  """`process_rows` as one range [start, stop), for loaders that read contiguous rows.

  Raises:
    ConfigError: the mesh interleaves this process's devices with other processes' along
      the batch dimension, so its rows are not one range.
  """
  rows = process_rows(sharding, global_shape)
  start, stop = int(rows[0]), int(rows[-1]) + 1
  if len(rows) != stop - start:
    raise ConfigError(
      f"process {jax.process_index()} holds rows {rows.tolist()} of the global batch, not one"
      " range: build the mesh with each process's devices next to each other (jax.devices()"
      " order does this)"
    )
  return start, stop


def gather_to_host(batch: Mapping[str, jax.Array]) -> dict[str, np.ndarray]:
  """The whole of each global array as numpy, on every process (for digests and checks).

  A collective: every process must call it for the same batch.
  """
  if jax.process_count() == 1:
    return {key: np.asarray(value) for key, value in batch.items()}
  return {
    key: np.asarray(multihost_utils.process_allgather(value, tiled=True))
    for key, value in batch.items()
  }
