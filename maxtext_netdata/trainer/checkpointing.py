"""Orbax checkpoints of the train state and the data position.

A checkpoint `<run_dir>/checkpoints/<n>` is taken after `n` completed steps and holds two
items: `items` (params, optimizer state and step, written with `StandardSave`) and `iter`
(one JSON file per process, `process_<i>-of-<n>.json`, the layout of Grain's own
`grain.checkpoint.CheckpointHandler`, holding `iterator.get_state()`: the data position
`{"format": "netdata-position-1", "step", "fingerprint", "data_shuffle_seed",
"global_batch_size", "max_target_length", "split"}`, the same on every process). The position
is captured when the save is requested, so an asynchronous save cannot record a later one.
Restoring both gives the batches and the loss an uninterrupted run would have had, under any
worker, thread or process count.

`IteratorStateHandler` rather than Grain's handler: Grain's restores only the file of this
process index and count, so a checkpoint of 2 processes could not resume in 1 (or 1 in 2).
Ours writes the same files and, when this process's file is absent, takes the saved position
all processes agree on.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from maxtext_netdata.config import Config

STATE_ITEM = "items"
ITERATOR_ITEM = "iter"


class IteratorStateHandler(ocp.CheckpointHandler):
  """Saves and restores a per-process JSON iterator state (Grain's file layout)."""

  def save(self, directory: epath.Path, args: IteratorStateSave) -> None:
    _state_file(directory).write_text(json.dumps(args.state, indent=2))

  def restore(self, directory: epath.Path, args: IteratorStateRestore | None = None) -> Any:
    path = _state_file(directory)
    if path.exists():
      return json.loads(path.read_text())
    # Saved by another number of processes. Every process saved the same data position (a
    # host batch is a function of the global step and the host's rows), so any of them
    # continues the same global batches here.
    states = {
      json.dumps(json.loads(saved.read_text()), sort_keys=True)
      for saved in directory.glob("process_*-of-*.json")
    }
    if len(states) != 1:
      found = "none" if not states else "differing states"
      raise FileNotFoundError(
        f"{path}: no iterator state for this process in the checkpoint ({found})"
      )
    return json.loads(states.pop())

  def metadata(self, directory: epath.Path) -> None:
    return None


def _state_file(directory: epath.Path) -> epath.Path:
  return directory / f"process_{jax.process_index()}-of-{jax.process_count()}.json"


@ocp.args.register_with_handler(IteratorStateHandler, for_save=True)
@dataclasses.dataclass
class IteratorStateSave(ocp.args.CheckpointArgs):
  state: dict[str, Any]


@ocp.args.register_with_handler(IteratorStateHandler, for_restore=True)
@dataclasses.dataclass
class IteratorStateRestore(ocp.args.CheckpointArgs):
  pass


def checkpoint_dir(config: Config) -> Path:
  return Path(config.run_dir).absolute() / "checkpoints"


def create_manager(config: Config) -> ocp.CheckpointManager | None:
  """The run's CheckpointManager, or None when `enable_checkpointing` is off.

  Saves are asynchronous: training goes on while arrays are written; `close()` waits.
  """
  if not config.enable_checkpointing:
    return None
  options = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=True)
  return ocp.CheckpointManager(
    checkpoint_dir(config), item_names=(STATE_ITEM, ITERATOR_ITEM), options=options
  )


def save(
  manager: ocp.CheckpointManager,
  completed_steps: int,
  state: Any,
  iterator_state: dict[str, Any],
) -> None:
  """Saves the state after `completed_steps` (the caller decides when one is due)."""
  manager.save(
    completed_steps,
    args=ocp.args.Composite(
      **{
        STATE_ITEM: ocp.args.StandardSave(state),
        ITERATOR_ITEM: IteratorStateSave(iterator_state),
      }
    ),
    force=True,
  )


def restore_latest(
  manager: ocp.CheckpointManager, abstract_state: Any
) -> tuple[int, Any, dict[str, Any]] | None:
  """(completed steps, state, iterator state) of the latest checkpoint, or None if none.

  `abstract_state` is the state's tree of `jax.ShapeDtypeStruct`s with shardings; restored
  arrays get those shapes, dtypes and shardings.
  """
  step = manager.latest_step()
  if step is None:
    return None
  restored = manager.restore(
    step,
    args=ocp.args.Composite(
      **{
        STATE_ITEM: ocp.args.StandardRestore(abstract_state),
        ITERATOR_ITEM: IteratorStateRestore(),
      }
    ),
  )
  return step, restored[STATE_ITEM], restored[ITERATOR_ITEM]
