"""The compiled row passes give what the numpy steps they replace give, bit for bit."""

import numpy as np
import pytest

from maxtext_netdata.data.prepare import row_kernels
from maxtext_netdata.format import tokenizer


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64])
@pytest.mark.parametrize("size", [1, 7, 3000])
def test_counting_order_is_numpys_stable_argsort(dtype, size):
  rng = np.random.default_rng(size)
  keys = rng.integers(0, size, 50_000).astype(dtype)
  order, bounds = row_kernels.counting_order(keys, size)
  np.testing.assert_array_equal(order, np.argsort(keys, kind="stable"))
  expected = np.concatenate([[0], np.cumsum(np.bincount(keys, minlength=size))])
  np.testing.assert_array_equal(bounds, expected)


def test_counting_order_of_no_keys_and_of_keys_missing_from_the_range():
  order, bounds = row_kernels.counting_order(np.zeros(0, np.int64), 3)
  assert order.shape == (0,) and bounds.tolist() == [0, 0, 0, 0]
  order, bounds = row_kernels.counting_order(np.array([4, 0, 4, 2], np.int32), 6)
  assert order.tolist() == [1, 3, 0, 2] and bounds.tolist() == [0, 1, 1, 2, 2, 4, 4]


def _numpy_ties(probe, seconds, perm):
  same = probe[perm][1:] == probe[perm][:-1]
  step = np.diff(seconds[perm])
  return None if (step[same] < 0).any() else same & (step == 0)


def test_ties_match_the_numpy_steps():
  rng = np.random.default_rng(0)
  probe = rng.integers(0, 500, 200_000).astype(np.int32)
  seconds = np.sort(rng.integers(1_700_000_000, 1_700_050_000, len(probe)))
  perm = np.argsort(probe, kind="stable")  # time order kept within each probe
  tie, count = row_kernels.ties(probe, seconds, perm)
  expected = _numpy_ties(probe, seconds, perm)
  np.testing.assert_array_equal(tie, expected)
  assert count == expected.sum() > 0
  seconds[perm[10]], seconds[perm[11]] = seconds[perm[11]] + 1, seconds[perm[10]]
  if probe[perm[10]] == probe[perm[11]]:
    assert row_kernels.ties(probe, seconds, perm) is None
  assert row_kernels.ties(probe[:1], seconds[:1], np.zeros(1, np.int64))[1] == 0


def test_rtt_payload_is_the_tokenizers():
  rng = np.random.default_rng(0)
  edges = [0.0, -0.0, -1.0, 1e-300, 5e-324, 1e308, 2.047, 2.048, 2.0475, 65.535, 1e-3, 5e-4]
  rtt = np.concatenate([rng.uniform(-10, 1e6, 200_000), 10 ** rng.uniform(-8, 12, 200_000), edges])
  payload, failed = row_kernels.rtt_payload(rtt)
  expected_payload, expected_failed = tokenizer.rtt_bytes(rtt)  # 1e308 ms: the largest code
  np.testing.assert_array_equal(payload, expected_payload)
  np.testing.assert_array_equal(failed, expected_failed)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_rtt_payload_names_the_first_rtt_that_is_not_finite(bad):
  with pytest.raises(ValueError, match="RTT at index 2 is"):
    row_kernels.rtt_payload(np.array([1.0, 2.0, bad, np.nan]))


def test_time_grouped_order_is_counting_order_then_ties():
  rng = np.random.default_rng(1)
  probe = rng.integers(0, 700, 100_000).astype(np.int32)
  seconds = np.sort(rng.integers(1_700_000_000, 1_700_020_000, len(probe)))
  order, tie, count = row_kernels.time_grouped_order(probe, 700, seconds)
  np.testing.assert_array_equal(order, row_kernels.counting_order(probe, 700)[0])
  expected = _numpy_ties(probe, seconds, order)
  np.testing.assert_array_equal(tie, expected)
  assert count == expected.sum() > 0
  later = np.flatnonzero(probe == probe[0])[1]  # the first probe's second row, made earlier
  seconds[later] = seconds[0] - 1
  assert row_kernels.time_grouped_order(probe, 700, seconds) is None
  assert _numpy_ties(probe, seconds, order) is None
  empty = row_kernels.time_grouped_order(np.zeros(0, np.int32), 1, np.zeros(0, np.int64))
  assert empty[0].shape == (0,) and empty[2] == 0
