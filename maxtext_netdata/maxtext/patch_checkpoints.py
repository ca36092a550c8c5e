"""The checkpoints patch: MaxText saves and restores our data position.

MaxText saves and restores the data iterator only for `dataset_type == "grain"`;
`checkpointing.save_checkpoint` and `load_state_if_possible` see `network_grain` as `grain`,
so the data position (`network_grain.POSITION_FORMAT`: next global step and what identifies
the data) goes into each checkpoint's `iter` item, through MaxText's own Grain checkpointable
(`PositionIterator`), and a restart continues with exactly the next batch, whatever
`grain_worker_count` / `grain_num_threads` either run used. `grain_utility.for_restore`
restores our iterator from the checkpoint's per-process files whatever process count wrote
them (MaxText's own restore needs one file per process or `expansion_factor_real_data`): the
position is global, so every file holds the same one.
"""

from __future__ import annotations

import functools
import inspect
import json
import re

from maxtext_netdata.errors import UserError
from maxtext_netdata.maxtext.patch_config import NETWORK_GRAIN

# What install() patches: (module, attribute).
REQUIRED = (
  ("maxtext.common.checkpointing", "save_checkpoint"),
  ("maxtext.common.checkpointing", "load_state_if_possible"),
  ("maxtext.common.grain_utility", "for_restore"),
  ("maxtext.common.grain_utility", "GrainCheckpointable"),
)


class CheckpointError(UserError):
  """A checkpoint's data position files are incomplete or disagree."""


class PositionIterator:
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


class _AsGrain:
  """A read-only view of a MaxText config whose dataset_type reads "grain"."""

  def __init__(self, config):
    object.__setattr__(self, "_config", config)

  def __getattr__(self, name: str):
    if name == "dataset_type":
      return "grain"
    return getattr(self._config, name)


def _make_save_checkpoint(original):
  @functools.wraps(original)
  def save_checkpoint(
    checkpoint_manager, step, state, config=None, data_iterator=None, force=False
  ):
    if config is not None and getattr(config, "dataset_type", None) == NETWORK_GRAIN:
      config = _AsGrain(config)
    return original(checkpoint_manager, step, state, config, data_iterator, force)

  return save_checkpoint


def _make_load_state(original):
  signature = inspect.signature(original)

  @functools.wraps(original)
  def load_state_if_possible(*args, **kwargs):
    bound = signature.bind(*args, **kwargs)
    if bound.arguments.get("dataset_type") == NETWORK_GRAIN:
      bound.arguments["dataset_type"] = "grain"
    return original(*bound.args, **bound.kwargs)

  return load_state_if_possible


_STATE_FILE = re.compile(r"process_(\d+)-of-(\d+)\.json")


def _make_for_restore(grain_utility, original, iterator_class):
  """`for_restore` that restores our iterator from a checkpoint written by any process count.

  Every process of the saving run wrote `process_<i>-of-<n>.json` holding the same global
  position. Each restoring process reads all n files (small JSON; every process reaches the
  same verdict, so a bad checkpoint stops them all instead of leaving some in a collective),
  checks that they are complete and agree, and has MaxText's `GrainCheckpointable` restore
  from file `process_index mod n`. Other iterators keep MaxText's own restore.
  """

  @functools.wraps(original)
  def for_restore(checkpoint_manager, step, data_iterator, expansion_factor_real_data):
    if not isinstance(data_iterator, iterator_class):
      return original(checkpoint_manager, step, data_iterator, expansion_factor_real_data)
    import jax  # noqa: PLC0415

    directory = checkpoint_manager.directory / str(step) / "iter"
    files = {}
    for path in directory.glob("process_*-of-*.json"):
      match = _STATE_FILE.fullmatch(path.name)
      if match:
        files[int(match[1]), int(match[2])] = path
    counts = {count for _, count in files}
    if len(counts) != 1 or len(files) != next(iter(counts)):
      raise CheckpointError(
        f"{directory}: the data position files {sorted(p.name for p in files.values())} are"
        " not one complete set process_<i>-of-<n>.json; the checkpoint is incomplete"
      )
    (count,) = counts
    positions = {key: json.loads(path.read_text()) for key, path in sorted(files.items())}
    first = positions[0, count]
    differ = [f"process_{i}-of-{n}.json" for (i, n), state in positions.items() if state != first]
    if differ:
      raise CheckpointError(
        f"{directory}: {', '.join(differ)} hold another data position than"
        f" process_0-of-{count}.json ({first.get('step')!r}); the checkpoint is inconsistent"
      )
    return grain_utility.GrainCheckpointable(
      data_iterator.local_iterator,
      restore_process_index=jax.process_index() % count,
      restore_process_count=count,
    )

  return for_restore


def install(checkpointing, grain_utility, iterator_class) -> None:
  """Lets `network_grain` through MaxText's checkpointing; `iterator_class` is the plugin's
  multi-host iterator, whose position `for_restore` restores from any process count."""
  grain_utility.for_restore = _make_for_restore(
    grain_utility, grain_utility.for_restore, iterator_class
  )
  checkpointing.save_checkpoint = _make_save_checkpoint(checkpointing.save_checkpoint)
  checkpointing.load_state_if_possible = _make_load_state(checkpointing.load_state_if_possible)
