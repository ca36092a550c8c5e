"""Orbax checkpoints: train state and per-process iterator state, latest one restored."""

import json

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
