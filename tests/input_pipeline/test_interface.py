"""`create_data_iterator`: dataset_type registry, global arrays, eval split, synthetic."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import jax
import numpy as np
import pytest

from maxtext_netdata import config as config_lib
from maxtext_netdata.data.prepare import prepare
from maxtext_netdata.distributed import mesh as mesh_lib
from maxtext_netdata.errors import ConfigError
from maxtext_netdata.format import tokenizer
from maxtext_netdata.input_pipeline import create_data_iterator, interface
from maxtext_netdata.input_pipeline.batches_cli import digest
from maxtext_netdata.input_pipeline.interface import DataIterator
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


@pytest.mark.parametrize("ahead,thread", [(1, False), (3, False), (1, True), (3, True)])
def test_batches_placed_ahead_are_the_same_batches_at_the_same_positions(overrides, ahead, thread):
  """`device_prefetch` changes when a batch is placed, never which batch comes or the position
  a checkpoint saves: after k batches the position is k, and a restore there (also in an
  iterator that placed batches past it) continues with batch k + 1; placed in `next` or by
  the placing thread."""
  config = config_lib.load(None, [*overrides, "device_prefetch=0"])
  mesh = mesh_lib.make_mesh(config)
  plain, evaluation = create_data_iterator(config, mesh)
  evaluation.close()
  ahead_config = config.replace(device_prefetch=ahead)
  placed, evaluation = create_data_iterator(ahead_config, mesh)
  evaluation.close()
  where = interface.host_slice(ahead_config, mesh)
  placed = DataIterator(placed.local_iterator, where.sharding, where.global_rows, ahead, thread)
  try:
    want = _digests_and_positions(plain, 6)
    assert [position for _, position in want] == [1, 2, 3, 4, 5, 6]
    placed.start_prefetch()  # the placing thread runs ahead; the position stays at 0
    assert placed.get_state()["step"] == 0
    got = _digests_and_positions(placed, 2)
    position = placed.get_state()
    got += _digests_and_positions(placed, 2)
    placed.set_state(position)  # back to step 2: the batches placed past it are dropped
    got += _digests_and_positions(placed, 4)
  finally:
    plain.close()
    placed.close()
  assert got == want[:4] + want[2:]


class _HostBatches:
  """Copies of one host batch, recording the thread of each `next`; `fail_at`: the batch
  whose `next` raises; `gate`: an event each `next` waits for (a slow worker), which `close`
  sets, as a real iterator's close wakes what waits on its workers."""

  def __init__(self, host: dict, fail_at: int | None = None, gate=None):
    self.host, self.fail_at, self.gate = host, fail_at, gate
    self.count, self.threads, self.closed = 0, [], False

  def __next__(self) -> dict:
    self.threads.append(threading.current_thread().name)
    if self.gate is not None:
      self.gate.wait()
    if self.closed:
      raise RuntimeError("next after close")
    if self.count == self.fail_at:
      raise ValueError(f"store.parquet: row {self.count} is bad")
    self.count += 1
    return {key: value.copy() for key, value in self.host.items()}

  def get_state(self) -> dict:
    return {"count": self.count}

  def set_state(self, state: dict) -> None:
    self.count = state["count"]

  def start_prefetch(self) -> None:
    pass

  def close(self) -> None:
    self.closed = True
    if self.gate is not None:
      self.gate.set()


def _placing_threads() -> list[threading.Thread]:
  return [t for t in threading.enumerate() if t.name == "device-prefetch"]


def _data_iterator(
  overrides, ahead: int, thread: bool = True, **kwargs
) -> tuple[DataIterator, _HostBatches]:
  config = config_lib.load(None, [*overrides, "dataset_type=synthetic"])
  local, where = interface.synthetic_host_rows(config, mesh_lib.make_mesh(config))
  host = _HostBatches(local, **kwargs)
  return DataIterator(host, where.sharding, where.global_rows, ahead, thread), host


def test_on_the_cpu_backend_batches_are_placed_in_next_by_default(overrides):
  """The default `device_prefetch` (2) on the CPU backend, where the step's own threads fill
  the cores: `next` loads and places, no placing thread runs."""
  config = config_lib.load(None, overrides)
  assert config.device_prefetch == 2 and jax.default_backend() == "cpu"
  train, evaluation = create_data_iterator(config, mesh_lib.make_mesh(config))
  evaluation.close()
  seen = []
  local = train.local_iterator

  class Recording:
    def __next__(self):
      seen.append(threading.current_thread().name)
      return next(local)

    def __getattr__(self, name):
      return getattr(local, name)

  train.local_iterator = Recording()
  try:
    train.start_prefetch()
    [next(train) for _ in range(2)]
    assert _placing_threads() == [] and set(seen) == {"MainThread"} and len(seen) == 2 + 2
  finally:
    train.close()


@pytest.mark.parametrize(
  "ahead,thread,loader,loaded",
  [(0, True, "MainThread", 3), (2, False, "MainThread", 3 + 2), (2, True, "device-prefetch", 6)],
)
def test_where_batches_are_loaded_and_placed(overrides, ahead, thread, loader, loaded):
  """With a placing thread the training loop's `next` only takes a placed batch: loading and
  placing run on that thread, at most `ahead` + 1 batches past the one handed out; without
  it, in `next`, `ahead` past it. Either way the position is that of the batches handed out."""
  data, host = _data_iterator(overrides, ahead, thread)
  try:
    data.start_prefetch()
    deadline = time.monotonic() + 30
    while loader != "MainThread" and host.count < ahead + 1 and time.monotonic() < deadline:
      time.sleep(0.01)
    assert host.count == (ahead + 1 if loader != "MainThread" else 0)
    assert data.get_state() == {"count": 0}  # none handed out yet
    batches = [next(data) for _ in range(3)]
    assert all(isinstance(value, jax.Array) for value in batches[-1].values())
    while host.count < loaded and time.monotonic() < deadline:
      time.sleep(0.01)
    time.sleep(0.2)  # no more than that is loaded
    assert host.count == loaded
    assert set(host.threads) == {loader}
    assert data.get_state() == {"count": 3}
  finally:
    data.close()
  assert _placing_threads() == [] and host.closed


def test_a_loading_error_is_raised_by_the_next_that_takes_its_batch(overrides):
  """An error on the placing thread comes out of the loop's `next` as it was raised, after
  the batches before it, and ends the iterator; close leaves no thread."""
  data, _ = _data_iterator(overrides, 2, fail_at=2)
  try:
    assert data.get_state() == {"count": 0}
    next(data), next(data)
    with pytest.raises(ValueError, match=r"^store\.parquet: row 2 is bad$"):
      next(data)
    with pytest.raises(StopIteration):
      next(data)
  finally:
    data.close()
  assert _placing_threads() == []


def test_close_stops_a_placing_thread_that_waits_on_its_loader(overrides):
  """A thread inside a slow `next` of the local iterator (a worker that takes its time) is
  woken by closing the local iterator, so close returns and leaves no thread; set_state
  stops a thread that waits on a full queue and starts again from the new position."""
  gate = threading.Event()
  data, host = _data_iterator(overrides, 1, gate=gate)
  data.start_prefetch()
  deadline = time.monotonic() + 30
  while not host.threads and time.monotonic() < deadline:
    time.sleep(0.01)
  assert host.threads == ["device-prefetch"] and host.count == 0
  closing = time.monotonic()
  data.close()
  # Not a speed figure: close must not wait out JOIN_TIMEOUT_S for a thread it can wake.
  assert time.monotonic() - closing < DataIterator.JOIN_TIMEOUT_S / 2
  assert _placing_threads() == [] and host.closed
  data, host = _data_iterator(overrides, 1)
  try:
    next(data)
    while host.count < 3 and time.monotonic() < deadline:  # one queued, one in hand
      time.sleep(0.01)
    data.set_state({"count": 1})
    assert _placing_threads() == [] and data.get_state() == {"count": 1}
  finally:
    data.close()


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
      from maxtext_netdata.input_pipeline import create_data_iterator, interface
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
