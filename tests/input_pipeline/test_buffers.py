"""Reused batch memory (input_pipeline/buffers.py): a batch anyone still refers to, as numpy
arrays, views of them or jax.Arrays using them in place, is never written over."""

from __future__ import annotations

import gc
import pickle
import time

import jax
import numpy as np
import pytest

from maxtext_netdata.input_pipeline import buffers, interface, network_grain
from maxtext_netdata.input_pipeline.sequences import BatchBuilder
from maxtext_netdata.input_pipeline.transforms import ShiftData
from tests.helpers import pipeline


@pytest.fixture(scope="module")
def builder(tmp_path_factory):
  store = pipeline.write_store(str(tmp_path_factory.mktemp("buffers") / "train"), probes=20)
  return BatchBuilder(
    store, seq_len=256, global_batch_size=4, seed=0, packing=True, shuffle=True,
    mode_weights=(0.4, 0.3, 0.3), field_order="random", num_epoch=-1,
  )  # fmt: skip


def _sharding():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))


def _released(pool: buffers.OutputPool, addresses: set[int], seconds: float = 5.0) -> int:
  """The address of a pooled batch's first array once one of `addresses` comes back (XLA
  drops its reference to a host array on its own thread, shortly after the jax.Array goes)."""
  deadline = time.monotonic() + seconds
  while True:
    gc.collect()
    first = pool.take((4, 256), 6)[0].ctypes.data
    if first in addresses or time.monotonic() > deadline:
      return first
    time.sleep(0.01)


def test_held_batches_are_not_written_over_and_released_ones_are_reused(builder):
  sharding = _sharding()
  held_numpy = builder.build_shifted(builder.gather(0, 0, 4))
  held_view = builder.build_shifted(builder.gather(1, 0, 4))["targets"][1:3]
  host = builder.build_shifted(builder.gather(2, 0, 4))
  held_jax = interface.to_global(host, sharding, 4)
  # The copies of what each held batch must keep showing.
  want_numpy = {key: value.copy() for key, value in held_numpy.items()}
  want_view = held_view.copy()
  want_jax = {key: value.copy() for key, value in host.items()}
  held = {held_numpy["inputs"].ctypes.data, host["inputs"].ctypes.data}
  del host
  addresses = set()
  for step in range(3, 3 + 2 * buffers.CAPACITY):
    batch = builder.build_shifted(builder.gather(step, 0, 4))
    addresses.add(batch["inputs"].ctypes.data)
    del batch
  assert all(np.array_equal(held_numpy[k], want_numpy[k]) for k in want_numpy)
  assert np.array_equal(held_view, want_view)
  assert all(np.array_equal(np.asarray(held_jax[k]), want_jax[k]) for k in want_jax)
  # A released batch comes back: each batch above took the memory of the one before.
  assert len(addresses) == 1
  # Once the held batches are dropped, their memory is used again.
  del held_numpy, held_view, held_jax
  assert _released(builder._buffers, held) in held


def test_shift_data_keeps_targets_a_consumer_holds(builder):
  shift = ShiftData()
  inputs = [builder.build(builder.gather(step, 0, 4)) for step in range(12)]
  shifted = [shift.map(batch) for batch in inputs]
  expected = [builder.build_shifted(builder.gather(step, 0, 4)) for step in range(12)]
  for got, want in zip(shifted, expected, strict=True):
    assert all(np.array_equal(got[key], want[key]) for key in want)


def test_a_pool_pickles_empty_and_a_worker_builder_gets_its_own(builder):
  builder.build(builder.gather(0, 0, 4))
  copy = pickle.loads(pickle.dumps(network_grain.BuildBatch(builder, 0, 4)))
  assert copy.builder._buffers is not builder._buffers
  assert copy.builder._buffers._blocks == []
