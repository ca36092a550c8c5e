"""Orbax checkpoints: train state and per-process iterator state, latest one restored."""

import contextlib
import json
import logging
import sys

import jax
import jax.numpy as jnp
import numpy as np

from maxtext_netdata import config
from maxtext_netdata.distributed.mesh import make_mesh, replicated
from maxtext_netdata.trainer import checkpointing


def _config(tmp_path, *overrides):
  return config.load(None, [f"base_output_directory={tmp_path}", "run_name=ckpt", *overrides])


def _state(seed):
  key = jax.random.key(seed)
  return {
    "step": jnp.int32(seed),
    "params": {"w": jax.random.normal(key, (4, 3)), "b": jnp.arange(3, dtype=jnp.bfloat16)},
    "opt_state": (jnp.float32(seed / 2), {"mu": jnp.ones((4, 3)) * seed}),
  }


def test_latest_checkpoint_restores_state_and_iterator_position(tmp_path):
  cfg = _config(tmp_path)
  sharding = replicated(make_mesh(cfg))
  checkpoints = checkpointing.Checkpoints(cfg)
  assert checkpoints.restore_latest(None) is None
  checkpoints.save(5, _state(5), {"next_index": 40, "epoch": 0})
  checkpoints.save(10, _state(10), {"next_index": 80, "epoch": 1})
  checkpoints.close()

  step_dir = tmp_path / "ckpt" / "checkpoints" / "10"
  iterator_file = step_dir / "iter" / "process_0-of-1.json"
  assert json.loads(iterator_file.read_text()) == {"next_index": 80, "epoch": 1}

  abstract = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), _state(0)
  )
  checkpoints = checkpointing.Checkpoints(cfg)
  step, state, iterator_state = checkpoints.restore_latest(abstract)
  checkpoints.close()
  assert step == 10
  assert iterator_state == {"next_index": 80, "epoch": 1}
  expected = _state(10)
  assert jax.tree.structure(state) == jax.tree.structure(expected)
  for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(expected), strict=True):
    assert got.dtype == want.dtype
    assert got.sharding == sharding
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@contextlib.contextmanager
def _failure_echoes():
  """A `_FailureEchoes` within, undone by hand after: `release()` would log what it held,
  `drop()` keeps dropping."""
  echoes = checkpointing._FailureEchoes()
  try:
    yield echoes
  finally:
    for name in checkpointing._FailureEchoes._LOGGERS:
      logging.getLogger(name).removeFilter(echoes._hold_record)
    sys.unraisablehook = echoes._previous_hook


def test_a_lost_asyncio_future_of_a_failed_save_is_held_back():
  """asyncio's "_GatheringFuture exception was never retrieved" names neither Orbax nor its
  files, only the exception raised in Orbax's code: held back all the same, and dropped once
  the save's failure is reported. A record of other code passes."""
  orbax_file = f"{checkpointing._ORBAX_DIR}/checkpoint/_src/serialization/serialization.py"
  namespace: dict = {}
  exec(
    compile("def write():\n  raise ValueError('RESOURCE_EXHAUSTED')\n", orbax_file, "exec"),
    namespace,
  )

  def lost_future(raise_in):
    try:
      raise_in()
    except ValueError:
      exc_info = sys.exc_info()
    message = "_GatheringFuture exception was never retrieved\nfuture: <_GatheringFuture>"
    return logging.LogRecord(
      "asyncio", logging.ERROR, "/asyncio/base_events.py", 1, message, None, exc_info
    )

  def elsewhere():
    raise ValueError("not Orbax's")

  with _failure_echoes() as echoes:
    assert echoes._hold_record(lost_future(namespace["write"])) is False  # held back
    assert echoes._hold_record(lost_future(elsewhere)) is True  # passed on


def test_a_lost_tensorstore_future_of_a_failed_save_is_held_back():
  """TensorStore sets its write's failure on an asyncio future from its own threads: no
  Python frame at all, only the message with its OS error code. A real future lost with
  that exception is held back; one lost with another exception passes."""
  import asyncio  # noqa: PLC0415
  import gc  # noqa: PLC0415

  class Seen(logging.Handler):
    def __init__(self):
      super().__init__()
      self.messages: list[str] = []

    def emit(self, record):
      self.messages.append(record.getMessage())

  def lose(error: Exception) -> None:
    future = loop.create_future()
    future.set_exception(error)
    del future
    gc.collect()

  full = ValueError(
    'RESOURCE_EXHAUSTED: Error writing "params.w/0" in OCDBT database at local file "/x/": '
    "Failed to write 513605 bytes to file 65: No space left on device [os_error_code='28']"
  )
  seen, asyncio_log = Seen(), logging.getLogger("asyncio")
  asyncio_log.addHandler(seen)
  loop = asyncio.new_event_loop()
  try:
    with _failure_echoes():
      lose(full)
      assert seen.messages == []  # held back
      lose(ValueError("not TensorStore's"))
      assert len(seen.messages) == 1 and "Future exception was never retrieved" in seen.messages[0]
  finally:
    loop.close()
    asyncio_log.removeHandler(seen)
