"""A split's destination addresses as a table of the distinct ones and a uint32 index per row.

RIPE Atlas's pings go to few destinations (anchors, root servers, the targets of user
measurements: thousands to a few hundred thousand in a month) from ~12,000 probes, ~35
billion rows: 16 bytes of address a row were half the store. A split keeps `dst_table.npy`
(uint8 [D, 16], IPv4 in the first 4 bytes) and `dst_index.npy` (uint32 [N]); row r's address
is `dst_table[dst_index[r]]`.

The table lists the addresses in the order of their first row in the split. That order is a
function of the split's rows alone, so a split written from sorted pieces, merged from two
splits (an append) or written whole in memory gets the same table and indices: the same
bytes, which the tests compare. `DstEncoder` builds it as rows are written in store order:
from 16-byte addresses (a sorted bucket's column) through a table of the addresses seen so
far (`kernels.hash_table.KeyTable`, ~26 ns a row), or from another split's indices and table
(a piece, a merge's source) through a map of that table's entries (~2 ns a row, plus the
table's entries first seen), with rows of addresses past that table where a merge sorted
some rows again between rows it maps by index.
"""

from __future__ import annotations

import numba
import numpy as np

from maxtext_netdata.errors import DataError
from maxtext_netdata.kernels import hash_table, kernel_cache, warmup

kernel_cache.install()  # cached kernels keyed on every project file imported

TABLE = "dst_table"
INDEX = "dst_index"
INDEX_DTYPE = np.uint32
_NO_LIMIT = 2**62  # a split's table is kept whole: it is its own content
_CHUNK = 1 << 16  # rows a lookup


def decode(table: np.ndarray, index: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
  """The 16-byte addresses uint8 [n, 16] of rows with `index` into `table`."""
  return np.take(np.asarray(table), np.asarray(index), axis=0, out=out)


class DstEncoder:
  """The table of one split being written in store order, and its rows' indices."""

  def __init__(self):
    self._keys = hash_table.KeyTable(2, (), np.uint8, limit=_NO_LIMIT)
    self._maps: dict[object, np.ndarray] = {}

  def __len__(self) -> int:
    return len(self._keys)

  def encode(self, dst: np.ndarray) -> np.ndarray:
    """uint32 [n] indices of the next `n` rows' addresses (uint8 [n, 16])."""
    words = np.ascontiguousarray(dst, dtype=np.uint8).view(np.uint64).reshape(-1, 2)
    out = np.empty(len(words), INDEX_DTYPE)
    # A lookup makes room for all of its keys to be new (~80 bytes a key): in chunks, the
    # table's memory follows its own size, not a 2M-row piece's (+170 MiB of prepare's RSS).
    for at in range(0, len(words), _CHUNK):
      out[at : at + _CHUNK] = self._keys.lookup(words[at : at + _CHUNK])[0]
    return out

  def encode_from(
    self,
    index: np.ndarray,
    table: np.ndarray,
    source: str,
    out: np.ndarray | None = None,
    extra: np.ndarray | None = None,
  ) -> np.ndarray:
    """`encode(decode(table, index))`, without decoding every row: `source` names `table`
    (the split it comes from: the same source, the same table) so that its entries' indices
    here are kept. Indices from len(table) on name the rows of `extra` (uint8 [m, 16]), an
    entry a row, used once (a merge's rows sorted again, between rows it maps by index). An
    index past both is a DataError naming `source`. Written into `out` (uint32 [n], a split
    file's map) when given, in one pass."""
    mapped = self._maps.get(source)
    if mapped is None:
      mapped = self._maps[source] = np.full(len(table), -1, np.int64)
    extra = np.zeros((0, 16), np.uint8) if extra is None else extra
    extra_mapped = np.full(len(extra), -1, np.int64)
    index = np.ascontiguousarray(index, dtype=INDEX_DTYPE)
    entries = np.empty(min(len(index), len(mapped) + len(extra)), np.int64)
    count = _first_unseen(index, mapped, extra_mapped, entries)
    if count < 0:
      mapped[mapped == -2] = -1  # the entries marked before the bad one stay unseen
      raise DataError(
        f"{source}: a destination index past its table of {len(mapped)}; prepare it again"
      )
    if count:
      entries = entries[:count]  # in the order of their first row
      own = entries < len(mapped)
      words = np.empty((count, 16), np.uint8)
      words[own] = np.asarray(table)[entries[own]]
      words[~own] = extra[entries[~own] - len(mapped)]
      codes = self.encode(words)
      mapped[entries[own]] = codes[own]
      extra_mapped[entries[~own] - len(mapped)] = codes[~own]
    if out is None:
      out = np.empty(len(index), INDEX_DTYPE)
    _map_into(index, mapped, extra_mapped, out)
    return out

  def table(self) -> np.ndarray:
    """uint8 [D, 16]: the addresses so far, in the order of their first row."""
    return np.ascontiguousarray(self._keys.key_words[: len(self._keys)]).view(np.uint8)


@numba.njit(cache=True, nogil=True)
def _first_unseen(index, mapped, extra_mapped, out):
  """The entries of `index` that `mapped` (from len(mapped) on: `extra_mapped`) does not
  know (-1), each once, in the order of their first row, into `out`; marks them (-2).
  Returns their count, or -1 for an index past both (read from disk: never read past it).
  One pass: a sort of the indices (`np.unique`) took ~0.15 s a 2M-row piece, longer than the
  piece's other work."""
  count = 0
  own = len(mapped)
  for i in range(len(index)):
    entry = index[i]
    if entry < own:
      if mapped[entry] == -1:
        mapped[entry] = -2
        out[count] = entry
        count += 1
    elif entry - own < len(extra_mapped):
      if extra_mapped[entry - own] == -1:
        extra_mapped[entry - own] = -2
        out[count] = entry
        count += 1
    else:
      return -1
  return count


@numba.njit(cache=True, nogil=True)
def _map_into(index, mapped, extra_mapped, out):
  """out[i] = the code of entry index[i] (`mapped`, then `extra_mapped`); every entry is
  mapped (`_first_unseen` first). One pass where numpy's gather, cast and copy into a file's
  map took three."""
  own = len(mapped)
  for i in range(len(index)):
    entry = index[i]
    out[i] = mapped[entry] if entry < own else extra_mapped[entry - own]


_first_unseen = warmup.noted(_first_unseen, "prepare: compiled the destination table's pass")
_map_into = warmup.noted(_map_into, "prepare: compiled the destination table's pass")
