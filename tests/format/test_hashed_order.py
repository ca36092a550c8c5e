"""The vectorized `hashed` field order against Python's own md5 and random.Random(seed).shuffle."""

import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from maxtext_netdata.format import hashed_order, tokenizer
from tests.helpers import reference_tokenizer as ref

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


def _oracle(src, dst, seconds, has_ts) -> int:
  """docs/spec.md §2's order from the reference tokenizer (md5 seed, `random.Random(seed).shuffle`)."""
  names = ref.hashed_order(src, dst, int(seconds), has_ts)
  ids = [{ref.SRC: 0, ref.DST: 1, ref.RESULT: 2, ref.TIMESTAMP: 3}[n] for n in names]
  return [tuple(p) for p in tokenizer.PERMUTATIONS.tolist()].index(tuple(ids))


@pytest.fixture(scope="module")
def rows(sample_files):
  """Generated rows' address text and seconds, plus null, empty and IPv6 text."""
  table = pq.read_table(sample_files[2]).slice(0, 3_000)
  src = table.column("src_addr").to_pylist() + [None, "", "2001:db8::1", None]
  dst = table.column("dst_addr").to_pylist() + ["8.8.8.8", None, "::", ""]
  times = table.column("event_time")
  per_second = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[times.type.unit]
  seconds = (pc.cast(times, pa.int64()).to_numpy() // per_second).tolist()
  seconds += [0, 1_751_328_000, 2**40, 5]
  return src, dst, np.array(seconds, dtype=np.int64)


@pytest.mark.parametrize("words", [24, 3])  # 3 outputs: most rows take the Python fallback
def test_orders_match_the_reference_tokenizer(monkeypatch, rows, words):
  monkeypatch.setattr(hashed_order, "_WORDS", words)
  src, dst, seconds = rows
  has_ts = np.random.default_rng(words).random(len(seconds)) < 0.5
  pairs = tokenizer.hashed_order_pairs(src, dst, seconds)
  orders = tokenizer.hashed_orders(pa.array(src), pa.array(dst), seconds, has_ts)
  assert len(set(orders.tolist())) == 24  # every order occurs: a wrong mapping shows
  for i, (s, d, t) in enumerate(zip(src, dst, seconds.tolist(), strict=True)):
    expected = [_oracle(s, d, t, False), _oracle(s, d, t, True)]
    assert pairs[i].tolist() == expected, i
    assert orders[i] == expected[int(has_ts[i])], i


def test_orders_of_edge_seeds_match_python_shuffle():
  seeds = _seeds(4_000)
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
