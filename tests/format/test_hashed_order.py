"""The vectorized `hashed` field order against Python's own random.Random(seed).shuffle."""

import random

import numpy as np
import pytest

from maxtext_netdata.format import hashed_order, tokenizer

EDGE_SEEDS = [0, 1, 2, 19650218, 2**31, 2**32 - 1]


def _seeds(n, seed=0):
  rng = np.random.default_rng(seed)
  seeds = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
  seeds[: len(EDGE_SEEDS)] = EDGE_SEEDS
  return seeds


def _python_order(seed, has_ts):
  blocks = [0, 1, 2, 3] if has_ts else [0, 1, 2]
  random.Random(int(seed)).shuffle(blocks)
  if not has_ts:
    blocks.append(3)
  return [tuple(p) for p in tokenizer.PERMUTATIONS.tolist()].index(tuple(blocks))


def test_mersenne_twister_outputs_match_python():
  seeds = _seeds(3_000)
  words = hashed_order.mt_first_outputs(seeds, 30)
  assert words.shape == (3_000, 30) and words.dtype == np.uint32
  for seed, row in zip(seeds.tolist(), words.tolist(), strict=True):
    generator = random.Random(seed)
    assert row == [generator.getrandbits(32) for _ in range(30)]


@pytest.mark.parametrize("words", [24, 3])  # 3 outputs: most rows take the Python fallback
def test_orders_match_python_shuffle(monkeypatch, words):
  monkeypatch.setattr(hashed_order, "_WORDS", words)
  seeds = _seeds(4_000, seed=words)
  src = [f"10.0.{i // 256}.{i % 256}" for i in range(4_000)]
  pairs = hashed_order.hashed_order_pairs(src, ["192.0.2.1"] * 4_000, np.arange(4_000))
  expected_seeds = hashed_order._seeds(src, ["192.0.2.1"] * 4_000, np.arange(4_000))
  for i, seed in enumerate(expected_seeds.tolist()):
    assert pairs[i].tolist() == [_python_order(seed, False), _python_order(seed, True)], i
  direct = hashed_order._orders_of_seeds(seeds)
  for i, seed in enumerate(seeds.tolist()):
    assert direct[i].tolist() == [_python_order(seed, False), _python_order(seed, True)], i


def test_replay_reports_rows_it_cannot_finish():
  seeds = _seeds(2_000)
  items, complete = hashed_order._replay_shuffle(hashed_order.mt_first_outputs(seeds, 3), 4)
  assert 0 < complete.sum() < len(seeds)
  for seed, row, done in zip(seeds.tolist(), items.tolist(), complete.tolist(), strict=True):
    blocks = [0, 1, 2, 3]
    random.Random(seed).shuffle(blocks)
    assert (row == blocks) or not done


def test_pairs_and_orders_agree():
  src = ["192.0.2.1", None, "", "2001:db8::1"] * 50
  dst = ["8.8.8.8", "8.8.4.4", None, "::"] * 50
  seconds = np.arange(200) * 61 + 1_751_328_000
  has_ts = np.arange(200) % 3 == 0
  pairs = tokenizer.hashed_order_pairs(src, dst, seconds)
  orders = tokenizer.hashed_orders(src, dst, seconds, has_ts)
  assert orders.tolist() == [pairs[i, int(h)] for i, h in enumerate(has_ts.tolist())]
  # Null and empty text hash alike.
  assert (
    tokenizer.hashed_order_pairs([None], [None], [5])
    == tokenizer.hashed_order_pairs([""], [""], [5])
  ).all()
