"""A split's destination table (data/store/dst_table.py): the same table and indices whether
rows arrive as addresses or as another table's indices, in any mix and any batch sizes."""

from __future__ import annotations

import numpy as np
import pytest

from maxtext_netdata.data.store import dst_table
from maxtext_netdata.errors import DataError


def _addresses(rng, n: int, distinct: int) -> np.ndarray:
  pool = rng.integers(0, 256, (distinct, 16), dtype=np.uint8)
  pool[: distinct // 2, 4:] = 0  # IPv4 ones too
  return pool[rng.integers(0, distinct, n)]


def _by_definition(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The table (distinct addresses in order of first row) and indices, in plain Python."""
  seen: dict[bytes, int] = {}
  index = [seen.setdefault(bytes(row), len(seen)) for row in rows]
  table = np.array([np.frombuffer(k, np.uint8) for k in seen], np.uint8).reshape(-1, 16)
  return table, np.array(index, np.uint32)


def test_a_table_of_first_rows_however_the_rows_arrive():
  rng = np.random.default_rng(0)
  rows = _addresses(rng, 20_000, 700)
  table, index = _by_definition(rows)
  # Two sources with tables of their own (as pieces, or a merge's base and delta), each
  # table in an order of its own, and rows of the sources interleaved in runs.
  sources = []
  for seed in (1, 2):
    own = np.unique(rows, axis=0)[np.random.default_rng(seed).permutation(len(table))]
    lookup = {bytes(a): i for i, a in enumerate(own)}
    sources.append((own, np.array([lookup[bytes(r)] for r in rows], np.uint32)))
  encoder = dst_table.DstEncoder()
  out, at = [], 0
  while at < len(rows):
    n = int(rng.integers(1, 3_000))
    kind = int(rng.integers(0, 4))
    if kind == 2:  # 16-byte addresses
      out.append(encoder.encode(rows[at : at + n]))
    elif kind == 3:  # source 0's indices, some rows as addresses past its table (a merge's
      # rows sorted again, between rows it maps by index)
      own, own_index = sources[0]
      mixed = own_index[at : at + n].copy()
      loose = rng.random(len(mixed)) < 0.3
      mixed[loose] = len(own) + np.arange(loose.sum())
      extra = rows[at : at + n][loose]
      out.append(encoder.encode_from(mixed, own, "source 0", extra=extra))
    else:  # indices into source `kind`'s table
      own, own_index = sources[kind]
      out.append(encoder.encode_from(own_index[at : at + n], own, f"source {kind}"))
    at += n
  np.testing.assert_array_equal(np.concatenate(out), index)
  np.testing.assert_array_equal(encoder.table(), table)
  np.testing.assert_array_equal(dst_table.decode(encoder.table(), np.concatenate(out)), rows)


def test_an_entry_first_seen_twice_in_one_batch_is_added_once():
  table = np.arange(48, dtype=np.uint8).reshape(3, 16)
  encoder = dst_table.DstEncoder()
  got = encoder.encode_from(np.array([2, 2, 0, 2, 0], np.uint32), table, "a")
  np.testing.assert_array_equal(got, [0, 0, 1, 0, 1])
  np.testing.assert_array_equal(encoder.table(), table[[2, 0]])
  np.testing.assert_array_equal(encoder.encode(table[[1, 0]]), [2, 1])
  np.testing.assert_array_equal(encoder.encode_from(np.array([1], np.uint32), table, "a"), [2])
  assert len(encoder) == 3


def test_an_index_past_its_table_is_refused():
  encoder = dst_table.DstEncoder()
  table = np.zeros((2, 16), np.uint8)
  with pytest.raises(DataError, match="^piece: a destination index past its table of 2"):
    encoder.encode_from(np.array([0, 2], np.uint32), table, "piece")
  extra = np.ones((1, 16), np.uint8)  # index 2 is this row; 3 is past both
  np.testing.assert_array_equal(
    encoder.encode_from(np.array([2, 0], np.uint32), table, "piece", extra=extra), [0, 1]
  )
  with pytest.raises(DataError, match="^piece: a destination index past its table of 2"):
    encoder.encode_from(np.array([0, 3], np.uint32), table, "piece", extra=extra)
