"""The epoch plan (input_pipeline/epoch_plan.py) and its randomness (input_pipeline/rng.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

from maxtext_netdata.input_pipeline import epoch_plan, plan_order, rng
from tests.helpers import pipeline

WEIGHTS = (0.4, 0.3, 0.3)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
  return pipeline.write_store(str(tmp_path_factory.mktemp("store") / "train"))


@pytest.fixture(scope="module")
def stats(store):
  return epoch_plan.probe_stats(store, WEIGHTS)


def _splitmix64(x: int) -> int:
  """splitmix64's finalizer on Python ints (Steele, Lea, Flood 2014), masked to 64 bits."""
  mask = (1 << 64) - 1
  z = (x + 0x9E3779B97F4A7C15) & mask
  z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
  z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
  return z ^ (z >> 31)


def test_random_bits_are_splitmix64_of_the_packed_counters():
  """Against a plain-integer splitmix64: key = three chained rounds over seed, epoch, purpose;
  draw = one round over (row << 24 | context << 12 | index) ^ key."""
  key = 0
  for part in (1, 2, rng.CONTEXT):
    key = _splitmix64(key ^ part)
  assert int(rng.stream_key(1, 2, rng.CONTEXT)[0]) == key
  rows = np.array([0, 1, 77, 2**40 - 1])
  got = rng.random_bits(rng.stream_key(1, 2, rng.CONTEXT), rows, 3, 4095)
  expected = [_splitmix64(((r << 24) | (3 << 12) | 4095) ^ key) for r in rows.tolist()]
  assert got.tolist() == expected


def test_random_bits_refuse_counters_that_would_collide():
  """Packed in 12 bits, measurement 4096 of context 0 would be measurement 0 of context 1."""
  key = rng.stream_key(0, 0, rng.MEASUREMENT)
  with pytest.raises(ValueError, match="measurement counter outside"):
    rng.random_bits(key, 5, 0, np.arange(4097))
  with pytest.raises(ValueError, match="context counter outside"):
    rng.random_bits(key, 5, 4096, 0)
  with pytest.raises(ValueError, match="row counter outside"):
    rng.random_bits(key, 2**40, 0, 0)
  row, context, index = (
    g.ravel() for g in np.meshgrid([0, 1, 2**40 - 1], [0, 1, 4095], [0, 1, 4095])
  )
  corners = rng.random_bits(key, row, context, index)
  assert len(set(corners.tolist())) == corners.size == 27


def test_random_bits_are_uniform_and_independent():
  key = rng.stream_key(1, 2, rng.CONTEXT)
  rows = np.arange(10_000)
  a = rng.random_bits(key, rows, 3, 4)
  assert (a != rng.random_bits(key, rows, 3, 5)).all()
  assert (a != rng.random_bits(rng.stream_key(1, 3, rng.CONTEXT), rows, 3, 4)).all()
  fields = [rng.fraction(a, field) for field in range(3)]
  for u in fields:
    assert 0 <= u.min() and u.max() < 1
    # 10k uniforms: mean 0.5 +- 0.003 (sd), deciles each 10% +- 0.3%.
    assert abs(u.mean() - 0.5) < 0.015
    assert (abs(np.histogram(u, 10, (0, 1))[0] / len(u) - 0.1) < 0.015).all()
  assert abs(np.corrcoef(fields[0], fields[1])[0, 1]) < 0.05, "fields are independent"


def test_probe_stats_match_the_token_lengths(store, stats):
  assert stats.num_probes == store.num_probes
  v4 = np.asarray(store.probe_version) == 4
  # No timestamp: 14 (IPv4) / 38 (IPv6) tokens, failed 2 fewer; timestamps add 2 to 5 tokens
  # to about 55% of measurements.
  assert (stats.mean_length[v4] > 12).all() and (stats.mean_length[v4] < 17).all()
  assert (stats.mean_length[~v4] > 36).all() and (stats.mean_length[~v4] < 41).all()


def _all_contexts(plan):
  """Every plan row's contexts, and the row of each context."""
  offsets, probe, start, end = plan.contexts(np.arange(plan.num_rows))
  return np.repeat(np.arange(plan.num_rows), np.diff(offsets)), probe, start, end, offsets


def test_pieces_partition_every_probe(store, stats):
  """Long plan rows read from their piece's start to the probe's end; their pieces (a
  stride each) and the short contexts cover every store row exactly once."""
  seq_len = 256
  plan = epoch_plan.plan_epoch(stats, seq_len=seq_len, seed=0, epoch=0, packing=True, shuffle=True)
  row, probe, start, end, _ = _all_contexts(plan)
  offsets = stats.offsets
  assert ((offsets[probe] <= start) & (start < end) & (end <= offsets[probe + 1])).all()
  stride = np.floor(seq_len / stats.mean_length).astype(np.int64)
  long = row < plan.num_long
  assert (end[long] == offsets[probe[long] + 1]).all(), "long contexts read to the probe end"
  assert ((end[~long] - start[~long]) < stride[probe[~long]]).all()
  piece_end = np.where(long, start + stride[probe], end)
  covered = np.zeros(store.num_rows, dtype=np.int64)
  for a, b in zip(start, piece_end, strict=True):
    covered[a:b] += 1
  assert (covered == 1).all(), "every row is in exactly one piece"


_PLAN_DIGEST = """
import dataclasses, hashlib, sys
import numpy as np
from maxtext_netdata.data.store import store as store_lib
from maxtext_netdata.input_pipeline import epoch_plan
stats = epoch_plan.probe_stats(store_lib.PreparedStore(sys.argv[1]), (0.4, 0.3, 0.3))
stats = dataclasses.replace(stats, plans_dir=None)  # computed here, not read from disk
plan = epoch_plan.plan_epoch(stats, seq_len=256, seed=7, epoch=0, packing=True, shuffle=True)
arrays = (*plan.contexts(np.arange(plan.num_rows)), plan.rows_at(np.arange(plan.num_rows)))
print(hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest())
"""


def test_plan_is_the_same_in_another_process_and_jittered_per_epoch(store, stats):
  """A fresh process (other hash seed) plans the same epoch: the plan depends on nothing but
  the store and the parameters."""
  result = subprocess.run(
    [sys.executable, "-c", _PLAN_DIGEST, store.path],
    capture_output=True,
    text=True,
    env={**os.environ, "PYTHONHASHSEED": "4321"},
    check=True,
    timeout=120,
  )
  kwargs = dict(seq_len=256, seed=7, packing=True, shuffle=True)
  computed = dataclasses.replace(stats, plans_dir=None)
  a = epoch_plan.plan_epoch(computed, epoch=0, **kwargs)
  c = epoch_plan.plan_epoch(computed, epoch=1, **kwargs)
  every = np.arange(a.num_rows)
  arrays = (*a.contexts(every), a.rows_at(every))
  here = hashlib.sha256(b"".join(x.tobytes() for x in arrays)).hexdigest()
  assert result.stdout.strip() == here
  assert set(a.contexts(every)[2].tolist()) != set(c.contexts(np.arange(c.num_rows))[2].tolist())
  assert sorted(a.rows_at(every).tolist()) == every.tolist()


def test_packing_groups_short_pieces_within_the_budget(stats):
  seq_len = 256
  plan = epoch_plan.plan_epoch(stats, seq_len=seq_len, seed=0, epoch=0, packing=True, shuffle=True)
  row, probe, start, end, offsets = _all_contexts(plan)
  sizes = np.diff(offsets)
  assert sizes.max() > 1, "short pieces share rows"
  estimate = (end - start) * stats.mean_length[probe]
  multi = sizes[row] > 1
  per_row = np.bincount(row[multi], weights=estimate[multi], minlength=plan.num_rows)
  assert per_row.max() <= seq_len
  unpacked = epoch_plan.plan_epoch(
    stats, seq_len=seq_len, seed=0, epoch=0, packing=False, shuffle=True
  )
  assert (np.diff(_all_contexts(unpacked)[4]) == 1).all()
  assert unpacked.num_rows > plan.num_rows


def _first_rows(plan):
  row, _, start, _, offsets = _all_contexts(plan)
  return start[offsets[:-1]][plan.rows_at(np.arange(plan.num_rows))]


@pytest.mark.parametrize("packing", [True, False])
def test_without_shuffling_rows_follow_the_store(stats, packing):
  """Unshuffled, the stream is the plan rows in order of their first store row (the short
  ones placed among the long ones); shuffled, it is not."""
  kwargs = dict(seq_len=256, seed=0, epoch=0, packing=packing)
  plan = epoch_plan.plan_epoch(stats, shuffle=False, **kwargs)
  first = _first_rows(plan)
  assert (np.diff(first) > 0).all()
  assert sorted(plan.rows_at(np.arange(plan.num_rows)).tolist()) == list(range(plan.num_rows))
  assert (np.diff(_first_rows(epoch_plan.plan_epoch(stats, shuffle=True, **kwargs))) < 0).any()


def _feistel_reference(keys: list[int], position: int, num_rows: int) -> int:
  """The shuffled order on Python ints, from plan_order's description: Feistel rounds over
  words of the least even bit count (at least 2) that holds the rows, right half hashed by
  splitmix64 with the round key; values past the rows are mapped again."""
  bits = 2
  while (1 << bits) < num_rows:
    bits += 2
  half, mask = bits // 2, (1 << (bits // 2)) - 1
  value = position
  while True:
    left, right = value >> half, value & mask
    for key in keys:
      left, right = right, left ^ (_splitmix64(right ^ key) & mask)
    value = (left << half) | right
    if value < num_rows:
      return value


@pytest.mark.parametrize("num_rows", [1, 2, 3, 5, 16, 17, 1000, 4097])
def test_the_shuffled_order_is_a_keyed_permutation(num_rows):
  """Every position maps to a plan row, each row once, as the plain-integer Feistel network
  says; another epoch's key gives another order."""
  keys = plan_order.order_keys(rng.stream_key(3, 1, rng.SHUFFLE))
  none = np.zeros(0, dtype=np.int64)
  out = np.empty(num_rows, dtype=np.int64)
  plan_order.rows_at(keys, none, none, num_rows, num_rows, np.arange(num_rows), out)
  assert sorted(out.tolist()) == list(range(num_rows))
  expected = [_feistel_reference(keys.tolist(), i, num_rows) for i in range(min(num_rows, 300))]
  assert out[:300].tolist() == expected
  for outside in (-1, num_rows, 1 << 40):
    with pytest.raises(ValueError, match="outside the epoch's plan rows"):
      plan_order.rows_at(keys, none, none, num_rows, num_rows, np.array([outside]), out)
  if num_rows >= 1000:
    other = np.empty(num_rows, dtype=np.int64)
    keys = plan_order.order_keys(rng.stream_key(3, 2, rng.SHUFFLE))
    plan_order.rows_at(keys, none, none, num_rows, num_rows, np.arange(num_rows), other)
    assert (other != out).mean() > 0.99


def test_the_shuffled_order_looks_random():
  """Neighbouring positions land far apart and position says nothing of the row: for 200k
  rows, |correlation| under 0.01 (sd ~0.002), neighbours in the stream adjacent rows as
  often as chance (~1e-5), each decile of positions spread over every decile of rows."""
  num_rows = 200_000
  keys = plan_order.order_keys(rng.stream_key(0, 0, rng.SHUFFLE))
  none = np.zeros(0, dtype=np.int64)
  rows = np.empty(num_rows, dtype=np.int64)
  plan_order.rows_at(keys, none, none, num_rows, num_rows, np.arange(num_rows), rows)
  assert abs(np.corrcoef(np.arange(num_rows), rows)[0, 1]) < 0.01
  assert (np.abs(np.diff(rows)) == 1).mean() < 1e-3
  table = np.histogram2d(np.arange(num_rows), rows, bins=10)[0] / (num_rows / 100)
  assert (abs(table - 1) < 0.1).all(), "2,000 per cell, sd ~45"


def test_a_plan_takes_memory_of_its_probes_not_of_its_rows():
  """RIPE Atlas's month: ~35 billion measurements. A plan of a billion store rows (1,000
  probes) holds a few arrays per probe, is made at once, and finds the last rows' contexts."""
  probes, per_probe = 1000, 1_000_000
  offsets = np.arange(probes + 1, dtype=np.int64) * per_probe
  stats = epoch_plan.ProbeStats(offsets=offsets, mean_length=np.full(probes, 30.0))
  plan = epoch_plan.plan_epoch(stats, seq_len=1024, seed=0, epoch=0, packing=True, shuffle=True)
  assert plan.num_rows > 29_000_000
  size = sum(getattr(plan, f.name).nbytes for f in dataclasses.fields(plan))
  assert size < 200 * probes, size
  last = plan.rows_at(np.arange(plan.num_rows - 1000, plan.num_rows))
  offsets_, probe, start, end = plan.contexts(last)
  assert ((offsets[probe] <= start) & (start < end) & (end <= offsets[probe + 1])).all()


def test_a_plan_has_one_kernel_type_cached_or_computed(store, stats, tmp_path):
  """The batch kernel is compiled per argument type (a first compile takes ~10 s), and numba
  tells read-only arrays from writable ones: a plan mapped from its cache and a plan computed
  where the cache cannot be written (a read-only store) must pass the same types."""
  numba = pytest.importorskip("numba")
  kwargs = dict(seq_len=256, seed=7, epoch=0, packing=True, shuffle=True)
  cached = epoch_plan.plan_epoch(
    dataclasses.replace(stats, plans_dir=str(tmp_path / "plans")), **kwargs
  )
  blocked = tmp_path / "not_a_folder"
  blocked.write_text("")  # cached_arrays cannot make a folder here: computed, not kept
  computed = epoch_plan.plan_epoch(
    dataclasses.replace(stats, plans_dir=str(blocked / "plans")), **kwargs
  )
  in_memory = epoch_plan.plan_epoch(dataclasses.replace(stats, plans_dir=None), **kwargs)
  assert os.listdir(tmp_path / "plans")
  types = [numba.typeof(plan.kernel_plan) for plan in (cached, computed, in_memory)]
  assert types[0] == types[1] == types[2], types
  for a, b in zip(cached.kernel_plan, computed.kernel_plan, strict=True):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
