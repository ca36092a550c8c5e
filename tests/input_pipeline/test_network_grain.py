"""The Grain graph of the network_grain dataset (input_pipeline/network_grain.py)."""

from __future__ import annotations

import pipeline_helpers
import pytest

from maxtext_netdata import config as config_lib
from maxtext_netdata.format import tokens as tk
from maxtext_netdata.input_pipeline import network_grain
from maxtext_netdata.input_pipeline.batches_cli import digest
from maxtext_netdata.input_pipeline.sequences import BatchBuilder

BATCH = 8


@pytest.fixture(scope="module")
def store(tmp_path_factory):
  return pipeline_helpers.write_store(
    str(tmp_path_factory.mktemp("store") / "train"), probes=40, mean_rows=200
  )


def make(store, *overrides, num_epoch=1):
  config = config_lib.load(
    None,
    [
      f"global_batch_size_to_load={BATCH}",
      "max_target_length=256",
      f"num_epoch={num_epoch}",
      *overrides,
    ],
  )
  builder = BatchBuilder.from_config(config, store, BATCH)
  return config, builder


def digests(iterator, count):
  return [digest(next(iterator)) for _ in range(count)]


def test_batches_are_shifted_host_batches(store):
  config, builder = make(store, "grain_worker_count=0")
  iterator = network_grain.make_iterator(config, builder, 0, BATCH, builder.num_steps)
  batch = next(iterator)
  iterator.close()
  assert (batch["targets"][:, :-1] == batch["inputs"][:, 1:]).all()
  assert (batch["targets"][:, -1] == tk.PAD).all()
  assert batch["inputs"].shape == (BATCH, 256)


def test_iterator_ends_after_num_epoch(store):
  config, builder = make(store, "grain_worker_count=0", num_epoch=2)
  iterator = network_grain.make_iterator(config, builder, 0, BATCH, builder.num_steps)
  count = sum(1 for _ in iterator)
  assert count == 2 * builder.steps_per_epoch == builder.num_steps


def test_forever_has_no_end(store):
  config, builder = make(store, "grain_worker_count=0", num_epoch=-1)
  assert builder.num_steps is None
  iterator = network_grain.make_iterator(config, builder, 0, BATCH, None)
  iterator.set_state({"next_index": 5 * builder.steps_per_epoch})
  assert next(iterator)["inputs"].shape == (BATCH, 256)
  iterator.close()


def test_in_process_resume_from_the_middle(store):
  config, builder = make(store, "grain_worker_count=0", "grain_num_threads=2")
  iterator = network_grain.make_iterator(config, builder, 0, BATCH, builder.num_steps)
  first = digests(iterator, 3)
  state = iterator.get_state()
  rest = digests(iterator, 4)
  iterator.close()
  restored = network_grain.make_iterator(config, builder, 0, BATCH, builder.num_steps)
  restored.set_state(state)
  assert digests(restored, 4) == rest
  restored.close()
  started = network_grain.make_iterator(config, builder, 0, BATCH, builder.num_steps, start=3)
  assert digests(started, 4) == rest
  started.close()
  assert len(set(first + rest)) == 7


@pytest.mark.slow
def test_same_batches_for_any_worker_count_and_after_restore(store):
  """Workers 0, 1 and 2 give identical batches; a worker iterator resumes from its state."""
  results = {}
  for workers in (0, 1, 2):
    config, builder = make(store, f"grain_worker_count={workers}")
    iterator = network_grain.make_iterator(config, builder, 0, BATCH, builder.num_steps)
    head = digests(iterator, 3)
    state = iterator.get_state()
    tail = digests(iterator, 3)
    iterator.close()
    results[workers] = head + tail
    if workers == 2:
      restored = network_grain.make_iterator(config, builder, 0, BATCH, builder.num_steps)
      restored.set_state(state)
      assert digests(restored, 3) == tail
      restored.close()
  assert results[0] == results[1] == results[2]


def test_auto_worker_count_respects_cores_and_memory(store, monkeypatch):
  monkeypatch.setattr(network_grain.os, "cpu_count", lambda: 8)
  config, _ = make(store, "grain_worker_count=-1", "grain_ram_budget_mb=100000")
  assert network_grain.worker_count(config, host_batch_bytes=2**20) == 8
  config, _ = make(store, "grain_worker_count=-1", "grain_ram_budget_mb=700")
  assert network_grain.worker_count(config, host_batch_bytes=2**20) == 2
  config, _ = make(store, "grain_worker_count=-1", "grain_ram_budget_mb=1")
  assert network_grain.worker_count(config, host_batch_bytes=2**20) == 1
  config, _ = make(store, "grain_worker_count=3")
  assert network_grain.worker_count(config, host_batch_bytes=2**20) == 3
