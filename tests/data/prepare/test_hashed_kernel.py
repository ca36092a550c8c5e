"""The compiled `hashed` field order against the reference (`format.hashed_order`, itself
checked against Python's md5 and random.Random(seed).shuffle) and hashlib's md5."""

import hashlib

import numpy as np
import pyarrow as pa
import pytest

from maxtext_netdata.data.prepare import hashed_kernel
from maxtext_netdata.format import hashed_order


def test_md5_of_every_length_across_the_padding_boundaries_is_hashlibs():
  rng = np.random.default_rng(0)
  messages = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in range(0, 200)]
  messages += [b"", b"a", b"192.0.2.1|8.8.8.8|1751328000"]
  expected = [int.from_bytes(hashlib.md5(m).digest()[:4], "big") for m in messages]
  assert hashed_kernel.md5_seeds(messages).tolist() == expected


def _rows(n: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  v4 = [f"{rng.integers(1, 224)}.{rng.integers(256)}.{rng.integers(256)}.{rng.integers(256)}"
        for _ in range(n)]  # fmt: skip
  v6 = [f"2001:db8:{rng.integers(65536):x}::{rng.integers(65536):x}" for _ in range(n)]
  src = [v4[i] if i % 4 else v6[i] for i in range(n)]
  dst = [None if i % 17 == 0 else v6[i] if i % 3 else v4[i] for i in range(n)]
  src[5] = None
  seconds = rng.integers(-(10**10), 10**10, n)
  seconds[:4] = [0, -1, 9, 2**62]
  return src, dst, seconds


@pytest.mark.parametrize("encoding", ["plain", "dictionary", "sliced"])
def test_orders_are_the_references_for_plain_dictionary_and_sliced_text(encoding):
  src, dst, seconds = _rows(20_000)
  expected = hashed_order.hashed_order_pairs(src, dst, seconds)
  src_array, dst_array = pa.array(src), pa.array(dst)
  if encoding == "dictionary":
    src_array, dst_array = src_array.dictionary_encode(), dst_array.dictionary_encode()
  elif encoding == "sliced":  # an offset into the buffers, as a filtered or split batch has
    src_array = pa.array(["x"] * 7 + src).slice(7)
    dst_array = pa.array(["y"] * 7 + dst).slice(7)
  got = hashed_kernel.hashed_order_pairs(src_array, dst_array, seconds)
  assert got.dtype == np.uint8 and got.shape == (len(seconds), 2)
  np.testing.assert_array_equal(got, expected)
  assert len(np.unique(got[:, 1])) == 24 and len(np.unique(got[:, 0])) == 6  # every order seen


def test_rows_whose_shuffle_outlasts_the_computed_outputs_take_pythons_shuffle():
  # With 24 outputs a row runs out about once in millions; with 5, most rows of a 4-block
  # shuffle do (it needs 5.3 on average), and each must still get Python's order.
  src, dst, seconds = _rows(3_000, seed=1)
  expected = hashed_order.hashed_order_pairs(src, dst, seconds)
  for outputs in (2, 5, 8):
    got = hashed_kernel.hashed_order_pairs(pa.array(src), pa.array(dst), seconds, outputs)
    np.testing.assert_array_equal(got, expected, err_msg=f"{outputs} outputs")
