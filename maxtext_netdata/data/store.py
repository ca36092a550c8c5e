"""The prepared store: one split of measurements grouped by probe, as memory-mappable .npy files.

Layout of a split directory (written by `data.prepare`):

    meta.json            format version, fingerprint, counts, source files (written last)
    probe_offsets.npy    int64 [P+1]   rows of probe p are [off[p], off[p+1])
    probe_src.npy        uint8 [P, 16] source address (IPv4 in the first 4 bytes)
    probe_version.npy    uint8 [P]     4 or 6
    dst.npy              uint8 [N, 16]
    seconds.npy          int64 [N]     Unix seconds; non-decreasing within a probe
    rtt_bytes.npy        uint8 [N, 2]  the RTT block's two payload bytes
    failed.npy           bool  [N]
    rtt_ms.npy           float32 [N]   negative = failed
    hashed_order.npy     uint8 [N, 2]  only with network_field_order=hashed

Probes are ordered by (version, source address bytes); rows within a probe by time, ties by
destination, RTT and hashed order, so the content depends only on the input rows.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from maxtext_netdata.data import schema
from maxtext_netdata.errors import DataError
from maxtext_netdata.format import tokenizer

FORMAT_VERSION = 1

# name → (dtype, trailing shape); the leading dimension is probes+1, probes or rows.
PROBE_ARRAYS = {
  "probe_offsets": (np.int64, ()),
  "probe_src": (np.uint8, (16,)),
  "probe_version": (np.uint8, ()),
}
ROW_ARRAYS = {
  "dst": (np.uint8, (16,)),
  "seconds": (np.int64, ()),
  "rtt_bytes": (np.uint8, (2,)),
  "failed": (np.bool_, ()),
  "rtt_ms": (np.float32, ()),
  "hashed_order": (np.uint8, (2,)),
}
META_FILE = "meta.json"


class PreparedStore:
  """One split of the prepared store, opened lazily.

  Arrays are opened with `mmap_mode='r'` on first attribute access, so the object pickles as
  its path (Grain workers are spawned and get the dataset graph cloudpickled) and worker
  processes share pages. `meta.json` is read at construction: a directory without it, or of
  another format version, is not a store.
  """

  def __init__(self, path: str):
    self.path = os.fspath(path)
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
    return (PreparedStore, (self.path,))

  def __getattr__(self, name: str):
    # Only called for attributes not yet set: open the array and keep it.
    if name not in PROBE_ARRAYS and name not in ROW_ARRAYS:
      raise AttributeError(f"PreparedStore has no attribute {name!r}")
    if name == "hashed_order" and not self.meta.get("hashed_order"):
      array = None
    else:
      array = self._load(name)
    self.__dict__[name] = array
    return array

  def _load(self, name: str) -> np.ndarray:
    file_path = os.path.join(self.path, f"{name}.npy")
    try:
      array = np.load(file_path, mmap_mode="r")
    except (OSError, ValueError) as e:
      raise DataError(f"{file_path}: unreadable ({e}); run prepare again") from None
    dtype, tail = {**PROBE_ARRAYS, **ROW_ARRAYS}[name]
    rows = (
      self.num_probes + 1
      if name == "probe_offsets"
      else (self.num_probes if name in PROBE_ARRAYS else self.num_rows)
    )
    if array.dtype != dtype or array.shape != (rows, *tail):
      raise DataError(
        f"{file_path}: {array.dtype}{list(array.shape)}, expected"
        f" {np.dtype(dtype)}{[rows, *tail]}; run prepare again"
      )
    return array

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
  rtt_bytes: np.ndarray  # uint8 [N, 2]
  failed: np.ndarray  # bool [N]
  rtt_ms: np.ndarray  # float32 [N]
  hashed_order: np.ndarray | None  # uint8 [N, 2]

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
        _save(path, name, column if keep is None else take_rows(column, kept))
    counts = {
      "rows": int(offsets[-1]),
      "probes": int(present.sum()),
      "failed": int(self.failed.sum() if keep is None else self.failed[keep].sum()),
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


def take_rows(array: np.ndarray, index: np.ndarray) -> np.ndarray:
  """`array[index]` along axis 0; byte rows are moved as whole words (numpy gathers 2-D uint8
  arrays byte by byte, several times slower)."""
  if array.ndim == 2 and array.dtype == np.uint8 and array.shape[1] in (2, 4, 8, 16):
    width = array.shape[1]
    words = np.ascontiguousarray(array).view(
      np.uint16 if width == 2 else np.uint32 if width == 4 else np.uint64
    )
    return np.take(words, index, axis=0).view(np.uint8).reshape(len(index), width)
  return np.take(array, index, axis=0)


def _save(path: str, name: str, array: np.ndarray) -> None:
  dtype, tail = {**PROBE_ARRAYS, **ROW_ARRAYS}[name]
  assert array.dtype == dtype and array.shape[1:] == tail, (name, array.dtype, array.shape)
  np.save(os.path.join(path, f"{name}.npy"), np.ascontiguousarray(array))


def write_json(path: str, data: dict) -> None:
  """Write JSON through a temporary file and a rename, so a reader sees all or nothing."""
  tmp = f"{path}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(data, f, indent=1, sort_keys=True)
    f.write("\n")
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


class ProbeRowsBuilder:
  """Collects validated rows chunk by chunk into preallocated columns, then groups and sorts.

  `capacity` bounds the rows (the input files' row count); memory is about 35 bytes per
  row plus the sort's 16, whatever the chunking.
  """

  def __init__(self, capacity: int, *, hashed: bool):
    self.size = 0
    self.probe = np.empty(capacity, dtype=np.int32)
    self.dst = np.empty((capacity, 16), dtype=np.uint8)
    self.seconds = np.empty(capacity, dtype=np.int64)
    self.rtt_bytes = np.empty((capacity, 2), dtype=np.uint8)
    self.failed = np.empty(capacity, dtype=np.bool_)
    self.rtt_ms = np.empty(capacity, dtype=np.float32)
    self.hashed_order = np.empty((capacity, 2), dtype=np.uint8) if hashed else None
    self._probe_keys = pa.array([], pa.binary(17))  # (version, address) of each probe id

  def add(self, columns: schema.RawColumns) -> None:
    """Append one chunk of validated rows."""
    n = len(columns)
    lo, hi = self.size, self.size + n
    if hi > len(self.seconds):
      raise ValueError(f"more rows than the capacity {len(self.seconds)}")
    self.probe[lo:hi] = self._probe_of(columns.version, columns.src)
    self.dst[lo:hi] = columns.dst
    self.seconds[lo:hi] = columns.seconds
    self.rtt_bytes[lo:hi], self.failed[lo:hi] = tokenizer.rtt_bytes(columns.rtt)
    self.rtt_ms[lo:hi] = columns.rtt
    if self.hashed_order is not None:
      self.hashed_order[lo:hi] = tokenizer.hashed_order_pairs(
        columns.src_text, columns.dst_text, columns.seconds
      )
    self.size = hi

  def _probe_of(self, version: np.ndarray, src: np.ndarray) -> np.ndarray:
    """Probe ids (in order of first sight) of rows: (version, source address) → int."""
    n = len(version)
    keys = np.empty((n, 17), dtype=np.uint8)
    keys[:, 0] = version
    keys[:, 1:] = src
    # Arrow's hash lookup of 17-byte values: one pass in C++, no sort, no Python per row.
    rows = pa.Array.from_buffers(pa.binary(17), n, [None, pa.py_buffer(keys)])
    found = pc.index_in(rows, value_set=self._probe_keys)
    if found.null_count:
      new = pc.unique(rows.filter(found.is_null()))
      self._probe_keys = pa.concat_arrays([self._probe_keys, new])
      found = pc.index_in(rows, value_set=self._probe_keys)
    return found.to_numpy(zero_copy_only=False).astype(np.int32)

  def finish(self) -> ProbeRows:
    """The rows grouped by probe (ordered by version, address), time-sorted within a probe.

    Call once: each column is released as soon as its sorted copy exists.
    """
    n = self.size
    known = self._probe_keys
    keys = np.frombuffer(known.buffers()[1], dtype=np.uint8)
    keys = keys[known.offset * 17 : (known.offset + len(known)) * 17].reshape(-1, 17)
    probe_order = np.lexsort(keys.T[::-1])  # bytewise: version, then address
    rank = np.empty(len(probe_order), dtype=np.int32)
    rank[probe_order] = np.arange(len(probe_order), dtype=np.int32)
    probe = rank[self.probe[:n]]
    self.probe = None
    perm = self._row_order(probe, self.seconds[:n])
    sizes = np.bincount(probe, minlength=len(keys))
    del probe
    offsets = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    keys = keys[probe_order]
    columns = {}
    for name in ROW_ARRAYS:
      column = getattr(self, name)
      columns[name] = None if column is None else take_rows(column[:n], perm)
      setattr(self, name, None)
    return ProbeRows(
      probe_offsets=offsets,
      probe_src=np.ascontiguousarray(keys[:, 1:]),
      probe_version=np.ascontiguousarray(keys[:, 0]),
      **columns,
    )

  def _row_order(self, probe: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Row permutation by (probe, seconds), ties broken by the rows' content.

    Ties (same probe and second) are ordered by destination, RTT and hashed order, so the
    result does not depend on the order the rows arrived in.
    """
    n = len(probe)
    if n == 0:
      return np.zeros(0, dtype=np.int64)
    # Dumps are sorted by time and listed in time order, so a stable sort by probe alone
    # usually leaves each probe's rows in time order; numpy radix-sorts 16-bit keys.
    small = probe.astype(np.uint16) if int(probe.max()) < 2**16 else probe
    perm = np.argsort(small, kind="stable")
    del small
    tie = self._ties(probe, seconds, perm)
    if tie is None:  # not time-ordered within a probe: sort by (probe, seconds)
      span = int(seconds.max()) - int(seconds.min())
      if int(probe.max()) < 2**29 and span < 2**34:
        key = (probe.astype(np.uint64) << np.uint64(34)) | (seconds - seconds.min()).astype(
          np.uint64
        )
        perm = np.argsort(key)
        del key
      else:
        perm = np.lexsort((seconds, probe))
      tie = self._ties(probe, seconds, perm)
    if not tie.any():
      return perm
    in_tie = np.zeros(n, dtype=bool)
    in_tie[1:] |= tie
    in_tie[:-1] |= tie
    where = np.flatnonzero(in_tie)
    run = np.cumsum(~np.concatenate([[False], tie])[where])  # one id per run of equal keys
    rows = perm[where]
    dst = take_rows(self.dst, rows).view(">u8")
    content = [dst[:, 1], dst[:, 0], self.rtt_ms[rows].view(np.uint32)]
    if self.hashed_order is not None:
      content = [take_rows(self.hashed_order, rows).view(np.uint16)[:, 0], *content]
    perm[where] = rows[np.lexsort((*content, run))]
    return perm

  @staticmethod
  def _ties(probe: np.ndarray, seconds: np.ndarray, perm: np.ndarray) -> np.ndarray | None:
    """bool [N-1]: row i+1 of `perm` has the same (probe, seconds) as row i; None if `perm`
    is not sorted by (probe, seconds)."""
    same_probe = probe[perm]
    same_probe = same_probe[1:] == same_probe[:-1]
    step = seconds[perm]
    step = np.diff(step)
    if (step[same_probe] < 0).any():
      return None
    return same_probe & (step == 0)
