"""The epoch plan (input_pipeline/epoch_plan.py) and its randomness (input_pipeline/rng.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

from maxtext_netdata.input_pipeline import epoch_plan, rng
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


def test_pieces_partition_every_probe(store, stats):
  seq_len = 256
  key = rng.stream_key(0, 0, rng.JITTER)
  long_probe, long_start, long_end, short_probe, short_start, short_end = epoch_plan.pieces(
    stats, seq_len, key
  )
  covered = np.zeros(store.num_rows, dtype=np.int64)
  for start, end in zip(
    np.concatenate([long_start, short_start]), np.concatenate([long_end, short_end]), strict=True
  ):
    covered[start:end] += 1
  assert (covered == 1).all(), "every row is in exactly one piece"
  offsets = stats.offsets
  for probe, start, end in zip(
    np.concatenate([long_probe, short_probe]),
    np.concatenate([long_start, short_start]),
    np.concatenate([long_end, short_end]),
    strict=True,
  ):
    assert offsets[probe] <= start < end <= offsets[probe + 1]
  stride = np.floor(seq_len / stats.mean_length).astype(np.int64)
  assert ((long_end - long_start) == stride[long_probe]).all()
  assert ((short_end - short_start) < stride[short_probe]).all()


_PLAN_DIGEST = """
import dataclasses, hashlib, sys
from maxtext_netdata.data.store import store as store_lib
from maxtext_netdata.input_pipeline import epoch_plan
stats = epoch_plan.probe_stats(store_lib.PreparedStore(sys.argv[1]), (0.4, 0.3, 0.3))
stats = dataclasses.replace(stats, plans_dir=None)  # computed here, not read from disk
plan = epoch_plan.plan_epoch(stats, seq_len=256, seed=7, epoch=0, packing=True, shuffle=True)
print(hashlib.sha256(b"".join(getattr(plan, f).tobytes() for f in sys.argv[2:])).hexdigest())
"""
_PLAN_FIELDS = ("context_offsets", "context_probe", "context_start", "context_end", "order")


def test_plan_is_the_same_in_another_process_and_jittered_per_epoch(store, stats):
  """A fresh process (other hash seed) plans the same epoch: the plan depends on nothing but
  the store and the parameters."""
  result = subprocess.run(
    [sys.executable, "-c", _PLAN_DIGEST, store.path, *_PLAN_FIELDS],
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
  here = hashlib.sha256(b"".join(getattr(a, f).tobytes() for f in _PLAN_FIELDS)).hexdigest()
  assert result.stdout.strip() == here
  assert set(a.context_start.tolist()) != set(c.context_start.tolist())
  assert sorted(a.order.tolist()) == list(range(a.num_rows))


def test_packing_groups_short_pieces_within_the_budget(stats):
  seq_len = 256
  plan = epoch_plan.plan_epoch(stats, seq_len=seq_len, seed=0, epoch=0, packing=True, shuffle=True)
  sizes = np.diff(plan.context_offsets)
  assert sizes.max() > 1, "short pieces share rows"
  estimate = (plan.context_end - plan.context_start) * stats.mean_length[plan.context_probe]
  unit_of_ctx = np.repeat(np.arange(plan.num_rows), sizes)
  multi = sizes[unit_of_ctx] > 1
  per_unit = np.bincount(unit_of_ctx[multi], weights=estimate[multi], minlength=plan.num_rows)
  assert per_unit.max() <= seq_len
  unpacked = epoch_plan.plan_epoch(
    stats, seq_len=seq_len, seed=0, epoch=0, packing=False, shuffle=True
  )
  assert (np.diff(unpacked.context_offsets) == 1).all()
  assert unpacked.num_rows > plan.num_rows


def test_without_shuffling_rows_follow_the_store(stats):
  plan = epoch_plan.plan_epoch(stats, seq_len=256, seed=0, epoch=0, packing=True, shuffle=False)
  first_row = plan.context_start[plan.context_offsets[:-1]][plan.order]
  assert (np.diff(first_row) >= 0).all()
  shuffled = epoch_plan.plan_epoch(stats, seq_len=256, seed=0, epoch=0, packing=True, shuffle=True)
  assert (np.diff(shuffled.context_start[shuffled.context_offsets[:-1]][shuffled.order]) < 0).any()
