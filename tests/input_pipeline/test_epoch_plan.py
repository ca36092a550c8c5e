"""The epoch plan and the counter-based randomness (input_pipeline/contexts.py)."""

from __future__ import annotations

import numpy as np
import pipeline_helpers
import pytest

from maxtext_netdata.input_pipeline import contexts

WEIGHTS = (0.4, 0.3, 0.3)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
  return pipeline_helpers.write_store(str(tmp_path_factory.mktemp("store") / "train"))


@pytest.fixture(scope="module")
def stats(store):
  return contexts.probe_stats(store, WEIGHTS)


def test_random_bits_are_a_function_of_key_and_counters():
  key = contexts.stream_key(1, 2, contexts.CONTEXT)
  rows = np.arange(10_000)
  a = contexts.random_bits(key, rows, 3, 4)
  assert (a == contexts.random_bits(key, rows, 3, 4)).all()
  assert (a != contexts.random_bits(key, rows, 3, 5)).all()
  assert (a != contexts.random_bits(contexts.stream_key(1, 3, contexts.CONTEXT), rows, 3, 4)).all()
  fields = [contexts.fraction(a, field) for field in range(3)]
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
  key = contexts.stream_key(0, 0, contexts.JITTER)
  long_probe, long_start, long_end, short_probe, short_start, short_end = contexts.pieces(
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


def test_plan_is_deterministic_and_jittered_per_epoch(stats):
  kwargs = dict(seq_len=256, seed=7, packing=True, shuffle=True)
  a = contexts.plan_epoch(stats, epoch=0, **kwargs)
  b = contexts.plan_epoch(stats, epoch=0, **kwargs)
  c = contexts.plan_epoch(stats, epoch=1, **kwargs)
  for field in ("unit_offsets", "ctx_probe", "ctx_start", "ctx_end", "order"):
    assert (getattr(a, field) == getattr(b, field)).all()
  assert set(a.ctx_start.tolist()) != set(c.ctx_start.tolist())
  assert sorted(a.order.tolist()) == list(range(a.num_rows))


def test_packing_groups_short_pieces_within_the_budget(stats):
  seq_len = 256
  plan = contexts.plan_epoch(stats, seq_len=seq_len, seed=0, epoch=0, packing=True, shuffle=True)
  sizes = np.diff(plan.unit_offsets)
  assert sizes.max() > 1, "short pieces share rows"
  estimate = (plan.ctx_end - plan.ctx_start) * stats.mean_length[plan.ctx_probe]
  unit_of_ctx = np.repeat(np.arange(plan.num_rows), sizes)
  multi = sizes[unit_of_ctx] > 1
  per_unit = np.bincount(unit_of_ctx[multi], weights=estimate[multi], minlength=plan.num_rows)
  assert per_unit.max() <= seq_len
  unpacked = contexts.plan_epoch(
    stats, seq_len=seq_len, seed=0, epoch=0, packing=False, shuffle=True
  )
  assert (np.diff(unpacked.unit_offsets) == 1).all()
  assert unpacked.num_rows > plan.num_rows


def test_without_shuffling_rows_follow_the_store(stats):
  plan = contexts.plan_epoch(stats, seq_len=256, seed=0, epoch=0, packing=True, shuffle=False)
  first_row = plan.ctx_start[plan.unit_offsets[:-1]][plan.order]
  assert (np.diff(first_row) >= 0).all()
  shuffled = contexts.plan_epoch(stats, seq_len=256, seed=0, epoch=0, packing=True, shuffle=True)
  assert (np.diff(shuffled.ctx_start[shuffled.unit_offsets[:-1]][shuffled.order]) < 0).any()
