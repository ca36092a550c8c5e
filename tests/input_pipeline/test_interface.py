"""`create_data_iterator`: dataset_type registry, global arrays, eval split, synthetic."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from maxtext_netdata import config as config_lib
from maxtext_netdata.data.prepare import prepare
from maxtext_netdata.distributed import mesh as mesh_lib
from maxtext_netdata.errors import ConfigError
from maxtext_netdata.format import tokenizer
from maxtext_netdata.input_pipeline import create_data_iterator
from maxtext_netdata.input_pipeline.batches_cli import digest
from maxtext_netdata.input_pipeline.sequences import KEYS
from tests.helpers import pipeline

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def overrides(tmp_path_factory):
  root = tmp_path_factory.mktemp("interface")
  return [*pipeline.small_run_overrides(root), "grain_worker_count=0", "eval_steps=3"]


def test_network_grain_yields_global_arrays_of_the_host_batches(overrides):
  config = config_lib.load(None, overrides)
  mesh = mesh_lib.make_mesh(config)
  train, evaluation = create_data_iterator(config, mesh)
  try:
    batches = [next(train) for _ in range(3)]
    for value in batches[0].values():
      assert isinstance(value, jax.Array)
      assert value.shape == (4, 128) and value.dtype == np.int32
      assert value.sharding.is_equivalent_to(mesh_lib.batch_sharding(config, mesh), 2)
    assert sorted(batches[0]) == sorted(KEYS)
    state = train.get_state()
    assert state["step"] == 3 and state["global_batch_size"] == 4
  finally:
    train.close()
    evaluation.close()
  # The same batches from another process with 2 worker processes, through the `batches`
  # command, and after a restore of the position in a fresh iterator.
  in_workers = [o for o in overrides if not o.startswith("grain_worker_count=")]
  expected = _cli_digests([*in_workers, "grain_worker_count=2"], steps=5)
  got = [digest({k: np.asarray(v) for k, v in batch.items()}) for batch in batches]
  assert got == expected[:3] and len(set(expected)) == 5
  restored, evaluation = create_data_iterator(config, mesh)
  restored.set_state(state)
  try:
    rest = [digest({k: np.asarray(v) for k, v in next(restored).items()}) for _ in range(2)]
  finally:
    restored.close()
    evaluation.close()
  assert rest == expected[3:]


def _digests_and_positions(iterator, count: int) -> list[tuple[str, int]]:
  return [
    (digest({k: np.asarray(v) for k, v in next(iterator).items()}), iterator.get_state()["step"])
    for _ in range(count)
  ]


@pytest.mark.parametrize("ahead", [1, 3])
def test_batches_placed_ahead_are_the_same_batches_at_the_same_positions(overrides, ahead):
  """`device_prefetch` changes when a batch is placed, never which batch comes or the position
  a checkpoint saves: after k batches the position is k, and a restore there (also in an
  iterator that placed batches past it) continues with batch k + 1."""
  config = config_lib.load(None, [*overrides, "device_prefetch=0"])
  mesh = mesh_lib.make_mesh(config)
  plain, evaluation = create_data_iterator(config, mesh)
  evaluation.close()
  ahead_config = config.replace(device_prefetch=ahead)
  placed, evaluation = create_data_iterator(ahead_config, mesh)
  evaluation.close()
  try:
    want = _digests_and_positions(plain, 6)
    assert [position for _, position in want] == [1, 2, 3, 4, 5, 6]
    got = _digests_and_positions(placed, 2)
    position = placed.get_state()
    got += _digests_and_positions(placed, 2)
    placed.set_state(position)  # back to step 2: the batches placed past it are dropped
    got += _digests_and_positions(placed, 4)
  finally:
    plain.close()
    placed.close()
  assert got == want[:4] + want[2:]


def _cli_digests(overrides, steps: int) -> list[str]:
  result = subprocess.run(
    [sys.executable, "-m", "maxtext_netdata", "batches", "configs/base.yml", *overrides]
    + ["--steps", str(steps)],
    cwd=REPO,
    env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  return [line.split()[2] for line in result.stdout.splitlines() if line.startswith("step ")]


def test_eval_is_one_pass_over_held_out_probes(overrides):
  config = config_lib.load(None, overrides)
  train, evaluation = create_data_iterator(config, mesh_lib.make_mesh(config))
  train.close()
  splits = prepare.ensure_prepared(config, progress=False)
  train_sources = {bytes(s) for s in np.asarray(splits.train.probe_src)}
  eval_sources = {bytes(s) for s in np.asarray(splits.eval.probe_src)}
  assert eval_sources and not train_sources & eval_sources, "train/test disjoint by probe"
  start = evaluation.get_state()
  batches = list(evaluation)
  assert len(batches) == 3
  seen = set()
  for batch in batches:
    for row in np.asarray(batch["inputs"]):
      seen.update(m["src"] for m in tokenizer.decode(row))
  eval_text = {
    pipeline.address(src, int(version))
    for src, version in zip(splits.eval.probe_src, splits.eval.probe_version, strict=True)
  }
  assert seen <= eval_text
  evaluation.set_state(start)
  assert (np.asarray(next(evaluation)["inputs"]) == np.asarray(batches[0]["inputs"])).all()
  evaluation.close()


def test_synthetic_returns_one_fixed_device_batch_forever(overrides):
  config = config_lib.load(None, [*overrides, "dataset_type=synthetic"])
  train, evaluation = create_data_iterator(config, mesh_lib.make_mesh(config))
  assert evaluation is None
  first, second = next(train), next(train)
  assert first is second
  for key in KEYS:
    assert isinstance(first[key], jax.Array) and first[key].shape == (4, 128)
  targets = np.asarray(first["targets"])
  assert (targets[:, :-1] == np.asarray(first["inputs"])[:, 1:]).all()
  assert train.get_state() == {"count": 2}


def test_unknown_dataset_type_lists_the_known_ones(overrides):
  config = config_lib.load(None, overrides)
  values = config.get_keys()
  values["dataset_type"] = "tfds"
  with pytest.raises(ConfigError, match="network_grain, synthetic"):
    create_data_iterator(config_lib.Config(values), mesh_lib.make_mesh(config))


@pytest.mark.slow
def test_batch_is_sharded_over_four_devices(overrides):
  script = textwrap.dedent(
    f"""
      import numpy as np
      from maxtext_netdata import config as config_lib
      from maxtext_netdata.distributed import mesh as mesh_lib
      from maxtext_netdata.errors import ConfigError
      from maxtext_netdata.input_pipeline import create_data_iterator
      overrides = {overrides!r}
      config = config_lib.load(None, overrides + ["global_batch_size_to_load=-1",
                                                  "per_device_batch_size=2"])
      mesh = mesh_lib.make_mesh(config)
      train, evaluation = create_data_iterator(config, mesh)
      batch = next(train)
      shards = batch["inputs"].addressable_shards
      assert batch["inputs"].shape == (8, 128), batch["inputs"].shape
      assert sorted(s.index[0].start for s in shards) == [0, 2, 4, 6]
      assert all(s.data.shape == (2, 128) for s in shards)
      train.close(); evaluation.close()
      bad = config_lib.load(None, overrides + ["global_batch_size_to_load=6"])
      try:
        create_data_iterator(bad, mesh)
      except ConfigError as e:
        assert "does not divide" in str(e), e
      else:
        raise AssertionError("6 sequences over 4 devices must be refused")
      print("OK")
      """
  )
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
  result = subprocess.run(
    [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
  )
  assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]
