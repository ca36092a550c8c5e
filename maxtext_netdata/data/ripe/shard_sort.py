"""`ingest`'s external sort: rows → time-sorted run files → merged into the shard files.

Shared by the built-in runner (`data.ripe.ingest`: runs of `run_rows` rows) and the Beam
runner (`data.ripe.beam_runner`: runs of one input file each). The merge orders equal times
by run order and the writer cuts row groups by row count alone, so the files depend on the
rows alone, not on how they were cut into runs, nor on the runner (docs/prepare.md).
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from maxtext_netdata.data.raw.layout import FILE_PATTERN, ROW_GROUP_SIZE, publish
from maxtext_netdata.data.ripe import reference
from maxtext_netdata.data.ripe.sample import probe_keys
from maxtext_netdata.errors import WritesTo

# Rows per row group of a run, read one group per run at a time while merging: the merge
# holds about 16k rows (~1.5 MB) per run, ~150 MB for the 100 runs of 200M rows.
_MERGE_BATCH = 16_384
# Columns written dictionary-encoded: the addresses (`prepare` reads them so, as `generate`
# writes them) and the few-valued integers. Times and rtts are mostly distinct: their
# dictionaries cost time to build (~20% of the writer's) to be dropped at the size limit.
_DICTIONARY = ["msm_id", "src_addr", "dst_addr", "ip_version", "prb_id"]
# Column statistics (min and max) for every column but the addresses: text order of
# addresses selects nothing a query wants, and their statistics were 15% of the writer's time.
_STATISTICS = ["msm_id", "event_time", "ip_version", "rtt", "prb_id"]


class ShardWriter:
  """`rows` rows in time order → `shards` parquet files; file k ends at row rows*(k+1)//shards.

  A local file is written under a temporary name and renamed; with a `filesystem` (a bucket's,
  `out_dir` a path in it) each file is written under its name: an object appears when closed.
  A failed write names the file in `shown_dir` (default `out_dir`): the folder the files are
  for, where `out_dir` is a staging folder inside it (`layout.stage`).
  """

  def __init__(self, out_dir: str, rows: int, shards: int, filesystem=None, shown_dir=None):
    self.out_dir, self.shards, self.filesystem = out_dir, shards, filesystem
    self.shown_dir = shown_dir or out_dir
    self.ends = [rows * (k + 1) // shards for k in range(shards)]
    self.paths: list[str] = []
    self.writer, self.tmp, self.written = None, None, 0
    self.pending, self.pending_rows = [], 0

  def write(self, table: pa.Table) -> None:
    """Writes whole row groups of ROW_GROUP_SIZE rows (a shard's last one: the rest) whatever
    the pieces given: the files are the same for one table or the merge's pieces, so they
    depend on the rows alone (not on how many runs the merge had, nor on the runner)."""
    self.pending.append(table)
    self.pending_rows += table.num_rows
    while self.pending_rows:
      room = self.ends[len(self.paths) - (self.writer is not None)] - self.written
      size = (
        room if self.pending_rows >= room else self.pending_rows // ROW_GROUP_SIZE * ROW_GROUP_SIZE
      )
      if size == 0:
        return
      ready = pa.concat_tables(self.pending)
      self.pending, self.pending_rows = [ready.slice(size)], self.pending_rows - size
      self._write(ready.slice(0, size))

  def _write(self, table: pa.Table) -> None:
    while table.num_rows:
      if self.writer is None:
        path = os.path.join(self.out_dir, FILE_PATTERN.format(len(self.paths), self.shards))
        self.paths.append(path)
        self.tmp = os.path.join(self.out_dir, f".tmp-{os.getpid()}-{os.path.basename(path)}")
        if self.filesystem is not None:
          self.tmp = path
        # Page checksums as `generate` writes them: `prepare` verifies them.
        self.writer = pq.ParquetWriter(
          self.tmp,
          reference.ROW_SCHEMA,
          use_dictionary=_DICTIONARY,
          write_statistics=_STATISTICS,
          write_page_checksum=True,
          filesystem=self.filesystem,
        )
      room = self.ends[len(self.paths) - 1] - self.written
      shown = os.path.join(self.shown_dir, os.path.basename(self.paths[-1]))
      with WritesTo(shown):
        self.writer.write_table(table.slice(0, room), row_group_size=ROW_GROUP_SIZE)
      self.written += min(room, table.num_rows)
      table = table.slice(room)
      if self.written == self.ends[len(self.paths) - 1]:
        with WritesTo(shown):
          self.writer.close()
        if self.filesystem is None:
          os.replace(self.tmp, self.paths[-1])
        self.writer, self.tmp = None, None

  def close(self) -> list[str]:
    if self.writer is not None or len(self.paths) != self.shards:
      raise AssertionError(f"wrote {self.written} of {self.ends[-1]} rows")
    return self.paths

  def abort(self) -> None:
    """Closes and removes the file being written (closing may fail again on a full disk)."""
    if self.writer is not None:
      with contextlib.suppress(OSError):
        self.writer.close()
    if self.tmp and self.filesystem is not None:
      with contextlib.suppress(OSError):
        self.filesystem.delete_file(self.tmp)
    elif self.tmp and os.path.exists(self.tmp):
      os.remove(self.tmp)


def sort_by_time(table: pa.Table) -> pa.Table:
  """Rows by time; equal times keep their order (Arrow's sort is stable).

  Rows already in time order (dumps written in time order, `generate`'s) are returned as
  they are: the check reads one integer column, the sort copies every column.
  """
  times = table.column("event_time").cast(pa.int64()).to_numpy()
  if (times[1:] >= times[:-1]).all():
    return table
  return table.take(pc.sort_indices(table, [("event_time", "ascending")]))


def write_run(tables, runs_dir: str, index: int, prefix: str = "run", filesystem=None) -> str:
  """`tables` sorted by time (`sort_by_time`) into `runs_dir`/`prefix`-`index`.parquet."""
  path = os.path.join(runs_dir, f"{prefix}-{index:05d}.parquet")
  table = sort_by_time(pa.concat_tables(tables))
  with WritesTo(path):
    pq.write_table(
      table,
      path,
      row_group_size=_MERGE_BATCH,
      compression="lz4",
      use_dictionary=_DICTIONARY,
      write_statistics=False,
      filesystem=filesystem,
    )
  return path


def merge(runs: list[str], filesystem=None):
  """The rows of time-sorted run files in time order, a bounded piece at a time: equal times
  in run order, then in their order in the run.

  So the rows come out as one stable sort of all runs' rows in run order would give them,
  however the rows were cut into runs (the built-in runner's runs of `run_rows`, the Beam
  runner's runs of one file). Each step takes the smallest last time among the runs' current
  batches (the bound): nothing later in any run comes before it. A run whose batches end at
  the bound is read on until past it, so every row at the bound is there to be ordered.
  """
  readers = [
    pq.ParquetFile(path, filesystem=filesystem).iter_batches(batch_size=_MERGE_BATCH)
    for path in runs
  ]

  def read(i: int) -> pa.Table | None:
    batch = next(readers[i], None)
    # Parquet has no seconds unit: runs come back in ms, the shards are written in seconds.
    return None if batch is None else pa.Table.from_batches([batch]).cast(reference.ROW_SCHEMA)

  def times_of(table: pa.Table) -> np.ndarray:
    return table.column("event_time").cast(pa.int64()).to_numpy()

  pending = {i: table for i in range(len(readers)) if (table := read(i)) is not None}
  while pending:
    times = {i: times_of(table) for i, table in pending.items()}
    bound = min(t[-1] for t in times.values())
    for i in list(pending):
      pieces = [pending[i]]
      while times[i][-1] == bound and (more := read(i)) is not None:
        pieces.append(more)
        times[i] = times_of(more)
      if len(pieces) > 1:
        pending[i] = pa.concat_tables(pieces)
        times[i] = times_of(pending[i])
    ready = []
    for i in list(pending):
      done = int(np.searchsorted(times[i], bound, side="right"))
      ready.append(pending[i].slice(0, done))
      rest = pending[i].slice(done)
      if rest.num_rows == 0:
        rest = read(i)
      if rest is None:
        del pending[i]
      else:
        pending[i] = rest
    yield sort_by_time(pa.concat_tables(ready))


def gather_runs(
  tables, runs_dir, run_rows, sample, runs, probes, prefix="run", filesystem=None
) -> list[pa.Table]:
  """Row `tables` into time-sorted run files of at least `run_rows` rows, appended to `runs`;
  the probe keys of their rows added to `probes` when sampling. Returns the rows left over,
  fewer than `run_rows` (the caller writes them as the last run, or alone sorts them)."""
  buffer, buffered = [], 0
  with contextlib.closing(tables):
    for table in tables:
      if sample is not None:
        versions = table.column("ip_version").to_numpy()
        probes.update(probe_keys(table.column("src_addr"), versions).tolist())
      buffer.append(table)
      buffered += table.num_rows
      if buffered >= run_rows:
        runs.append(write_run(buffer, runs_dir, len(runs), prefix, filesystem))
        buffer, buffered = [], 0
  return buffer


def write_shards(
  out_dir: str, pieces, rows: int, shards: int, filesystem=None, shown_dir=None
) -> list:
  """`pieces`, tables of `rows` rows in all in time order (`merge` of the runs, or one sorted
  table), written as `shards` files in `out_dir` (a path of `filesystem` when given, for a
  bucket; errors name them in `shown_dir`, `ShardWriter`); a file being written when this
  fails is removed."""
  writer = ShardWriter(out_dir, rows, shards, filesystem, shown_dir)
  try:
    for piece in pieces:
      writer.write(piece)
    return writer.close()
  finally:
    writer.abort()


def publish_shards(work_dir: str, out_dir: str, pieces, rows: int, shards: int, content) -> list:
  """`write_shards` into a new folder of `work_dir` (the run's own inside local folder
  `out_dir`, `layout.stage`), then those files moved into `out_dir` in place of an earlier
  run's, with the marker of JSON `content(paths)` last (`layout.publish`): their paths."""
  staging = os.path.join(work_dir, "shards")
  os.makedirs(staging)
  paths = write_shards(staging, pieces, rows, shards, shown_dir=out_dir)
  names = [os.path.basename(p) for p in paths]
  return publish(staging, out_dir, names, content(paths))
