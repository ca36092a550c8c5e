"""A batch's probes from the source column's dictionary: empty and null texts of both versions.

An empty or null source text is the zero address of its row's version, so one dictionary
entry can stand for two probes; the probes must be exactly the distinct (version, source
bytes) pairs of the rows, as the plain (not dictionary-encoded) path finds them.
"""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from maxtext_netdata.data.prepare import probes
from maxtext_netdata.data.raw import schema


def _columns(src: pa.Array, versions: list[int]) -> schema.RawColumns:
  n = len(versions)
  table = pa.table(
    {
      "event_time": pa.array(np.arange(n), pa.timestamp("s", tz="UTC")),
      "src_addr": src,
      "dst_addr": pa.array(["8.8.8.8" if v == 4 else "2001:db8::8" for v in versions]),
      "ip_version": pa.array(versions, pa.int64()),
      "rtt": pa.array(np.ones(n)),
    }
  )
  columns, _ = schema.validate_table(table, source="t.parquet")
  return columns


def _probe_keys(columns: schema.RawColumns) -> tuple[list[bytes], int]:
  """(key of each row as bytes, number of keys) from `_batch_probes` and the merge."""
  probe, table = probes._batch_probes(columns)
  probe, table, _ = probes._merged(probe, table, *probes._KNOWN.entries(table))
  return [table[p].tobytes() for p in probe], len(table)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dictionary_probes_match_the_rows(seed):
  rng = np.random.default_rng(seed)
  texts = ["10.0.0.1", "10.0.0.2", "2001:db8::1", "", None, "::", "0.0.0.0"]
  families = [4, 4, 6, None, None, 6, 4]
  n = 400
  pick = rng.integers(0, len(texts), n)
  versions = [families[p] or int(rng.choice([4, 6])) for p in pick]
  plain = pa.array([texts[p] for p in pick], pa.string())
  # Two row groups' dictionaries joined as raw_reader joins them: entries repeat.
  half = n // 2
  encoded = [plain.slice(0, half).dictionary_encode(), plain.slice(half).dictionary_encode()]
  joined = pa.DictionaryArray.from_arrays(
    pa.concat_arrays(
      [
        encoded[0].indices,
        pc.add(encoded[1].indices, pa.scalar(len(encoded[0].dictionary), pa.int32())),
      ]
    ),
    pa.concat_arrays([encoded[0].dictionary, encoded[1].dictionary]),
  )
  by_dictionary = _columns(joined, versions)
  assert isinstance(by_dictionary.src_text, pa.DictionaryArray)
  by_text = _columns(plain, versions)
  expected = [bytes([v]) + row.tobytes() for v, row in zip(versions, by_text.src, strict=True)]
  for columns in (by_dictionary, by_text):
    keys, count = _probe_keys(columns)
    assert keys == expected
    # "::" and the empty v6 text are one probe, as are "0.0.0.0" and the empty v4 text.
    assert count == len(set(expected))
