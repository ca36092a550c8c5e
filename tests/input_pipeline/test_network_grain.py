"""The Grain graph of the network_grain dataset (input_pipeline/network_grain.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
from absl import flags

from maxtext_netdata import config as config_lib
from maxtext_netdata.format import tokens as tk
from maxtext_netdata.input_pipeline import network_grain, plan_order, worker_blocks
from maxtext_netdata.input_pipeline.batches_cli import digest
from maxtext_netdata.input_pipeline.sequences import BatchBuilder
from tests.helpers import pipeline

BATCH = 8


@pytest.fixture(scope="module", autouse=True)
def absl_flags_parsed():
  """This module is an entry point: Grain's worker start reads absl flags."""
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
  return pipeline.write_store(
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


@pytest.mark.parametrize("threads", [0, 2])
def test_forever_has_no_end(store, threads):
  config, builder = make(
    store, "grain_worker_count=0", f"grain_num_threads={threads}", num_epoch=-1
  )
  assert builder.num_steps is None
  start = 5 * builder.steps_per_epoch
  iterator = network_grain.make_iterator(config, builder, 0, BATCH, None, start=start)
  assert next(iterator)["inputs"].shape == (BATCH, 256)
  iterator.close()


def test_without_read_threads_the_same_batches_come_without_grain(store):
  threaded, builder = make(store, "grain_worker_count=0", "grain_num_threads=2", num_epoch=2)
  direct, _ = make(store, "grain_worker_count=0", "grain_num_threads=0", num_epoch=2)
  steps = builder.num_steps
  grained = network_grain.make_iterator(threaded, builder, 0, BATCH, steps, start=3)
  plain = network_grain.make_iterator(direct, builder, 0, BATCH, steps, start=3)
  assert isinstance(plain, network_grain.SynchronousIterator)
  want = [digest(batch) for batch in grained]
  grained.close()
  assert [digest(batch) for batch in plain] == want and len(want) == steps - 3
  plain.close()


def positioned(config, builder, **kwargs):
  return network_grain.HostBatchIterator(config, builder, 0, BATCH, builder.num_steps, **kwargs)


def test_in_process_resume_from_the_middle(store):
  config, builder = make(store, "grain_worker_count=0", "grain_num_threads=2")
  iterator = positioned(config, builder)
  first = digests(iterator, 3)
  state = iterator.get_state()
  rest = digests(iterator, 4)
  iterator.close()
  assert state["format"] == network_grain.POSITION_FORMAT and state["step"] == 3
  restored = positioned(config, builder)
  restored.set_state(state)
  assert digests(restored, 4) == rest
  restored.close()
  started = network_grain.make_iterator(config, builder, 0, BATCH, builder.num_steps, start=3)
  assert digests(started, 4) == rest
  started.close()
  assert len(set(first + rest)) == 7


def _children() -> set[int]:
  """Child processes besides multiprocessing's resource tracker (it lives as long as we do)."""
  return {
    p.pid
    for p in psutil.Process().children(recursive=True)
    if "resource_tracker" not in " ".join(p.cmdline())
  }


@pytest.mark.slow
def test_position_resumes_under_any_worker_count(store):
  """Saved with 0 or 2 workers, resumed with 0, 1 or 2: the batches of an uninterrupted run."""
  config, builder = make(store, "grain_worker_count=0")
  whole = digests(positioned(config, builder), 6)
  before = _children()
  for saved_with in (0, 2):
    config, builder = make(store, f"grain_worker_count={saved_with}")
    saving = positioned(config, builder)
    assert digests(saving, 3) == whole[:3]
    state = saving.get_state()
    saving.close()
    for resumed_with in (0, 1, 2):
      config, builder = make(store, f"grain_worker_count={resumed_with}", "grain_num_threads=3")
      resumed = positioned(config, builder)
      resumed.set_state(state)
      assert digests(resumed, 3) == whole[3:], (saved_with, resumed_with)
      resumed.close()
  assert _children() <= before


def test_workers_start_only_after_the_position_is_set(store):
  config, builder = make(store, "grain_worker_count=1")
  before = _children()
  iterator = positioned(config, builder)
  iterator.set_state({**iterator.get_state(), "step": 2})
  iterator.start_prefetch()  # Grain 0.2.18 starts worker processes at the first batch
  assert _children() == before
  next(iterator)
  try:
    assert len(_children() - before) >= 1
  finally:
    iterator.close()
  iterator.close()  # closing twice is harmless
  psutil.wait_procs([psutil.Process(p) for p in _children() - before], timeout=30)
  assert _children() <= before


def test_position_of_other_data_is_a_one_line_error(store):
  config, builder = make(store, "grain_worker_count=0")
  state = positioned(config, builder).get_state()
  other_config, other_builder = make(store, "grain_worker_count=0", "data_shuffle_seed=9")
  with pytest.raises(network_grain.PositionError, match=r"^[^\n]*data_shuffle_seed 0 saved, 9 now"):
    positioned(other_config, other_builder).set_state(state)
  with pytest.raises(network_grain.PositionError, match="split 'train' saved, 'eval' now"):
    positioned(config, builder, split="eval").set_state(state)
  with pytest.raises(network_grain.PositionError, match="not a netdata-position-1"):
    positioned(config, builder).set_state({"next_index": 3})


@pytest.mark.parametrize(
  ("override", "message"),
  [
    ("packing=false", "packing True saved, False now"),
    ("network_field_order=fixed", "network_field_order 'random' saved, 'fixed' now"),
    ("network_mode_weights=[1, 0, 0]", "network_mode_weights [0.4, 0.3, 0.3] saved, [1.0, 0.0"),
    ("enable_data_shuffling=false", "enable_data_shuffling True saved, False now"),
  ],
)
def test_position_under_other_batch_settings_is_refused(store, override, message):
  """Each of these settings changes the batches after the position: a resume under another
  value would go on with a different stream, not the batches that come next."""
  config, builder = make(store, "grain_worker_count=0")
  state = positioned(config, builder).get_state()
  other_config, other_builder = make(store, "grain_worker_count=0", override)
  with pytest.raises(network_grain.PositionError, match=re.escape(message)):
    positioned(other_config, other_builder).set_state(state)
  # A position saved before these settings were recorded is checked on its identity alone.
  older = {
    key: value for key, value in state.items() if key not in positioned(config, builder).settings
  }
  positioned(other_config, other_builder).set_state(older)


def test_a_position_saved_under_the_former_shuffled_order_resumes_with_a_notice(store, capfd):
  """A position without `stream_order` was saved when a shuffled epoch's order was an argsort
  of its rows: it resumes at its step and says that the rest of the epoch comes in another
  order; unshuffled, the order is the same (store order) and nothing is said. A position of
  another stream order is refused."""
  config, builder = make(store, "grain_worker_count=0")
  state = positioned(config, builder).get_state()
  assert state["stream_order"] == plan_order.NAME
  older = {**state, "step": 3}
  del older["stream_order"]
  iterator = positioned(config, builder)
  iterator.set_state(older)
  assert iterator.step == 3
  assert "now shuffled by a keyed permutation (feistel-6)" in capfd.readouterr().err
  store_config, store_builder = make(store, "grain_worker_count=0", "enable_data_shuffling=false")
  unshuffled = positioned(store_config, store_builder).get_state()
  assert unshuffled["stream_order"] == "store"
  del unshuffled["stream_order"]
  positioned(store_config, store_builder).set_state(unshuffled)
  assert capfd.readouterr().err == ""
  with pytest.raises(network_grain.PositionError, match="stream_order 'feistel-4' saved"):
    positioned(config, builder).set_state({**state, "stream_order": "feistel-4"})


@pytest.mark.slow
def test_killed_worker_stops_the_iterator_with_a_clear_error(store):
  config, builder = make(store, "grain_worker_count=2", num_epoch=-1)
  iterator = network_grain.HostBatchIterator(config, builder, 0, BATCH, None)
  before = _children()
  next(iterator)
  workers = _children() - before
  # The workers go on filling their buffers: a batch in a block named after the iterator.
  deadline = time.monotonic() + 60
  while not (named := worker_blocks.left(iterator._blocks)) and time.monotonic() < deadline:
    time.sleep(0.01)
  os.kill(min(workers), signal.SIGKILL)
  start = time.monotonic()
  with pytest.raises(
    network_grain.WorkerError, match=r"worker process ended \(killed by SIGKILL\)"
  ):
    for _ in range(100_000):
      next(iterator)
  assert time.monotonic() - start < 60
  iterator.close()
  psutil.wait_procs([psutil.Process(p) for p in _children() - before], timeout=30)
  assert not workers & _children()
  # What the killed worker never handed over was unlinked: no block of the prefix is left.
  assert named, "the workers' buffered batches are in blocks named after the iterator"
  assert worker_blocks.left(iterator._blocks) == []


def test_workers_need_parsed_absl_flags_outside_our_entry_points(store):
  script = f"""
from maxtext_netdata import config as config_lib
from maxtext_netdata.data.store.store import PreparedStore
from maxtext_netdata.errors import UserError
from maxtext_netdata.input_pipeline import network_grain, worker_blocks
from maxtext_netdata.input_pipeline.sequences import BatchBuilder
config = config_lib.load(None, ["grain_worker_count=1", "max_target_length=256"])
builder = BatchBuilder.from_config(config, PreparedStore({store.path!r}), {BATCH})
try:
  network_grain.make_iterator(config, builder, 0, {BATCH}, None)
except UserError as e:
  print(e)
"""
  out = subprocess.run(
    [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
  ).stdout
  assert "grain_worker_count=1 needs absl flags parsed" in out


def test_auto_worker_count_respects_cores_and_memory(store, monkeypatch):
  monkeypatch.setattr(network_grain, "usable_cores", lambda: 8)
  config, _ = make(store, "grain_worker_count=-1", "grain_ram_budget_mb=100000")
  assert network_grain.worker_count(config, host_batch_bytes=2**20) == 8
  config, _ = make(store, "grain_worker_count=-1", "grain_ram_budget_mb=400")
  assert network_grain.worker_count(config, host_batch_bytes=2**20) == 2
  config, _ = make(store, "grain_worker_count=-1", "grain_ram_budget_mb=1")
  assert network_grain.worker_count(config, host_batch_bytes=2**20) == 1
  config, _ = make(store, "grain_worker_count=3")
  assert network_grain.worker_count(config, host_batch_bytes=2**20) == 3


def test_usable_cores_follow_the_cpu_affinity():
  script = "from maxtext_netdata.input_pipeline import network_grain as g; print(g.usable_cores())"
  pinned = subprocess.run(
    ["taskset", "-c", "0", sys.executable, "-c", script],
    capture_output=True,
    text=True,
    timeout=60,
    check=True,
  )
  assert pinned.stdout.strip() == "1"
  assert network_grain.usable_cores() == len(os.sched_getaffinity(0))
