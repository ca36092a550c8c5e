"""The prepared store: one split of measurements grouped by probe, as memory-mappable .npy files.

Layout of a split directory (written by `data.prepare.prepare`):

    meta.json            format version, fingerprint, counts, source files (written last)
    probe_offsets.npy    int64 [P+1]   rows of probe p are [off[p], off[p+1])
    probe_src.npy        uint8 [P, 16] source address (IPv4 in the first 4 bytes)
    probe_version.npy    uint8 [P]     4 or 6
    dst_table.npy        uint8 [D, 16] the distinct destinations, in order of first row
    dst_index.npy        uint32 [N]    each row's destination: dst_table[dst_index[r]]
    seconds.npy          uint32 [N]    Unix seconds; non-decreasing within a probe
    rtt_bytes.npy        uint8 [N, 2]  the RTT block's two payload bytes; 0, 0: failed
    hashed_order.npy     uint8 [N, 2]  only with network_field_order=hashed
    probe_failed.npy     int64 [P]     failed rows of each probe      } probe statistics,
    probe_long_gaps.npy  int64 [P]     rows > 255 s after the row     } written by prepare
                                       before them in the split       } (`probe_counts`)

Probes are ordered by (hash, version, source address bytes), the hash being the one that
decides the probe split (`data.prepare.partition`); rows within a probe by time, ties by destination,
RTT payload and hashed order, so the content depends only on the input rows. A row takes
10 bytes (12 with the hashed order): 31 in format 2, which kept each destination's 16 bytes,
the RTT as a float and a failed flag (`dst_table`; a failed row's payload is 0, 0, which no
RTT has: its mantissa is at least 1), 14 in format 3, which kept the seconds as int64 (a
time the reader takes is from 1970 to 2106: `SECONDS_MAX`, docs/spec.md §1).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import mmap
import os
import sys

import numpy as np

from maxtext_netdata.data.store import dst_table
from maxtext_netdata.data.store.memory import (  # noqa: F401
  memory_cgroups,
  page_cache_room,
  usable_memory,
)
from maxtext_netdata.errors import DataError, WritesTo

FORMAT_VERSION = 4

# name → (dtype, trailing shape); the leading dimension is probes+1, probes or rows.
PROBE_ARRAYS = {
  "probe_offsets": (np.int64, ()),
  "probe_src": (np.uint8, (16,)),
  "probe_version": (np.uint8, ()),
}
# A split's row columns as prepare sorts and merges them (a destination as its 16 bytes)...
ROW_ARRAYS = {
  "dst": (np.uint8, (16,)),
  "seconds": (np.int64, ()),
  "rtt_bytes": (np.uint8, (2,)),
  "hashed_order": (np.uint8, (2,)),
}
# ...and as its files hold them: the destination as an index into `dst_table` (`dst_table`),
# the seconds as uint32 (`SECONDS_MAX`); prepare keeps them as int64 until they are written.
ROW_FILES = {
  dst_table.INDEX: (dst_table.INDEX_DTYPE, ()),
  **{name: kind for name, kind in ROW_ARRAYS.items() if name != "dst"},
  "seconds": (np.uint32, ()),
}
# The last second a store keeps, 2106-02-07 06:28:15 UTC; the first is 0 (1970). The reader
# (`data.raw.schema.LAST_SECOND`) and `ingest` take no row outside them: a bad row.
SECONDS_MAX = int(np.iinfo(ROW_FILES["seconds"][0]).max)
TABLE_ARRAYS = {dst_table.TABLE: (np.uint8, (16,))}  # leading dimension: the table's own
# Per-probe statistics the epoch planner needs, counted once by prepare (`probe_counts`).
STATS_ARRAYS = ("probe_failed", "probe_long_gaps")
LONG_GAP_S = 255  # a gap above this takes a DELTA4 timestamp (docs/spec.md §2)
META_FILE = "meta.json"
# How the row arrays' memory maps read the disk (config key `network_store_access`): "normal",
# the kernel's read-around (a fault reads the pages around it, up to the device's read-ahead:
# a store that fits in memory is soon all in page cache); "random", MADV_RANDOM (a fault reads
# its own page: for a store larger than memory, whose rows the loader reads at random, the
# read-around reads mostly what no batch needs). "auto" picks "random" for a split whose row
# files take more than RANDOM_ABOVE times the memory page cache may take (`page_cache_room`:
# the memory less what processes hold, which the cache cannot take). Measured with
# `benchmarks/bench_store_access.py --memory-limit` (docs/prepare.md): 5.3x the batches with
# "random" when the rows do not fit, 34x with "normal" for the first 20 s when they do. With
# "random" the loader also reads the next batches' rows ahead (`read_ahead`).
ACCESS = ("normal", "random")
RANDOM_ABOVE = 1.0


class PreparedStore:
  """One split of the prepared store, opened lazily.

  Arrays are opened with `mmap_mode='r'` on first attribute access, so the object pickles as
  its path (Grain workers are spawned and get the dataset graph cloudpickled) and worker
  processes share pages. `meta.json` is read at construction: a directory without it, or of
  another format version, is not a store.
  """

  def __init__(self, path: str, access: str = "normal"):
    if access not in ACCESS:
      raise ValueError(f"access {access!r}: one of {ACCESS}")
    self.path = os.fspath(path)
    self.access = access
    meta_path = os.path.join(self.path, META_FILE)
    try:
      with open(meta_path, encoding="utf-8") as f:
        self.meta = json.load(f)
    except FileNotFoundError:
      raise DataError(f"{self.path}: not a prepared store (no {META_FILE}); run prepare") from None
    except (OSError, json.JSONDecodeError) as e:
      raise DataError(f"{meta_path}: unreadable ({e}); run prepare again") from None
    version = self.meta.get("format_version")
    if version != FORMAT_VERSION:
      raise DataError(
        f"{self.path}: store format {version}, this code reads {FORMAT_VERSION}; run prepare"
      )
    self.num_rows = int(self.meta["num_rows"])
    self.num_probes = int(self.meta["num_probes"])

  def __reduce__(self):
    return (PreparedStore, (self.path, self.access))

  def with_access(self, access: str, memory: int | None = None) -> PreparedStore:
    """This split, its row arrays read the way `access` says (ACCESS, or "auto": "random"
    when its row files take more than RANDOM_ABOVE of `memory` bytes, by default
    `page_cache_room()`: the memory page cache may take now)."""
    if access == "auto":
      memory = page_cache_room() if memory is None else memory
      rows = self.row_bytes()
      access = "random" if rows > RANDOM_ABOVE * memory else "normal"
      if access == "random":
        print(
          f"network_grain: {self.path}: rows {rows / 2**30:,.2f} GiB, room for page cache"
          f" {memory / 2**30:,.2f} GiB: read at random, ahead of the batches"
          " (network_store_access=auto)",
          file=sys.stderr,
        )
    return self if access == self.access else PreparedStore(self.path, access)

  def row_bytes(self) -> int:
    """Bytes of the split's row array files."""
    paths = (os.path.join(self.path, f"{name}.npy") for name in ROW_FILES)
    return sum(os.path.getsize(path) for path in paths if os.path.exists(path))

  @property
  def dst(self) -> np.ndarray:
    """uint8 [N, 16]: every row's destination, decoded in memory (tools and tests; the batch
    kernel reads `dst_index` and `dst_table`)."""
    return dst_table.decode(self.dst_table, self.dst_index)

  @property
  def failed(self) -> np.ndarray:
    """bool [N]: every row's failed flag, in memory (`failed_of` its RTT payload)."""
    return failed_of(self.rtt_bytes)

  def __getattr__(self, name: str):
    # Only called for attributes not yet set: open the array and keep it.
    if name not in PROBE_ARRAYS and name not in ROW_FILES and name not in TABLE_ARRAYS:
      raise AttributeError(f"PreparedStore has no attribute {name!r}")
    if name == "hashed_order" and not self.meta.get("hashed_order"):
      array = None
    else:
      array = self._load(name)
    self.__dict__[name] = array
    return array

  def _load(self, name: str) -> np.ndarray:
    dtype, tail = {**PROBE_ARRAYS, **ROW_FILES, **TABLE_ARRAYS}[name]
    rows = (
      self.num_probes + 1
      if name == "probe_offsets"
      else self.num_probes
      if name in PROBE_ARRAYS
      else None
      if name in TABLE_ARRAYS
      else self.num_rows
    )
    array = self._map(name, dtype, (rows, *tail))
    if self.access == "random" and name in ROW_FILES:
      mapping = getattr(array, "_mmap", None)  # numpy's memmap keeps its mmap.mmap there
      if mapping is not None and hasattr(mmap, "MADV_RANDOM"):
        mapping.madvise(mmap.MADV_RANDOM)
    return array

  def _map(self, name: str, dtype, shape: tuple[int, ...]) -> np.ndarray:
    """`name`.npy memory-mapped, checked to hold `dtype` of `shape`."""
    file_path = os.path.join(self.path, f"{name}.npy")
    try:
      array = np.load(file_path, mmap_mode="r")
    except (OSError, ValueError) as e:
      raise DataError(f"{file_path}: unreadable ({e}); run prepare again") from None
    if shape[0] is None and array.ndim == len(shape):
      shape = (array.shape[0], *shape[1:])  # a table: any length
    if array.dtype != dtype or array.shape != shape:
      raise DataError(
        f"{file_path}: {array.dtype}{list(array.shape)}, expected"
        f" {np.dtype(dtype)}{list(shape)}; run prepare again"
      )
    return array

  def probe_counts(self) -> tuple[np.ndarray, np.ndarray]:
    """(failed rows, long gaps) of each probe, int64 [P] each (see `probe_counts`).

    Memory-mapped from the split when prepare stored them, so every process and Grain worker
    shares one copy in page cache; counted from the rows otherwise (stores written without
    them, such as `ProbeRows.write`'s).
    """
    cached = self.__dict__.get("_probe_counts")
    if cached is None:
      if all(os.path.exists(os.path.join(self.path, f"{n}.npy")) for n in STATS_ARRAYS):
        cached = tuple(self._map(name, np.int64, (self.num_probes,)) for name in STATS_ARRAYS)
      else:
        cached = probe_counts(self)
      self.__dict__["_probe_counts"] = cached
    return cached

  def probe_rows(self, probe: int) -> slice:
    """Row slice of one probe."""
    return slice(int(self.probe_offsets[probe]), int(self.probe_offsets[probe + 1]))

  def __repr__(self) -> str:
    return f"PreparedStore({self.path!r}, rows={self.num_rows}, probes={self.num_probes})"


@dataclasses.dataclass
class ProbeRows:
  """Measurements in memory, grouped by probe and time-sorted: the content of one split."""

  probe_offsets: np.ndarray  # int64 [P+1]
  probe_src: np.ndarray  # uint8 [P, 16]
  probe_version: np.ndarray  # uint8 [P]
  dst: np.ndarray  # uint8 [N, 16]
  seconds: np.ndarray  # int64 [N]
  rtt_bytes: np.ndarray  # uint8 [N, 2]; 0, 0: failed
  hashed_order: np.ndarray | None  # uint8 [N, 2]
  probe_hash: np.ndarray | None = None  # uint64 [P], a sorted bucket's (data.prepare.partition)

  @property
  def num_rows(self) -> int:
    return len(self.seconds)

  @property
  def num_probes(self) -> int:
    return len(self.probe_version)

  def write(self, path: str, meta: dict, keep: np.ndarray | None = None) -> dict:
    """Write the rows selected by bool [N] `keep` (None: all) as a split directory.

    Arrays go first, one at a time (so memory grows by one column, not a copy of all),
    then `meta.json` with `meta` plus format version and counts. Returns the counts.
    """
    os.makedirs(path, exist_ok=True)
    sizes = np.diff(self.probe_offsets)
    if keep is not None:
      kept = np.flatnonzero(keep)
      probe_of_row = np.repeat(np.arange(self.num_probes), sizes)
      sizes = np.bincount(probe_of_row[keep], minlength=self.num_probes)
      del probe_of_row
    present = sizes > 0
    offsets = np.zeros(int(present.sum()) + 1, dtype=np.int64)
    np.cumsum(sizes[present], out=offsets[1:])
    _save(path, "probe_offsets", offsets)
    _save(path, "probe_src", self.probe_src[present])
    _save(path, "probe_version", self.probe_version[present])
    for name in ROW_ARRAYS:
      column = getattr(self, name)
      if column is not None:
        column = column if keep is None else take_rows(column, kept)
        if name == "dst":
          encoder = dst_table.DstEncoder()
          _save(path, dst_table.INDEX, encoder.encode(column))
          _save(path, dst_table.TABLE, encoder.table())
        elif name == "seconds":
          _save(path, name, seconds_for_file(column))
        else:
          _save(path, name, column)
    rtt_bytes = self.rtt_bytes if keep is None else self.rtt_bytes[keep]
    counts = {
      "rows": int(offsets[-1]),
      "probes": int(present.sum()),
      "failed": int(failed_of(rtt_bytes).sum()),
    }
    write_json(
      os.path.join(path, META_FILE),
      {
        **meta,
        "format_version": FORMAT_VERSION,
        "num_rows": counts["rows"],
        "num_probes": counts["probes"],
        "num_failed": counts["failed"],
        "hashed_order": self.hashed_order is not None,
      },
    )
    return counts


def probe_counts(split, chunk_rows: int = 1 << 24) -> tuple[np.ndarray, np.ndarray]:
  """(failed rows, long gaps) per probe of `split`, int64 [P] each, counted from its rows.

  A row is a long gap when its second is more than `LONG_GAP_S` after the second of the row
  before it in the split (so a probe's first row is compared with the last row of the probe
  before it, and the split's first row with itself). Reads `chunk_rows` rows at a time.
  `assemble` counts the same while writing a split (`ProbeCounter`); this is the reference
  and the fallback for stores written without the counts.
  """
  offsets = np.asarray(split.probe_offsets, dtype=np.int64)
  failed_cum = np.zeros(len(offsets), dtype=np.int64)
  gap_cum = np.zeros(len(offsets), dtype=np.int64)
  carry_failed = carry_gap = 0
  previous = None
  for lo in range(0, split.num_rows, chunk_rows):
    hi = min(lo + chunk_rows, split.num_rows)
    seconds = np.asarray(split.seconds[lo:hi])
    cf = carry_failed + np.cumsum(failed_of(split.rtt_bytes[lo:hi]), dtype=np.int64)
    cg = carry_gap + np.cumsum(_long_gaps(seconds, previous), dtype=np.int64)
    at = (offsets > lo) & (offsets <= hi)  # probe ends inside this chunk
    failed_cum[at] = cf[offsets[at] - lo - 1]
    gap_cum[at] = cg[offsets[at] - lo - 1]
    carry_failed, carry_gap, previous = int(cf[-1]), int(cg[-1]), int(seconds[-1])
  return np.diff(failed_cum), np.diff(gap_cum)


def time_span(split) -> list[int] | None:
  """[first, last] second of the rows of `split` (a `PreparedStore`), None when it has none:
  each probe's first and last row, as its rows are in time order (a few pages a probe)."""
  offsets = np.asarray(split.probe_offsets)
  if not len(offsets) or offsets[-1] == 0:
    return None
  return [int(split.seconds[offsets[:-1]].min()), int(split.seconds[offsets[1:] - 1].max())]


def failed_of(rtt_bytes: np.ndarray) -> np.ndarray:
  """bool [n]: the rows whose RTT payload (uint8 [n, 2]) is 0, 0: failed pings. Each row's
  two bytes read as one uint16 (zero in either byte order): `.any(axis=1)`, a reduction over
  an axis of two, took ~17 ns a row, a quarter of a merge's time; this ~0.3 ns."""
  rows = np.ascontiguousarray(rtt_bytes, dtype=np.uint8)
  return rows.view(np.uint16).reshape(len(rows)) == 0


def _long_gaps(seconds: np.ndarray, previous: int | None) -> np.ndarray:
  """bool [n]: rows more than LONG_GAP_S after the row before (`previous` before the first).
  Differences as int64: a probe's first row may be earlier than the row before it, which an
  unsigned difference would make a long gap."""
  gaps = np.empty(len(seconds), dtype=bool)
  gaps[0] = previous is not None and int(seconds[0]) - previous > LONG_GAP_S
  np.greater(np.subtract(seconds[1:], seconds[:-1], dtype=np.int64), LONG_GAP_S, out=gaps[1:])
  return gaps


def seconds_for_file(seconds: np.ndarray) -> np.ndarray:
  """uint32 [n]: Unix seconds (any integer type) as a split's file keeps them; a ValueError
  for one outside 0 ... SECONDS_MAX (the reader lets none through: a check, not a rule)."""
  seconds = np.asarray(seconds)
  if len(seconds) and (int(seconds.min()) < 0 or int(seconds.max()) > SECONDS_MAX):
    raise ValueError(
      f"seconds from {int(seconds.min())} to {int(seconds.max())}: a store keeps 0 to {SECONDS_MAX}"
    )
  return seconds.astype(np.uint32, copy=False)


def extend_probes(parts: list, values: np.ndarray, continues: bool) -> None:
  """Append per-probe `values` to `parts` (arrays, one after another), the first added to
  the last probe's when `continues` (a probe whose rows came in two pieces)."""
  if continues:
    last = parts[-1] = parts[-1].copy()
    last[-1] += values[0]
    values = values[1:]
  if len(values):
    parts.append(values)


class ProbeCounter:
  """`probe_counts` of a split written in order, whole probes at a time (`assemble`), or a
  probe's rows in two pieces, one after the other (`continues`).

  Holds only per-probe counts: nothing row-sized outlives a call.
  """

  def __init__(self):
    self.previous = None
    self.failed: list[np.ndarray] = []
    self.gaps: list[np.ndarray] = []

  @staticmethod
  def _per_probe(flags: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    starts = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    return np.add.reduceat(flags, starts, dtype=np.int64)

  def add_seconds(self, seconds: np.ndarray, sizes: np.ndarray, continues=False) -> None:
    """The seconds of probes of `sizes` rows each (all > 0), next in the split; the first
    probe's rows go on from the last probe's when `continues`."""
    if len(seconds):
      gaps = self._per_probe(_long_gaps(seconds, self.previous), sizes)
      extend_probes(self.gaps, gaps, continues)
      self.previous = int(seconds[-1])

  def add_failed(self, failed: np.ndarray, sizes: np.ndarray, continues=False) -> None:
    if len(failed):
      extend_probes(self.failed, self._per_probe(failed, sizes), continues)

  def counts(self) -> tuple[np.ndarray, np.ndarray]:
    empty = np.zeros(0, dtype=np.int64)
    return (
      np.concatenate(self.failed) if self.failed else empty,
      np.concatenate(self.gaps) if self.gaps else empty,
    )


def take_rows(array: np.ndarray, index: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
  """`array[index]` along axis 0, into `out` when given; byte rows are moved as whole words
  (numpy gathers 2-D uint8 arrays byte by byte, several times slower)."""
  if array.ndim == 2 and array.dtype == np.uint8 and array.shape[1] in (2, 4, 8, 16):
    width = array.shape[1]
    word = np.uint16 if width == 2 else np.uint32 if width == 4 else np.uint64
    words = np.ascontiguousarray(array).view(word)
    if out is not None:
      np.take(words, index, axis=0, out=out.view(word), mode="clip")
      return out
    return np.take(words, index, axis=0).view(np.uint8).reshape(len(index), width)
  if out is not None:
    # mode="clip" (indices are in range): with "raise", numpy gathers into a buffer first.
    np.take(array, index, axis=0, out=out, mode="clip")
    return out
  return np.take(array, index, axis=0)


def _save(path: str, name: str, array: np.ndarray) -> None:
  dtype, tail = {**PROBE_ARRAYS, **ROW_FILES, **TABLE_ARRAYS}[name]
  assert array.dtype == dtype and array.shape[1:] == tail, (name, array.dtype, array.shape)
  save_array(os.path.join(path, f"{name}.npy"), array)


def save_array(file_path: str, array: np.ndarray) -> None:
  """`np.save(file_path, array)`, whose failure names the file and its cause.

  `np.save` writes the data with C stdio and reports a short write (a full disk) as
  `OSError: N requested and M written`, without errno or file name. Here numpy writes the
  header and Python's file object the data, the same bytes: a failed write raises OSError
  with its errno (ENOSPC, EFBIG, ...) and `file_path`.
  """
  array = np.ascontiguousarray(array)
  with WritesTo(file_path), open(file_path, "wb") as f:
    np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(array))
    f.write(array.reshape(-1).view(np.uint8))


def reserve(f, size: int) -> None:
  """Extends the open file `f` to `size` bytes past its position, allocated now (`fallocate`).

  For a file written through a memory map: a file extended by `truncate` is sparse, its
  blocks allocated only as its pages are written back, and a page that finds the disk full
  kills the process with SIGBUS. Reserved here, a full disk is an OSError naming the file.
  """
  f.flush()
  if size > 0:  # fallocate refuses a length of 0
    with WritesTo(f.name):
      os.posix_fallocate(f.fileno(), f.tell(), size)


def write_json(path: str, data: dict) -> None:
  """Write JSON through a temporary file and a rename, so a reader sees all or nothing."""
  tmp = f"{path}.tmp"
  try:
    with WritesTo(path), open(tmp, "w", encoding="utf-8") as f:
      json.dump(data, f, indent=1, sort_keys=True)
      f.write("\n")
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise
