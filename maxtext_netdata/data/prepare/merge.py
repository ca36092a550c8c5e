"""The merge of a store update (`data.prepare.append`): split folders (a base's and a delta's,
the new files prepared alone) into one split in store order, each folder's rows within a
window of time (the base's when files leave it; each side of a time split's cutoff,
`data.prepare.time_merge`), read with plain reads and written through a memory map of the
new split's files, memory bounded by batches of at most a bucket's rows.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import shutil

import numpy as np
import tqdm

from maxtext_netdata.data.prepare import assemble, bucket_sort, partition, probes
from maxtext_netdata.data.raw import probe_hash
from maxtext_netdata.data.store import dst_table, store
from maxtext_netdata.errors import DataError, WritesTo


def merge_split(
  sources: list[tuple[str, tuple | None]], out: str, meta: dict, *, batch_rows: int, bar=None
) -> dict:
  """Write split folder `out` holding the rows of the split folders `sources` gives, each with
  its window of time (first, last second; None for no bound, or for none at all: every row),
  in store order; its counts ({"rows", "probes", "failed"}). A folder may be absent (no rows).
  """
  sources = [SplitSource(path, window) for path, window in sources if os.path.isdir(path)]
  try:
    hashed = any(s.hashed for s in sources)
    names = [n for n in store.ROW_ARRAYS if hashed or n != "hashed_order"]
    union = ProbeUnion(sources)
    tables = _Tables(sources)
    writer = assemble.SplitWriter(out, int(union.rows.sum()), names)
    try:
      for lo, hi in union.batches(batch_rows):
        if union.apart[lo:hi].all():
          segments = union.segments(lo, hi)
          writer.add_probes(union.rows[lo:hi].sum(axis=1), union.src[lo:hi], union.version[lo:hi])
          for name in names:
            if name == "dst":  # indices of the sources' tables, mapped to the new split's
              writer.add_dst([tables.indices(segments, int(union.rows[lo:hi].sum()))])
              continue
            fill = functools.partial(_copy_segments, sources, segments, name)
            writer.add_rows(name, int(union.rows[lo:hi].sum()), fill)
        else:  # some probe's new rows fall between its old ones: only those times sorted
          parts = union.parts(lo, hi)
          merged = bucket_sort.order_bucket(parts.middle_chunks(names))
          middle = np.diff(merged.probe_offsets)
          sizes = parts.head[:, 2] + parts.tail[:, 2]
          sizes[parts.has_middle] += middle
          writer.add_probes(sizes, union.src[lo:hi], union.version[lo:hi])
          for name in names:
            if name == "dst":
              writer.add_dst([parts.dst_indices(merged, tables, int(sizes.sum()))])
              continue
            fill = functools.partial(parts.fill, merged, name)
            writer.add_rows(name, int(sizes.sum()), fill)
          del merged
        if bar is not None:
          bar.update(int(union.rows[lo:hi].sum()))
    finally:
      writer.close()
    return writer.finish(meta, hashed)
  finally:
    for source in sources:
      source.close()


def link_split(base: str, out: str, meta: dict) -> dict:
  """Split folder `out` as a copy of `base` (its arrays hard-linked where the filesystem
  allows, copied where not) with `meta` in its meta.json; its counts."""
  os.makedirs(out, exist_ok=True)
  for path in sorted(glob.glob(os.path.join(glob.escape(base), "*.npy"))):
    link_file(path, os.path.join(out, os.path.basename(path)))
  with open(os.path.join(base, store.META_FILE), encoding="utf-8") as f:
    base_meta = json.load(f)
  keep = ("format_version", "num_rows", "num_probes", "num_failed", "hashed_order")
  store.write_json(os.path.join(out, store.META_FILE), {**meta, **{k: base_meta[k] for k in keep}})
  return {
    "rows": base_meta["num_rows"],
    "probes": base_meta["num_probes"],
    "failed": base_meta["num_failed"],
  }


def link_file(path: str, target: str) -> None:
  """`target` as a hard link to `path` where the filesystem allows, else a copy: a store's
  arrays are never written again, so sharing them is safe."""
  try:
    os.link(path, target)
  except OSError:
    with WritesTo(target):
      shutil.copyfile(path, target)


def merge_bar(rows: int, progress: bool):
  return tqdm.tqdm(
    total=rows, desc="prepare: merge", unit="row", unit_scale=True, disable=not progress
  )


class SplitSource:
  """One split folder being merged: its probes in memory, its rows read as needed; with a
  `window` (first, last second), only each probe's rows within it, and only the probes with
  such rows. Probe p's rows are [starts[p], starts[p] + sizes[p]).

  The row files are opened once, so a store removed meanwhile (a forced rebuild of the
  base) is still read whole: its files live until closed.
  """

  def __init__(self, path: str, window: tuple | None = None):
    split = store.PreparedStore(path)
    self.path = path
    self.hashed = bool(split.meta.get("hashed_order"))
    offsets = np.array(split.probe_offsets)
    self.starts, stops = offsets[:-1], offsets[1:]
    keys = probe_hash.probe_keys(np.array(split.probe_version), np.array(split.probe_src))
    if window is not None:
      # A probe's rows are in time order: its rows in the window are one run.
      first, last = window
      if first is not None:
        self.starts = assemble.search_ranges(split.seconds, self.starts, stops, first, right=False)
      if last is not None:
        stops = assemble.search_ranges(split.seconds, self.starts, stops, last, right=True)
      present = stops > self.starts
      self.starts, stops, keys = self.starts[present], stops[present], keys[present]
    self.sizes = stops - self.starts
    self.keys = keys
    self.hashes = probes.probe_hashes(self.keys)
    assert (self.sizes > 0).all(), path
    # Each probe's first and last second: a few pages of the map, unmapped at once.
    self.first = split.seconds[self.starts].astype(np.int64)
    self.last = split.seconds[stops - 1].astype(np.int64)
    self.seconds = split.seconds  # mapped: binary searches read a few pages of it
    self.dst_table = np.array(split.dst_table)
    self.files = {}
    for name in store.ROW_FILES:
      array = getattr(split, name)  # checked for dtype and shape
      if array is not None:
        f = open(array.filename, "rb")  # noqa: SIM115 (closed in close)
        self.files[name] = (f, array.offset)
    del split

  def read_into(self, name: str, start: int, out: np.ndarray) -> None:
    """Rows [start, start + len(out)) of column `name` into `out` (a destination decoded to
    its 16 bytes)."""
    if name == "dst":
      dst_table.decode(self.dst_table, self.read_index(start, len(out)), out=out)
      return
    self._read(name, start, out)

  def read_index(self, start: int, rows: int) -> np.ndarray:
    """The destination indices (into `dst_table`) of rows [start, start + rows)."""
    out = np.empty(rows, dst_table.INDEX_DTYPE)
    self.read_into_index(start, out)
    return out

  def read_into_index(self, start: int, out: np.ndarray) -> None:
    """The destination indices of rows [start, start + len(out)) into `out`."""
    self._read(dst_table.INDEX, start, out)

  def _read(self, name: str, start: int, out: np.ndarray) -> None:
    """Rows [start, start + len(out)) of file `name` into `out`; converted when `out` is of
    another type than the file (the seconds: uint32 in a file, int64 as prepare sorts them)."""
    dtype = store.ROW_FILES[name][0]
    if out.dtype != dtype:
      rows = np.empty(out.shape, dtype)
      self._read(name, start, rows)
      out[...] = rows
      return
    f, offset = self.files[name]
    f.seek(offset + start * (out.nbytes // max(len(out), 1)))
    if f.readinto(memoryview(out).cast("B")) != out.nbytes:
      raise OSError(f"{f.name}: shorter than its header says")

  def ranges_chunk(
    self, probes: np.ndarray, starts: np.ndarray, sizes: np.ndarray, names: list[str]
  ) -> partition.Chunk:
    """Rows [starts[k], starts[k] + sizes[k]) of each probe `probes[k]` (in store order), as
    a `partition.Chunk`."""
    runs = _joined((0, start, n) for start, n in zip(starts.tolist(), sizes.tolist(), strict=True))
    rows = int(sizes.sum())
    columns = {}
    for name in names:
      dtype, tail = store.ROW_ARRAYS[name]
      columns[name] = np.empty((rows, *tail), dtype)
      at = 0
      for _, start, n in runs:
        self.read_into(name, start, columns[name][at : at + n])
        at += n
    probe = np.repeat(np.arange(len(probes), dtype=np.int32), sizes)
    return partition.Chunk(self.keys[probes], self.hashes[probes], probe, columns)

  def close(self) -> None:
    for f, _ in self.files.values():
      f.close()


class _Tables:
  """The sources' destination tables as one (`table`: each source's entries, in source
  order), so that a batch's indices, from whichever source, are mapped into the new split's
  table in one `SplitWriter.add_dst` call: mapped a segment at a time (a probe's run of one
  source), the calls' own cost was ~20 us each, a third of a merge of 11k-row probes."""

  def __init__(self, sources: list[SplitSource]):
    self.sources = sources
    sizes = [len(s.dst_table) for s in sources]
    self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    if self.offsets[-1] >= 2**32:
      raise DataError("the merged stores' destination tables exceed 2^32 entries")
    empty = np.zeros((0, 16), np.uint8)
    self.table = np.concatenate([s.dst_table for s in sources]) if sources else empty
    self.name = "the merged splits' tables"  # the one name of `table` (its map is kept)

  def indices(self, segments, rows: int) -> tuple:
    """The (source, first row, rows) `segments`' destinations as indices into `table`, as a
    part of `SplitWriter.add_dst`. An index past its source's table is a DataError naming
    that source's folder."""
    out, at = np.empty(rows, dst_table.INDEX_DTYPE), 0
    for i, start, n in segments:
      self.read(i, start, out[at : at + n])
      at += n
    assert at == rows, (at, rows)
    return out, self.table, self.name

  def read(self, i: int, start: int, out: np.ndarray) -> None:
    """Source `i`'s rows [start, start + len(out))'s destinations as indices into `table`."""
    source = self.sources[i]
    source.read_into_index(start, out)
    if len(out) and int(out.max()) >= len(source.dst_table):
      raise DataError(
        f"{source.path}: a destination index past its table of {len(source.dst_table)};"
        " prepare it again"
      )
    out += dst_table.INDEX_DTYPE(self.offsets[i])


class ProbeUnion:
  """The probes of all sources in store order (`bucket_sort.order_bucket`'s: hash, version,
  address), each once: `index` [G, S] is its number in each source (-1: not there), `rows`
  [G, S] its rows there, and `apart` [G] whether its rows of different sources do not
  interleave in time (then each source's rows are copied whole, the earliest first)."""

  def __init__(self, sources: list[SplitSource]):
    self.sources = sources
    keys = np.concatenate([s.keys for s in sources])
    hashes = np.concatenate([s.hashes for s in sources])
    which = np.concatenate([np.full(len(s.keys), i) for i, s in enumerate(sources)])
    local = np.concatenate([np.arange(len(s.keys)) for s in sources])
    # The build's own probe numbering (`bucket_sort.order_bucket`'s): the same order by construction.
    group, probe_keys, _ = bucket_sort.probe_ranks(keys, hashes)
    groups = len(probe_keys)
    self.version = np.ascontiguousarray(probe_keys[:, 0])
    self.src = np.ascontiguousarray(probe_keys[:, 1:])
    self.index = np.full((groups, len(sources)), -1, np.int64)
    self.index[group, which] = local
    self.rows = np.zeros((groups, len(sources)), np.int64)
    self.first = first = np.full((groups, len(sources)), np.iinfo(np.int64).max)
    self.last = last = np.full((groups, len(sources)), np.iinfo(np.int64).min)
    for i, s in enumerate(sources):
      there = self.index[:, i] >= 0
      probe = self.index[there, i]
      self.rows[there, i] = s.sizes[probe]
      first[there, i], last[there, i] = s.first[probe], s.last[probe]
    # Sources by their first second: apart when each one's last comes before the next's first.
    self.by_time = np.argsort(first, axis=1, kind="stable")
    first_sorted = np.take_along_axis(first, self.by_time, axis=1)
    last_sorted = np.take_along_axis(last, self.by_time, axis=1)
    present = np.take_along_axis(self.index, self.by_time, axis=1) >= 0
    ok = ~present[:, 1:] | (last_sorted[:, :-1] < first_sorted[:, 1:])
    self.apart = ok.all(axis=1)

  def batches(self, batch_rows: int):
    """(lo, hi) group ranges of about `batch_rows` rows each (a probe is never cut)."""
    total = self.rows.sum(axis=1)
    before = np.cumsum(total) - total
    batch = before // batch_rows
    cuts = np.flatnonzero(np.diff(batch)) + 1
    bounds = [0, *cuts.tolist(), len(total)]
    return [(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True) if hi > lo]

  def segments(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
    """(source, first row, rows) runs that make up groups [lo, hi) in order, where `apart`:
    each group's sources by time; neighbouring runs of one source joined."""
    return _joined(
      (int(i), int(self.sources[i].starts[self.index[g, i]]), int(self.rows[g, i]))
      for g in range(lo, hi)
      for i in self.by_time[g]
      if self.index[g, i] >= 0
    )

  def parts(self, lo: int, hi: int) -> _Parts:
    """Groups [lo, hi) as a head, a middle and a tail each (`_Parts`)."""
    return _Parts(self, lo, hi)


class _Parts:
  """Each group's rows as three parts in store order: a head, the rows of the source that
  starts first from before any other source's first second; a tail, the rows of the source
  that ends last from after every other's last second; and between them the middle, the rows
  of all sources whose times overlap, the only ones sorted again (`bucket_sort.order_bucket`).
  A day appended whose late results fall in the base's last day sorts about a day of rows
  per probe, not the probe's whole window; a probe in one source, or whose sources do not
  interleave, is a head alone.

  `head` and `tail` are [G, 3] (source, first row, rows); `middle` [G, S, 2] (first row, rows)
  in each of the S sources; `has_middle` [G] whether a group has middle rows.
  """

  def __init__(self, union: ProbeUnion, lo: int, hi: int):
    self.union, self.lo = union, lo
    groups = hi - lo
    index, rows = union.index[lo:hi], union.rows[lo:hi]
    self.head = np.zeros((groups, 3), np.int64)
    self.tail = np.zeros((groups, 3), np.int64)
    self.middle = np.zeros((groups, len(union.sources), 2), np.int64)
    one = (index >= 0).sum(axis=1) == 1
    for i, source in enumerate(union.sources):
      alone = one & (index[:, i] >= 0)
      self.head[alone] = np.stack(
        [np.full(alone.sum(), i), source.starts[index[alone, i]], rows[alone, i]], axis=1
      )
    many = np.flatnonzero(~one)
    if len(many):
      self._split(many, index[many], rows[many])
    self.has_middle = self.middle[:, :, 1].sum(axis=1) > 0

  def _split(self, many, index, rows):
    """Head, middle and tail of the groups `many` (in two sources or more); `index` and
    `rows` theirs ([M, S]: -1 and 0 where a source does not hold the group)."""
    union = self.union
    g = many + self.lo
    k = np.arange(len(many))
    starts = np.zeros(index.shape, np.int64)  # 0 where a source does not hold the group
    for i, source in enumerate(union.sources):
      there = index[:, i] >= 0
      starts[there, i] = source.starts[index[there, i]]
    stops = starts + rows
    by_time = union.by_time[g]  # sources by first second, absent ones last
    early = by_time[:, 0]
    next_first = union.first[g, by_time[:, 1]]  # the first second of any other source
    last = union.last[g]  # absent: int64's least
    ender = np.argmax(last, axis=1)  # the source that ends last
    others = last.copy()
    others[k, ender] = np.iinfo(np.int64).min
    others_last = others.max(axis=1)  # the last second of any other source
    head_end = np.empty(len(many), np.int64)
    tail_start = np.empty(len(many), np.int64)
    for i, source in enumerate(union.sources):
      # Head: the early source's rows before any other's first second.
      mine = early == i
      head_end[mine] = assemble.search_ranges(
        source.seconds, starts[mine, i], stops[mine, i], next_first[mine], right=False
      )
      # Tail: the last-ending source's rows after every other's last second.
      mine = ender == i
      tail_start[mine] = assemble.search_ranges(
        source.seconds, starts[mine, i], stops[mine, i], others_last[mine], right=True
      )
    self.head[many] = np.stack([early, starts[k, early], head_end - starts[k, early]], axis=1)
    self.tail[many] = np.stack([ender, tail_start, stops[k, ender] - tail_start], axis=1)
    # Middle: the rest of each source, between its head (early source) and tail (ender).
    first = starts.copy()
    first[k, early] = head_end
    end = stops.copy()
    end[k, ender] = np.minimum(end[k, ender], tail_start)
    self.middle[many, :, 0] = first
    self.middle[many, :, 1] = np.maximum(end - first, 0)

  def middle_chunks(self, names: list[str]) -> list[partition.Chunk]:
    """The middle rows as one `partition.Chunk` per source."""
    out = []
    for i, source in enumerate(self.union.sources):
      groups = np.flatnonzero(self.middle[:, i, 1] > 0)
      if len(groups):
        local = self.union.index[self.lo + groups, i]
        out.append(
          source.ranges_chunk(local, self.middle[groups, i, 0], self.middle[groups, i, 1], names)
        )
    return out

  def fill(self, merged: bucket_sort.SortedBucket, name: str, out: np.ndarray) -> None:
    """Column `name` of the groups in store order into `out`: head, middle, tail of each."""
    sources = self.union.sources
    read = lambda i, start, part: sources[i].read_into(name, start, part)  # noqa: E731
    self._walk(merged.probe_offsets, merged.column(name), read, out)

  def dst_indices(self, merged: bucket_sort.SortedBucket, tables: _Tables, rows: int) -> tuple:
    """The groups' destinations as one part of `SplitWriter.add_dst`: the heads' and tails'
    as indices into the sources' joined table (`_Tables`), the middle's sorted addresses as
    rows past it (`DstEncoder.encode_from`'s `extra`), an entry a row. Decoding every row to
    16 bytes and hashing it again, as the middle's must be, cost ~30 ns a row where a merge
    whose probes have late results (every batch, with RIPE's dumps) spends ~3 on the
    others; the joined table is not copied for each batch (~14 MB at a month's ~300k
    destinations a source)."""
    middle = merged.column("dst")
    first = len(tables.table)
    if first + len(middle) >= 2**32:
      raise DataError("the merged stores' destination tables exceed 2^32 entries")
    out = np.empty(rows, dst_table.INDEX_DTYPE)
    entries = np.arange(first, first + len(middle), dtype=dst_table.INDEX_DTYPE)
    self._walk(merged.probe_offsets, entries, tables.read, out)
    return out, tables.table, tables.name, middle

  def _walk(self, offsets, middle: np.ndarray, read, out: np.ndarray) -> None:
    """Each group's head (`read(source, first row, out)`), middle (its rows of `middle`, by
    `offsets`) and tail into `out`, in store order."""
    at, k = 0, 0
    out = out.view(np.ndarray)  # a memory map's slices are memmap objects: ~4 us each
    for g in range(len(self.head)):
      i, start, n = (int(x) for x in self.head[g])
      if n:
        read(i, start, out[at : at + n])
        at += n
      if self.has_middle[g]:
        n = int(offsets[k + 1] - offsets[k])
        out[at : at + n] = middle[offsets[k] : offsets[k + 1]]
        at, k = at + n, k + 1
      i, start, n = (int(x) for x in self.tail[g])
      if n:
        read(i, start, out[at : at + n])
        at += n
    assert at == len(out), (at, len(out))


def _copy_segments(sources, segments, name: str, out: np.ndarray) -> None:
  out, at = out.view(np.ndarray), 0  # as in `_Parts.fill`
  for i, start, n in segments:
    sources[i].read_into(name, start, out[at : at + n])
    at += n
  assert at == len(out), (at, len(out))


def _joined(runs) -> list[tuple[int, int, int]]:
  """(source, start, rows) runs with each run that starts where the one before it in the same
  source ends joined to it."""
  out = []
  for source, start, n in runs:
    if out and out[-1][0] == source and out[-1][1] + out[-1][2] == start:
      out[-1] = (source, out[-1][1], out[-1][2] + n)
    else:
      out.append((source, start, n))
  return out
