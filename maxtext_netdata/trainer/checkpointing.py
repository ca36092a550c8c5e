"""Orbax checkpoints of the train state and the data position.

A checkpoint `<run_dir>/checkpoints/<n>` is taken after `n` completed steps and holds two
items: `items` (params, optimizer state and step, written with `StandardSave`) and `iter`
(one JSON file per process, `process_<i>-of-<n>.json`, the layout of Grain's own
`grain.checkpoint.CheckpointHandler`, holding `iterator.get_state()`: the data position
`{"format": "netdata-position-1", "step", "fingerprint", "data_shuffle_seed",
"global_batch_size", "max_target_length", "split", "packing", "network_field_order",
"network_mode_weights", "enable_data_shuffling", "stream_order"}`, the same on every process). The position
is captured when the save is requested, so an asynchronous save cannot record a later one.
Restoring both gives the batches and the loss an uninterrupted run would have had, under any
worker, thread or process count.

`IteratorStateHandler` rather than Grain's handler: Grain's restores only the file of this
process index and count, so a checkpoint of 2 processes could not resume in 1 (or 1 in 2).
Ours writes the same files and, when this process's file is absent, takes the saved position
all processes agree on.

`Checkpoints` saves asynchronously. A checkpoint is complete once Orbax renames its folder
from `<n>.orbax-checkpoint-tmp` to `<n>`; a save that fails (a full disk) leaves only the
temporary folder, which no restore takes, and is reported as OSError naming the checkpoint,
its cause and the last complete checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from maxtext_netdata.config import Config, ConfigError
from maxtext_netdata.errors import first_line

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


class Checkpoints:
  """The run's checkpoints in `checkpoint_dir(config)`, saved asynchronously by Orbax.

  Training goes on while a save is written. A save whose writing fails (a full disk, a file
  over the size limit, no permission) surfaces at the next `save`, `check` or `close` as
  OSError naming the checkpoint and the cause, with a note naming the last complete
  checkpoint, from which a restart resumes. Orbax's own reports of that failure, from the
  threads it passes through, are held back (`_FailureEchoes`).
  """

  def __init__(self, config: Config):
    self.directory = checkpoint_dir(config)
    self._saving: int | None = None  # the step of the save that may still be in flight
    self._echoes = _FailureEchoes()
    try:
      options = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=True)
      self.manager = ocp.CheckpointManager(
        self.directory, item_names=(STATE_ITEM, ITERATOR_ITEM), options=options
      )
    except BaseException:
      self._echoes.release()
      raise

  def save(self, completed_steps: int, state: Any, iterator_state: dict[str, Any]) -> None:
    """Starts saving the state after `completed_steps` (the caller decides when one is due).

    Waits for the save before it first, as Orbax would, raising its failure.
    """
    with self._reporting(self._saving):
      self.manager.wait_until_finished()
    self._saving = completed_steps
    with self._reporting(completed_steps):
      self.manager.save(
        completed_steps,
        args=ocp.args.Composite(
          **{
            STATE_ITEM: ocp.args.StandardSave(state),
            ITERATOR_ITEM: IteratorStateSave(iterator_state),
          }
        ),
        force=True,
      )

  def check(self) -> None:
    """Raises the failure of a save that has ended; never waits for one being written.

    One process only: in a multi-process run the processes could learn of a failure at
    different steps, and one that stopped alone would leave the others waiting in the next
    step's collectives. There a failure surfaces at the next `save` or `close`, which all
    processes reach at the same step.
    """
    if self._saving is None or jax.process_count() > 1:
      return
    if not self.manager.is_saving_in_progress():
      with self._reporting(self._saving):
        self.manager.wait_until_finished()
      self._saving = None

  def restore_latest(self, abstract_state: Any) -> tuple[int, Any, dict[str, Any]] | None:
    """(completed steps, state, iterator state) of the latest checkpoint, or None if none.

    `abstract_state` is the state's tree of `jax.ShapeDtypeStruct`s with shardings; restored
    arrays get those shapes, dtypes and shardings.
    """
    step = self.manager.latest_step()
    if step is None:
      return None
    _check_arrays(self.directory / str(step), abstract_state)
    restored = self.manager.restore(
      step,
      args=ocp.args.Composite(
        **{
          STATE_ITEM: ocp.args.StandardRestore(abstract_state),
          ITERATOR_ITEM: IteratorStateRestore(),
        }
      ),
    )
    return step, restored[STATE_ITEM], restored[ITERATOR_ITEM]

  def close(self) -> None:
    """Waits for the save in flight (raising its failure) and closes the manager."""
    try:
      with self._reporting(self._saving):
        self.manager.close()
    finally:
      self._echoes.release()

  @contextlib.contextmanager
  def _reporting(self, step: int | None):
    """Within: a failed write of the checkpoint of `step` raised as OSError (see the class)."""
    try:
      yield
    except Exception as e:
      error = _os_error(e)
      if error is None:
        raise
      self._echoes.drop()
      if error.filename is None and step is not None:
        error.filename = str(self.directory / str(step))
      complete = ocp.utils.checkpoint_steps(self.directory) if self.directory.is_dir() else []
      error.add_note(
        f"the last complete checkpoint is step {max(complete)} in {self.directory}"
        if complete
        else f"no checkpoint in {self.directory} is complete"
      )
      raise error from e


_ORBAX_DIR = os.path.dirname(ocp.__file__)
# TensorStore, which writes Orbax's arrays, reports an OS error in its message only.
_OS_ERROR_CODE = re.compile(r"\[os_error_code='(\d+)'\]")


def load_params(path: str, abstract_state: Any, option: str = "load_parameters_path=") -> Any:
  """The params of the train state saved in checkpoint `path` (MaxText's
  `load_parameters_path`: `<run_dir>/checkpoints/<n>/items`, or `<n>` itself; a local path
  may be relative), restored with the shapes, dtypes and shardings of `abstract_state`, the
  state of this run's model and optimizer. Anything else is a ConfigError naming the path
  after `option` (the key or flag that gave it)."""
  target = _absolute(path)
  if (target / STATE_ITEM).is_dir():
    target = target / STATE_ITEM
  path = f"{option}{path}"
  if not target.is_dir():
    raise ConfigError(f"{path}: no such checkpoint folder")
  with ocp.StandardCheckpointer() as checkpointer:
    # Shapes first, from the metadata: a restore of arrays of other shapes fails only in
    # TensorStore's reads, whose errors outlive the call. (Orbax logs a warning that the
    # step's metadata file is not in the items folder: it is one folder up.)
    try:
      saved = _leaf_shapes(_item_metadata(checkpointer, target), "params")
    except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
      raise ConfigError(f"{path}: not a checkpoint ({first_line(e)})") from None
    if not saved:
      raise ConfigError(f"{path}: not a checkpoint (no parameters in it)")
    differs = _first_difference(saved, _leaf_shapes(abstract_state, "params"))
    if differs:
      raise ConfigError(f"{path}: not the parameters of this model ({differs})")
    try:
      state = checkpointer.restore(target, abstract_state)
    except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
      raise ConfigError(
        f"{path}: not a train state of this model and optimizer ({first_line(e)})"
      ) from None
  return state["params"]


def _absolute(path) -> epath.Path:
  """A local checkpoint path made absolute (Orbax's metadata of a relative path holds no
  items, orbax-checkpoint 0.12); a bucket's as it is."""
  path = str(path)
  return epath.Path(path if "://" in path else os.path.abspath(path))


def _item_metadata(checkpointer: ocp.StandardCheckpointer, target: epath.Path) -> Any:
  """The saved tree of array metadata of state item folder `target`. (Orbax logs a warning
  that the step's metadata file is not in the items folder: it is one folder up.)"""
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)
  try:
    return checkpointer.metadata(target).item_metadata
  finally:
    absl_logger.setLevel(level)


def _check_arrays(step_dir: epath.Path, abstract_state: Any) -> None:
  """A ConfigError naming checkpoint `step_dir` when its state's arrays are not those of
  `abstract_state` (a run resumed with another model, optimizer or layer layout), where
  Orbax's restore fails with a long traceback. Metadata that cannot be read is left to the
  restore's own error."""
  with ocp.StandardCheckpointer() as checkpointer:
    try:
      saved = _leaf_shapes(_item_metadata(checkpointer, _absolute(step_dir / STATE_ITEM)))
    except (ValueError, KeyError, TypeError, FileNotFoundError):
      return
  differs = _first_difference(saved, _leaf_shapes(abstract_state)) if saved else ""
  if differs:
    raise ConfigError(
      f"{step_dir}: the train state of another model or optimizer ({differs}): resume with the"
      " config it was saved with, or start another run_name (load_parameters_path=... takes"
      " a checkpoint's parameters into a new run of the same model)"
    )


def _leaf_shapes(tree: Any, under: str | None = None) -> dict[str, tuple]:
  """{path: (shape, dtype)} of the leaves of a state or its saved metadata (those under key
  `under` only, when given), each path as `a/b/0/c`: the saved metadata has dict keys where
  the state has optax's named tuples (`count` a field there, a key here)."""
  return {
    "/".join(_key_name(k) for k in path): (tuple(leaf.shape), str(leaf.dtype))
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
    if under is None or (path and _key_name(path[0]) == under)
  }


def _key_name(key: Any) -> str:
  """A tree path entry's name: a dict key, an attribute or a sequence index."""
  for attribute in ("key", "name", "idx"):
    if hasattr(key, attribute):
      return str(getattr(key, attribute))
  return str(key)


def _first_difference(saved: dict, wanted: dict) -> str:
  """The first array of two `_leaf_shapes` that differs, as `path: X saved, Y here`; "" if
  none."""
  where = sorted(set(saved) ^ set(wanted)) or [k for k in wanted if saved[k] != wanted[k]]
  if not where:
    return ""
  where.sort(key=lambda k: not k.startswith("params/"))  # a parameter's, where one differs
  return f"{where[0]}: {saved.get(where[0], 'absent')} saved, {wanted.get(where[0], 'absent')} here"


def _os_error(error: BaseException) -> OSError | None:
  """The OSError behind a failed save, or None if it failed otherwise.

  An OSError itself (Orbax's own file operations) or the `[os_error_code='N']` of a
  TensorStore error (ValueError: RESOURCE_EXHAUSTED: Error writing ... No space left on
  device [os_error_code='28']), anywhere in the chain of causes.
  """
  while error is not None:
    if isinstance(error, OSError) and error.errno is not None:
      return error
    found = _OS_ERROR_CODE.search(str(error))
    if found:
      code = int(found.group(1))
      return OSError(code, os.strerror(code))
    error = error.__cause__ or error.__context__
  return None


class _FailureEchoes:
  """Orbax's own reports of a failed save, held back from stderr while the manager is open.

  A save failing in Orbax's background threads is logged at ERROR, with its traceback, by
  each thread it passes through (absl's logger). Its event loop, closed with writes still in
  flight, reports "Event loop is closed" as unraisable exceptions; its unfinished tasks are
  logged as "Task exception was never retrieved" (asyncio's logger), the futures of its
  TensorStore writes as "Future exception was never retrieved", or, at interpreter
  shutdown, reported as unraisable. The failure itself surfaces in the main thread, where
  `Checkpoints` reports it once. Held back: ERROR records from Orbax's modules or naming
  them, and those unraisable exceptions. `release` passes them on when no save failed; after
  `drop` (a failure reported) they are dropped, and go on being dropped until the process
  ends.
  """

  _LOGGERS = ("absl", "asyncio")  # Orbax logs through absl; asyncio logs its lost tasks

  def __init__(self):
    self._records: list[logging.LogRecord] = []
    self._unraisables: list[Any] = []
    self._dropping = False
    self._orbax_dir = _ORBAX_DIR
    for name in self._LOGGERS:
      logging.getLogger(name).addFilter(self._hold_record)
    self._previous_hook = sys.unraisablehook
    sys.unraisablehook = self._hold_unraisable

  def _from_orbax(self, record: logging.LogRecord) -> bool:
    """Logged by Orbax, naming it, or carrying an exception raised in it (asyncio's
    "_GatheringFuture exception was never retrieved" names only the exception) or in the
    TensorStore writes it starts (a future's "Future exception was never retrieved": set
    from TensorStore's threads, no Python frame, only the OS error code in its message)."""
    if record.pathname.startswith(self._orbax_dir) or self._orbax_dir in record.getMessage():
      return True
    error = record.exc_info[1] if record.exc_info else None
    if error is not None and _OS_ERROR_CODE.search(str(error)):
      return True
    frame = error.__traceback__ if error is not None else None
    while frame is not None:
      if frame.tb_frame.f_code.co_filename.startswith(self._orbax_dir):
        return True
      frame = frame.tb_next
    return False

  def _hold_record(self, record: logging.LogRecord) -> bool:
    echo = record.levelno >= logging.ERROR and self._from_orbax(record)
    if echo and not self._dropping:
      self._records.append(record)
    return not echo

  def _hold_unraisable(self, unraisable) -> None:
    # Called at shutdown too, when module globals may be gone: nothing but builtins here.
    exc, obj = unraisable.exc_value, unraisable.object
    code = getattr(obj, "cr_code", None)
    echo = (type(exc) is RuntimeError and str(exc) == "Event loop is closed") or (
      code is not None and code.co_filename.startswith(self._orbax_dir)
    )
    if not echo:
      self._previous_hook(unraisable)
    elif not self._dropping:
      self._unraisables.append(unraisable)

  def drop(self) -> None:
    self._dropping = True
    self._records.clear()
    self._unraisables.clear()
    # The tasks and coroutines the failed save abandoned are finalized now, not at shutdown.
    gc.collect()

  def release(self) -> None:
    """Without a failure: stops holding back and passes on what was held."""
    if self._dropping:
      return
    for name in self._LOGGERS:
      logging.getLogger(name).removeFilter(self._hold_record)
    if sys.unraisablehook == self._hold_unraisable:
      sys.unraisablehook = self._previous_hook
    for record in self._records:
      logging.getLogger(record.name).handle(record)
    for unraisable in self._unraisables:
      self._previous_hook(unraisable)
    self._records.clear()
    self._unraisables.clear()
