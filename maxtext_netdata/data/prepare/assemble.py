"""The last step of prepare: sorted pieces (a bucket's, or a slice of it, in store order) → splits.

Each split's arrays are the pieces' arrays concatenated, less the rows of the other split:
with `network_split: probe` a probe is held out when its hash, as a fraction of 2^64, is below
`network_test_fraction`; with `time`, every row at or after the `1 - fraction` quantile of
time (numpy's "higher" quantile over all rows, `time_cutoff`).
Memory holds one piece's column at a time plus per-probe arrays, whatever the store's size.
Each split also gets its probe statistics (`store.STATS_ARRAYS`), counted as its rows go by,
so no reader has to scan the store for them.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from maxtext_netdata.data.store import dst_table, store


def assemble(pieces: list[str], out: str, split: str, fraction: float, meta: dict) -> dict:
  """Write the splits of the piece folders `pieces` under `out`; their counts by split name.

  `split` is "probe" or "time" (train/ and test/ folders) or "all" (one eval/ folder).
  """
  # Pieces are read, not memory-mapped: mapped pages would count in this process's RSS
  # until unmapped, and they add up to the whole store.
  opened = [_Piece(path) for path in pieces]
  hashed = bool(opened) and bool(opened[0].store.meta.get("hashed_order"))
  cutoff = time_cutoff(pieces, fraction) if split == "time" and fraction > 0 else None
  totals = dict.fromkeys(split_names(split), 0)
  for piece in opened:
    for name, rows in split_rows(piece, split, fraction, cutoff).items():
      totals[name] += piece.num_rows if rows is None else len(rows)
  assembler = Assembler(out, split, fraction, meta, totals, hashed, cutoff)
  with assembler:
    for piece in opened:
      assembler.add(piece)
  return assembler.finish()


def split_names(split: str) -> tuple[str, ...]:
  return ("eval",) if split == "all" else ("train", "test")


def held_out(probe_hash: np.ndarray, fraction: float) -> np.ndarray:
  """bool [P]: the probes of these hashes that `network_split: probe` puts in the test split."""
  return probe_hash.astype(np.float64) / 2.0**64 < fraction


def split_rows(piece, split: str, fraction: float, cutoff: int | None) -> dict:
  """Each split's rows of `piece` (indices), None where a split takes all of them."""
  if split == "all":
    return {"eval": None}
  if split == "probe":
    held = held_out(piece.probe_array("probe_hash"), fraction)
    test = np.repeat(held, np.diff(piece.probe_array("probe_offsets")))
  elif cutoff is not None:
    test = piece.column("seconds") >= cutoff
  else:
    test = np.zeros(piece.num_rows, dtype=bool)
  if not test.any():
    return {"train": None, "test": np.zeros(0, np.int64)}
  if test.all():
    return {"train": np.zeros(0, np.int64), "test": None}
  return {"train": np.flatnonzero(~test), "test": np.flatnonzero(test)}


class _Piece:
  """A piece folder (`shards.write_piece`), with `shards.SortedBucket`'s reading methods."""

  def __init__(self, path: str):
    self.path = path
    self.store = store.PreparedStore(path)  # its meta.json only
    self.num_rows, self.num_probes = self.store.num_rows, self.store.num_probes

  def probe_array(self, name: str) -> np.ndarray:
    return _load(self.path, name)

  @functools.cached_property
  def dst_table(self) -> np.ndarray:
    return _load(self.path, dst_table.TABLE)

  def column(self, name: str, rows: np.ndarray | None = None) -> np.ndarray:
    array = _load(self.path, name)
    return array if rows is None else store.take_rows(array, rows)

  def column_into(self, name: str, rows: np.ndarray | None, out: np.ndarray) -> None:
    array = _load(self.path, name)
    if rows is None:
      out[...] = array
    else:
      store.take_rows(array, rows, out=out)


class Assembler:
  """Sorted pieces, added in bucket order, streamed into the splits' files.

  `totals` (rows of each split over all pieces) sizes the files up front. A piece is a
  `shards.SortedBucket` or a piece folder read back; both give the same bytes.
  """

  def __init__(self, out, split, fraction, meta, totals, hashed, cutoff=None):
    self.split, self.fraction, self.cutoff, self.meta = split, fraction, cutoff, meta
    self.hashed = hashed
    self.row_names = [n for n in store.ROW_ARRAYS if hashed or n != "hashed_order"]
    self.writers = {}
    for name in split_names(split):
      self.writers[name] = SplitWriter(os.path.join(out, name), totals[name], self.row_names)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    for writer in self.writers.values():
      writer.close()

  def add(self, piece) -> None:
    chosen = split_rows(piece, self.split, self.fraction, self.cutoff)
    sizes = np.diff(piece.probe_array("probe_offsets"))
    src, version = piece.probe_array("probe_src"), piece.probe_array("probe_version")
    probe_of_row = None
    for name, rows in chosen.items():
      if rows is not None and len(rows) and probe_of_row is None:
        probe_of_row = np.repeat(np.arange(piece.num_probes), sizes)
      split_sizes = (
        sizes
        if rows is None
        else np.bincount(probe_of_row[rows], minlength=piece.num_probes)
        if len(rows)
        else np.zeros(piece.num_probes, np.int64)
      )
      self.writers[name].add_probes(split_sizes, src, version)
    del probe_of_row
    for column in self.row_names:
      for name, rows in chosen.items():
        count = piece.num_rows if rows is None else len(rows)
        if column == "dst" and isinstance(piece, _Piece):  # its indices, mapped to the split's
          index = piece.column(dst_table.INDEX, rows)
          self.writers[name].add_dst([(index, piece.dst_table, piece.path)])
          continue
        self.writers[name].add_rows(
          column, count, functools.partial(piece.column_into, column, rows)
        )

  def finish(self) -> dict:
    return {
      name: writer.finish({**self.meta, "split": name}, self.hashed)
      for name, writer in self.writers.items()
    }


def _load(piece: str, name: str) -> np.ndarray:
  return np.load(os.path.join(piece, f"{name}.npy"))


def probe_key(version: np.ndarray, src: np.ndarray, i: int) -> tuple[int, bytes]:
  """The key of probe `i` of probe arrays `version`, `src`: the same key, the same probe."""
  return int(version[i]), bytes(src[i])


def distinct_probes(pieces: list[str]) -> int:
  """Probes in the piece folders `pieces` (in store order): a probe that runs on from one
  piece into the next (a bucket sorted in slices) counts once."""
  total, last = 0, None
  for path in pieces:
    src, version = _load(path, "probe_src"), _load(path, "probe_version")
    if len(version):
      total += len(version) - (last == probe_key(version, src, 0))
      last = probe_key(version, src, -1)
  return total


def time_cutoff(pieces: list[str], fraction: float) -> int:
  """`np.quantile(all seconds, 1 - fraction, method="higher")` of the pieces' rows, exactly.

  Each piece's seconds are read once and counted by hour; then, in the hour that holds the
  quantile, its seconds are counted from each probe's rows in that hour alone (a binary search
  in the probe's time-sorted rows of a memory map: a few pages a probe). A union of each
  piece's distinct seconds, the way this was first done, cost ~0.47 CPU-s a piece with a
  month's ~2.7M distinct seconds: ~2.3 CPU-hours at RIPE Atlas's ~17,500 pieces.
  """
  hours = np.zeros(store.SECONDS_MAX // 3600 + 1, np.int64)  # rows by hour since 1970: 9.5 MB
  for piece in pieces:
    hour = _load(piece, "seconds") // 3600
    if len(hour):
      low = int(hour.min())
      counts = np.bincount(hour - low)
      hours[low : low + len(counts)] += counts
  ends = np.cumsum(hours)
  n = int(ends[-1])
  if not n:
    return 0  # no rows: no cutoff to find
  index = quantile_index(n, fraction)
  at = int(np.searchsorted(ends, index, side="right"))  # the hour of row `index` in time order
  before = int(ends[at - 1]) if at else 0
  start = at * 3600
  seconds = np.zeros(3600, np.int64)
  for piece in pieces:
    column = np.load(os.path.join(piece, "seconds.npy"), mmap_mode="r")
    offsets = _load(piece, "probe_offsets")
    lo = search_ranges(column, offsets[:-1], offsets[1:], start, right=False)
    hi = search_ranges(column, lo, offsets[1:], start + 3599, right=True)
    sizes = hi - lo
    if sizes.sum():
      rows = np.repeat(lo - np.cumsum(sizes) + sizes, sizes) + np.arange(sizes.sum())
      seconds += np.bincount(np.asarray(column[rows]) - start, minlength=3600)
    del column
  return start + int(np.searchsorted(np.cumsum(seconds), index - before, side="right"))


def quantile_index(n: int, fraction: float) -> int:
  """The row, in time order, of `n` rows that the time split's cutoff is the second of: numpy's
  index for the "higher" quantile 1 - fraction (numpy >= 1.22), the same float64 product,
  ceil((n - 1) q)."""
  return int(min(max(np.ceil((n - 1) * (1.0 - fraction)), 0), n - 1))


def search_ranges(seconds, lo: np.ndarray, hi: np.ndarray, value, *, right: bool) -> np.ndarray:
  """For each range [lo[p], hi[p]) of non-decreasing `seconds` (a memory map: only the rows
  looked at are read), the first row whose second is >= `value` (> `value` if `right`; one
  value, or one per range): a binary search in all ranges at once, ~log2(rows) reads of one
  row per range."""
  lo, hi = lo.copy(), hi.copy()
  value = np.broadcast_to(np.asarray(value), lo.shape)
  while True:
    active = np.flatnonzero(lo < hi)
    if not len(active):
      return lo
    mid = (lo[active] + hi[active]) // 2
    at = np.asarray(seconds[mid])
    below = at <= value[active] if right else at < value[active]
    lo[active[below]] = mid[below] + 1
    hi[active[~below]] = mid[~below]


class SplitWriter:
  """One split folder: row arrays written in place into preallocated .npy files, probes
  gathered.

  Rows are gathered straight into a memory map of the file's next rows (`add_rows`), one
  piece's column at a time, and unmapped at once: no gathered copy, no write() copying it
  again into page cache, and at most one piece's column mapped.
  """

  def __init__(self, path: str, rows: int, names: list[str]):
    os.makedirs(path, exist_ok=True)
    self.path = path
    self.rows = rows
    self.files, self.starts, self.written = {}, {}, dict.fromkeys(names, 0)
    self.dst = dst_table.DstEncoder()  # the split's table of destinations (column "dst")
    for name in names:
      dtype, tail = _file_kind(name)
      f = open(os.path.join(path, f"{_file_name(name)}.npy"), "wb")  # noqa: SIM115 (closed in close)
      header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False}
      np.lib.format.write_array_header_1_0(f, {**header, "shape": (rows, *tail)})
      self.starts[name] = f.tell()
      store.reserve(f, rows * np.dtype(dtype).itemsize * int(np.prod(tail, dtype=np.int64)))
      self.files[name] = f
    self.sizes, self.src, self.version = [], [], []
    self.failed = 0
    self.counter = store.ProbeCounter()
    self.piece_sizes = np.zeros(0, np.int64)
    self.last = None  # the key (version byte, address) of the last probe written
    self.continues = False

  def add_probes(self, sizes: np.ndarray, src: np.ndarray, version: np.ndarray) -> None:
    """The probes of the next piece; `add_rows` then brings their rows, column by column.

    A piece whose first probe is the last one written (the same key: a bucket sorted in
    slices, `bucket_sort.Slicer`) goes on with that probe's rows."""
    present = np.flatnonzero(sizes > 0)
    self.piece_sizes = sizes[present]
    if not len(present):
      self.continues = False
      return
    first, last = present[0], present[-1]
    self.continues = self.last == probe_key(version, src, first)
    self.last = probe_key(version, src, last)
    skip = int(self.continues)
    store.extend_probes(self.sizes, self.piece_sizes, self.continues)
    if len(present) > skip:
      self.src.append(src[present[skip:]])
      self.version.append(version[present[skip:]])

  def add_rows(self, name: str, rows: int, fill) -> None:
    """The next `rows` rows of column `name`, written by `fill(out)` into `out` (for "dst",
    16-byte addresses, kept as indices into the split's table)."""
    if not rows:
      return
    if name == "dst":
      dst = np.empty((rows, 16), np.uint8)
      fill(dst)
      self.add_dst([(dst, None, None)])
      return
    out = self._next_rows(name, rows)
    fill(out)
    if name == "rtt_bytes":
      failed = store.failed_of(out)
      self.failed += int(np.count_nonzero(failed))
      self.counter.add_failed(failed, self.piece_sizes, self.continues)
    elif name == "seconds":
      self.counter.add_seconds(out, self.piece_sizes, self.continues)
    self.written[name] += rows
    del out  # unmapped: the pages are page cache now, written back by the kernel

  def add_dst(self, parts) -> None:
    """The next rows' destinations, from `parts` in order: (16-byte addresses, None, None),
    or (indices, the table they index, a name for that table[, rows past the table]:
    `DstEncoder.encode_from`)."""
    rows = sum(len(part[0]) for part in parts)
    if not rows:
      return
    out, at = self._next_rows("dst", rows), 0
    for array, table, source, *extra in parts:
      n = len(array)
      if n:
        if table is None:
          out[at : at + n] = self.dst.encode(array)
        else:
          extra = extra[0] if extra else None
          self.dst.encode_from(array, table, source, out=out[at : at + n], extra=extra)
        at += n
    self.written["dst"] += rows
    del out

  def _next_rows(self, name: str, rows: int) -> np.ndarray:
    """A writable map of column `name`'s next `rows` rows in its file."""
    dtype, tail = _file_kind(name)
    row_bytes = np.dtype(dtype).itemsize * int(np.prod(tail, dtype=np.int64))
    self.files[name].flush()
    return np.memmap(
      self.files[name].name,
      dtype=dtype,
      mode="r+",
      offset=self.starts[name] + self.written[name] * row_bytes,
      shape=(rows, *tail),
    )

  def close(self) -> None:
    for f in self.files.values():
      f.close()

  def finish(self, meta: dict, hashed: bool) -> dict:
    sizes = np.concatenate(self.sizes) if self.sizes else np.zeros(0, np.int64)
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    assert offsets[-1] == self.rows, (self.path, offsets[-1], self.rows)
    src = np.concatenate(self.src) if self.src else np.zeros((0, 16), np.uint8)
    version = np.concatenate(self.version) if self.version else np.zeros(0, np.uint8)
    store.save_array(os.path.join(self.path, "probe_offsets.npy"), offsets)
    store.save_array(os.path.join(self.path, "probe_src.npy"), np.ascontiguousarray(src))
    store.save_array(os.path.join(self.path, "probe_version.npy"), version)
    if "dst" in self.files:
      store.save_array(os.path.join(self.path, f"{dst_table.TABLE}.npy"), self.dst.table())
    for name, counts in zip(store.STATS_ARRAYS, self.counter.counts(), strict=True):
      assert counts.shape == (len(sizes),), (self.path, name, counts.shape)
      store.save_array(os.path.join(self.path, f"{name}.npy"), counts)
    counts = {"rows": self.rows, "probes": len(sizes), "failed": self.failed}
    store.write_json(
      os.path.join(self.path, store.META_FILE),
      {
        **meta,
        "format_version": store.FORMAT_VERSION,
        "num_rows": counts["rows"],
        "num_probes": counts["probes"],
        "num_failed": counts["failed"],
        "hashed_order": hashed,
      },
    )
    return counts


def _file_name(name: str) -> str:
  """The file of row column `name` (`store.ROW_FILES`)."""
  return dst_table.INDEX if name == "dst" else name


def _file_kind(name: str) -> tuple:
  """(dtype, trailing shape) of row column `name`'s file."""
  return store.ROW_FILES[_file_name(name)]
