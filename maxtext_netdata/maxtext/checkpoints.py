"""MaxText's checkpointing of our data position: the patches `plugin.install()` applies.

MaxText saves and restores the data iterator only for `dataset_type == "grain"`;
`make_save_checkpoint` and `make_load_state` let `network_grain` through as `grain`, so the
position (`network_grain.POSITION_FORMAT`) goes into each checkpoint's `iter` item.
`make_for_restore` restores our iterator from the per-process files of any process count.
"""

from __future__ import annotations

import functools
import inspect
import json
import re

from maxtext_netdata.errors import UserError

NETWORK_GRAIN = "network_grain"


class CheckpointError(UserError):
  """A checkpoint's data position files are incomplete or disagree."""


class AsGrain:
  """A read-only view of a MaxText config whose dataset_type reads "grain"."""

  def __init__(self, config):
    object.__setattr__(self, "_config", config)

  def __getattr__(self, name: str):
    if name == "dataset_type":
      return "grain"
    return getattr(self._config, name)


def make_save_checkpoint(original):
  @functools.wraps(original)
  def save_checkpoint(
    checkpoint_manager, step, state, config=None, data_iterator=None, force=False
  ):
    if config is not None and getattr(config, "dataset_type", None) == NETWORK_GRAIN:
      config = AsGrain(config)
    return original(checkpoint_manager, step, state, config, data_iterator, force)

  return save_checkpoint


def make_load_state(original):
  signature = inspect.signature(original)

  @functools.wraps(original)
  def load_state_if_possible(*args, **kwargs):
    bound = signature.bind(*args, **kwargs)
    if bound.arguments.get("dataset_type") == NETWORK_GRAIN:
      bound.arguments["dataset_type"] = "grain"
    return original(*bound.args, **bound.kwargs)

  return load_state_if_possible


_STATE_FILE = re.compile(r"process_(\d+)-of-(\d+)\.json")


def make_for_restore(grain_utility, original, iterator_class):
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
