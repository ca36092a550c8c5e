"""The compiled batch kernel (input_pipeline/batch_kernel.py): compiled once, then loaded."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from maxtext_netdata.input_pipeline import epoch_plan, rng
from maxtext_netdata.input_pipeline.sequences import BatchRows
from tests.helpers import pipeline

_FIRST_BATCH = """
import hashlib, json, sys
from maxtext_netdata.data.store.store import PreparedStore
from maxtext_netdata.input_pipeline import batch_kernel, batch_kernel_loading
from maxtext_netdata.input_pipeline.sequences import BatchBuilder
from maxtext_netdata.kernels import warmup
b = BatchBuilder(PreparedStore(sys.argv[1]), seq_len=256, global_batch_size=4, seed=0,
  packing=True, shuffle=True, mode_weights=(0.4, 0.3, 0.3), field_order="random", num_epoch=-1)
if sys.argv[2] == "after-load":
  warmup.wait("batch kernel")
batch = b.build_shifted(b.gather(0, 0, 4))
digest = hashlib.sha256(b"".join(a.tobytes() for a in batch.values())).hexdigest()
python_batches = batch_kernel_loading._python_batches[0]
warmup.wait("batch kernel")
stats = batch_kernel.fill_batch.stats
print(json.dumps({"digest": digest, "python_batches": python_batches,
  "hits": sum(stats.cache_hits.values()), "misses": sum(stats.cache_misses.values())}))
"""


@pytest.mark.slow
def test_a_new_process_loads_the_kernel_from_the_disk_cache(tmp_path):
  """The first process ever compiles and stores the kernel on its load thread, its first
  batch built meanwhile by the kernel's Python code; every later one (a spawned Grain worker
  included) loads the kernel from the on-disk cache instead of compiling, and its batch from
  the machine code is the same."""
  store = pipeline.write_store(str(tmp_path / "train"), probes=20)
  env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba_cache")}

  def first_batch(when: str) -> dict:
    result = subprocess.run(
      [sys.executable, "-c", _FIRST_BATCH, store.path, when],
      capture_output=True,
      text=True,
      env=env,
      check=True,
      timeout=300,
    )
    return json.loads(result.stdout)

  first = first_batch("at-once")
  assert first["misses"] == 1 and first["hits"] == 0, first
  assert first["python_batches"] == 1, "the first batch waited for the compile"
  assert os.listdir(tmp_path / "numba_cache"), "the compiled kernel is stored on disk"
  later = first_batch("after-load")
  assert later["misses"] == 0 and later["hits"] == 1, later
  assert later["python_batches"] == 0 and later["digest"] == first["digest"]


def test_the_kernel_refuses_a_context_counter_past_its_bits(tmp_path):
  """A row with more contexts than 12 bits count would reuse draws of its first contexts:
  the kernel raises instead (BatchBuilder refuses such sequence lengths before)."""
  store = pipeline.write_store(str(tmp_path / "train"), probes=20)
  b = pipeline.builder(
    store,
    seq_len=1024,
    global_batch_size=1,
    packing=False,
    mode_weights=(0.0, 0.0, 1.0),
    field_order="fixed",
    num_epoch=-1,
  )
  contexts = rng.COUNTER_LIMIT + 1
  ipv4 = int(np.flatnonzero(np.asarray(store.probe_version) == 4)[0])
  start = int(store.probe_offsets[ipv4])
  num_probes = store.num_probes
  plan = epoch_plan.EpochPlan(  # one short plan row of `contexts` one-row contexts
    long_first=np.zeros(num_probes + 1, dtype=np.int64),
    long_start=np.zeros(num_probes, dtype=np.int64),
    stride=np.ones(num_probes, dtype=np.int64),
    probe_end=np.asarray(store.probe_offsets[1:], dtype=np.int64),
    short_offsets=np.array([0, contexts]),
    short_probe=np.full(contexts, ipv4),
    short_start=np.full(contexts, start),
    short_end=np.full(contexts, start + 1),
    order_keys=np.zeros(0, dtype=np.uint64),
    short_position=np.array([0]),
    short_by_position=np.array([0]),
  )
  rows = BatchRows(epoch=0, plan=plan, positions=np.array([0]))
  b.seq_len = 24 * contexts  # room for every context: past the builder's own check
  with pytest.raises(ValueError, match="counter past its limit"):
    b.build(rows)
  # One context fewer: every counter fits, the row is built.
  fits = dataclasses.replace(plan, short_offsets=np.array([0, contexts - 1]))
  batch = b.build(BatchRows(epoch=0, plan=fits, positions=np.array([0])))
  assert batch["inputs_segmentation"].max() == contexts - 1


def test_a_corrupted_field_order_in_the_store_is_a_data_error(tmp_path):
  """The kernel indexes its field-order table with bytes read from disk: one past the table
  is a one-line DataError naming the store, never a read past the table."""
  from maxtext_netdata.errors import DataError

  store = pipeline.write_store(str(tmp_path / "train"), probes=20)
  path = os.path.join(store.path, "hashed_order.npy")
  orders = np.load(path)
  orders[:] = 200
  np.save(path, orders)
  b = pipeline.builder(store, global_batch_size=2, field_order="hashed", num_epoch=-1)
  with pytest.raises(DataError, match=f"{store.path}: .*hashed field order"):
    b.build_shifted(b.gather(0, 0, 2))


def test_a_destination_index_past_the_table_is_a_data_error(tmp_path):
  """The kernel reads each destination through the split's table with an index read from
  disk: one past the table is a one-line DataError naming the store, never a read past it."""
  from maxtext_netdata.errors import DataError

  store = pipeline.write_store(str(tmp_path / "train"), probes=20)
  path = os.path.join(store.path, "dst_index.npy")
  index = np.load(path)
  index[:] = len(store.dst_table)
  np.save(path, index)
  b = pipeline.builder(store, global_batch_size=2, num_epoch=-1)
  with pytest.raises(DataError, match=f"{store.path}: .*destination index .* past its table"):
    b.build_shifted(b.gather(0, 0, 2))


def test_outputs_are_aligned_for_jax_to_use_them_in_place(tmp_path):
  """XLA's CPU client aliases a numpy array instead of copying it only when its data starts
  on 64 bytes; numpy alone gives 16. Every array the kernel or ShiftData writes is aligned,
  and a global array made from a batch shares its memory."""
  import jax

  from maxtext_netdata.input_pipeline import interface, transforms

  store = pipeline.write_store(str(tmp_path / "train"), probes=20)
  b = pipeline.builder(store, global_batch_size=3, num_epoch=-1)
  for step in range(8):  # several allocations: numpy's own alignment varies between them
    rows = b.gather(step, 0, 3)
    for batch in (b.build_shifted(rows), transforms.shift_data(b.build(rows))):
      assert all(a.ctypes.data % 64 == 0 and a.flags.c_contiguous for a in batch.values())
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  global_batch = interface.to_global(batch, sharding, 3)
  if jax.devices()[0].platform == "cpu":
    for key, array in global_batch.items():
      assert array.addressable_data(0).unsafe_buffer_pointer() == batch[key].ctypes.data, key


_BACKGROUND = """
import sys, threading
from maxtext_netdata.data.store.store import PreparedStore
from maxtext_netdata.input_pipeline import batch_kernel, batch_kernel_loading
from maxtext_netdata.input_pipeline.sequences import BatchBuilder
assert "numba.np.arraymath" not in sys.modules  # importing the kernel sets up nothing yet
b = BatchBuilder(PreparedStore(sys.argv[1]), seq_len=256, global_batch_size=4, seed=0,
  packing=True, shuffle=True, mode_weights=(0.4, 0.3, 0.3), field_order="random", num_epoch=-1)
[thread] = [t for t in threading.enumerate() if t.name == "batch-kernel-load"]
thread.join()
# numba's compiler state and the kernel's variant are ready before any batch is asked for.
print("numba.np.arraymath" in sys.modules, len(batch_kernel.fill_batch.overloads))
b.build(b.gather(0, 0, 4))
print(len(batch_kernel.fill_batch.overloads))  # the batches use that variant
"""


def test_a_builder_sets_up_the_kernel_s_compiler_state_on_a_thread(tmp_path):
  store = pipeline.write_store(str(tmp_path / "train"), probes=20)
  result = subprocess.run(
    [sys.executable, "-c", _BACKGROUND, store.path],
    capture_output=True,
    text=True,
    check=True,
    timeout=300,
  )
  assert result.stdout.split() == ["True", "1", "1"]
