"""The built-in runner of `prepare`: this process reads, spills, sorts and assembles.

Rows are partitioned by probe bucket (`partition.Gather`) into one spill file per bucket
(`SpillWriter`, the runner's GroupByKey), then one bucket at a time is read back and sorted
(`SpillWriter.sorted`: whole, or in slices when it holds more rows than one sort may). For the
probe split, eval files and a time split with no test share each sorted bucket goes straight
into the splits (`build`); for a time split with a test share, whose cutoff needs every row's
time first, each is written as a piece and the pieces are assembled afterwards (`pieces`),
as the Beam runner does.
"""

from __future__ import annotations

import datetime
import functools
import os
import resource
import shutil

import numpy as np
import tqdm

from maxtext_netdata.config import iso_seconds
from maxtext_netdata.data.prepare import assemble, bucket_sort, partition, row_kernels
from maxtext_netdata.data.raw import reader
from maxtext_netdata.data.store.dst_table import DstEncoder
from maxtext_netdata.errors import ConfigError, DataError, WritesTo


def uses_hashed_order(config) -> bool:
  """Whether the store keeps each row's hashed field order (`network_field_order: hashed`)."""
  return config.network_field_order == "hashed"


def no_rows_message(label: str, files: list, report) -> str:
  """The error of inputs that gave no row: how many were read and, where rows were skipped as
  bad (`network_skip_bad_rows`), why."""
  message = f"{label}: no valid rows in {len(files)} file(s)"
  skipped = report.skipped.reasons
  if skipped:
    reasons = ", ".join(f"{reason}: {count:,}" for reason, count in sorted(skipped.items()))
    message += f" ({report.rows_read:,} rows read, every one skipped as bad; {reasons})"
  return message


def time_bounds(config) -> tuple[int | None, int | None]:
  """(since, until) in Unix seconds of `network_since` / `network_until` (None: no bound): the
  rows prepare keeps are those at or after since and before until."""
  since, until = (
    iso_seconds(text) if text else None for text in (config.network_since, config.network_until)
  )
  if since is not None and until is not None and until <= since:
    raise ConfigError(
      f"network_until ({config.network_until}) must be after network_since ({config.network_since})"
    )
  return since, until


def utc(seconds: int | None) -> str:
  """Unix seconds as "2025-07-02 00:00:00" (UTC); "..." for None (no bound)."""
  if seconds is None:
    return "..."
  return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def span_text(bounds) -> str:
  """`time_bounds` as text: "2025-07-02 00:00:00 to 2025-07-09 00:00:00 UTC"."""
  since, until = bounds
  if since is None and until is None:
    return "no time bounds"
  return f"{utc(since)} to {utc(until)} UTC"


def spill(config, options, files, metadata, *, buckets, folder, progress, on_chunk=None):
  """Read and partition every file into a `SpillWriter`: (the writer, read report).

  The batches of all files are gathered (`partition.Gather`, `partition.gather_rows` rows at a
  time) before they are split by bucket, so a bucket's file gets one record per gathering,
  not one per batch. `on_chunk` sees each batch's chunk.
  """
  writer = SpillWriter(folder, buckets)
  report = reader.ReadReport()
  with_order, skip_bad = uses_hashed_order(config), config.network_skip_bad_rows
  bounds = time_bounds(config)
  gather = partition.Gather(
    buckets,
    partition.gather_rows(buckets, config.network_prepare_memory_mb),
    dst_table=writer.dst_table,
  )
  total = sum(m.num_rows for m in metadata)

  with tqdm.tqdm(
    total=total, desc="prepare: read", unit="row", unit_scale=True, disable=not progress
  ) as bar:
    try:
      for entry, file_metadata in zip(files, metadata, strict=True):
        for chunk in partition.read_chunks(
          entry,
          file_metadata,
          options,
          hashed=with_order,
          skip_bad=skip_bad,
          report=report,
          on_rows=bar.update,
          bounds=bounds,
        ):
          if on_chunk is not None:
            on_chunk(chunk)
          if writer.held is not None:  # one bucket: the batch is its chunk
            writer.held.append(chunk)
          else:
            writer.add(gather.add(chunk))
      writer.add(gather.flush())
    finally:
      writer.close()
  return writer, report


def build(config, options, files, metadata, *, buckets, work, spill_dir, split, meta,
                 progress, label, allow_empty=False) -> tuple:  # fmt: skip
  """The built-in runner for the probe split, eval files and a time split with no test share
  (the new files of a time split's update among them): each sorted bucket goes straight into
  the splits, no piece written and read back. The splits' sizes, needed up front, are
  counted while partitioning (a probe's split follows from its hash alone, or every row
  trains).

  Returns (counts, read report, probes). No valid row is an error unless `allow_empty`.
  """
  fraction = config.network_test_fraction
  names = assemble.split_names(split)
  totals = dict.fromkeys(names, 0)

  def count(chunk: partition.Chunk) -> None:
    if split == "probe":
      held = assemble.held_out(chunk.hashes, fraction)
      test = int(np.bincount(chunk.probe, minlength=len(chunk.keys))[held].sum())
      totals["test"] += test
      totals["train"] += len(chunk) - test
    else:
      totals[names[0]] += len(chunk)

  spill_files, report = spill(
    config, options, files, metadata, buckets=buckets, folder=spill_dir, progress=progress,
    on_chunk=count,
  )  # fmt: skip
  if not sum(totals.values()) and not allow_empty:
    shutil.rmtree(spill_dir, ignore_errors=True)
    raise DataError(no_rows_message(label, files, report))
  with assemble.Assembler(
    work, split, fraction, meta, totals, uses_hashed_order(config)
  ) as assembler:
    for bucket in tqdm.tqdm(
      range(buckets), desc="prepare: sort", unit="bucket", disable=not progress
    ):
      for sorted_bucket in spill_files.sorted(bucket, config.network_prepare_memory_mb):
        assembler.add(sorted_bucket)
        del sorted_bucket
  counts = assembler.finish()
  shutil.rmtree(spill_dir, ignore_errors=True)
  # Each probe is in one split (a probe split or the eval files' one).
  return counts, report, sum(c["probes"] for c in counts.values())


def pieces(config, options, files, metadata, *, buckets, pieces_dir, progress) -> tuple:
  """The built-in runner for a time split with a test share: buckets spilled to local files,
  each sorted into a piece (the time cutoff needs every row's time before any row can be
  placed).

  Returns the piece folders in bucket order and the read report.
  """
  spill_files, report = spill(
    config, options, files, metadata, buckets=buckets, folder=pieces_dir + "-spill",
    progress=progress,
  )  # fmt: skip
  pieces, memory_mb = [], config.network_prepare_memory_mb
  for bucket in tqdm.tqdm(
    range(buckets), desc="prepare: sort", unit="bucket", disable=not progress
  ):
    pieces += write_pieces(bucket, spill_files.sorted(bucket, memory_mb), pieces_dir)
  shutil.rmtree(pieces_dir + "-spill", ignore_errors=True)
  return pieces, report


def write_pieces(bucket: int, parts, pieces_dir: str) -> list[str]:
  """Each `bucket_sort.SortedBucket` of `parts` (a bucket, whole or in slices) written as the
  piece `<pieces_dir>/<bucket>-<part>`; their folders."""
  paths = []
  for part, sorted_bucket in enumerate(parts):
    paths.append(os.path.join(pieces_dir, f"{bucket:05d}-{part:04d}"))
    bucket_sort.write_piece(sorted_bucket.rows(), paths[-1], {})
    del sorted_bucket
  return paths


class SpillWriter:
  """Chunks appended to one local file per bucket: the built-in runner's GroupByKey.

  With one bucket the chunks stay in memory instead (unless `hold` is False: the spill's
  caller then adds them as records too): the bucket is read back whole anyway, and the memory
  budget that allowed one bucket counts its rows.

  A bucket's file stays open while records come when the process may hold that many files
  (RIPE Atlas's month at the default memory is ~17,500 buckets; the soft limit, often 1024,
  is raised toward the hard one for the writer's life); past that, each record's file is
  opened to append and closed again.
  """

  def __init__(self, folder: str, buckets: int, dst_table=None, hold=None):
    os.makedirs(folder, exist_ok=True)
    self.folder = folder
    self.rows = [0] * buckets
    self.keys = [0] * buckets
    self.hashed = False
    self.files: dict[int, object] = {}  # the open files, when they stay open
    self.written: set[int] = set()
    hold = buckets == 1 if hold is None else hold
    self.held: list[partition.Chunk] | None = [] if hold else None
    # The build's destinations, which the records index (`partition.Records`).
    self.dst_table = DstEncoder() if dst_table is None else dst_table
    self.buffers: dict[str, np.ndarray] = {}
    self.keep_open, self.limit = True, None
    if buckets > 1:
      self.keep_open, self.limit = _raise_open_files(buckets + FILES_HEADROOM)

  def path(self, bucket: int) -> str:
    return os.path.join(self.folder, f"bucket-{bucket:05d}.bin")

  def add(self, records: partition.Records | None) -> None:
    """Each bucket's record of `records` appended to its file."""
    if records is None:
      return
    self.hashed = records.hashed
    for (bucket, record), rows, keys in zip(
      records, records.rows.tolist(), records.keys.tolist(), strict=True
    ):
      self.rows[bucket] += rows
      self.keys[bucket] += keys
      f = self.files.get(bucket)
      if f is None:
        with WritesTo(self.path(bucket)):
          f = open(self.path(bucket), "ab" if bucket in self.written else "wb")  # noqa: SIM115
        self.written.add(bucket)
        if self.keep_open:
          self.files[bucket] = f
      with WritesTo(f.name):
        f.write(record)
        if not self.keep_open:
          f.close()

  def close(self) -> None:
    failed = None
    for f in self.files.values():
      try:
        with WritesTo(f.name):
          f.close()  # flushes: a full disk can show here first
      except OSError as e:
        failed = failed or e
    self.files = {}
    if self.limit is not None:
      resource.setrlimit(resource.RLIMIT_NOFILE, self.limit)
      self.limit = None
    if failed is not None:
      raise failed

  def read(self, bucket: int) -> list[partition.Chunk]:
    """The bucket's chunks; the file is removed once read (its rows now live in memory).

    From a file, blocks of `SPILL_BLOCK` bytes are read and their records unpacked by a
    compiled pass (`row_kernels.unpack_records`) into one chunk's preallocated arrays. The
    block and the columns are this writer's, reused by the next read: the runner is done
    with a bucket before it reads the next, and memory already touched costs no page faults
    (~40k fewer per 16M rows).
    """
    if self.held is not None:
      chunks, self.held = self.held, []
      return chunks
    if bucket not in self.written:
      return []
    path, rows = self.path(bucket), self.rows[bucket]
    chunk = partition.empty_chunk(
      rows, self.keys[bucket], self.hashed, functools.partial(_buffer, self.buffers)
    )
    arrays = (*partition.chunk_arrays(chunk), self.dst_table.table())
    row = key = held = 0  # rows and keys unpacked; bytes of a record begun, at the block's start
    block = _buffer(self.buffers, "block", np.uint8, (SPILL_BLOCK,))
    with open(path, "rb") as f:
      while got := f.readinto(memoryview(block)[held:]):
        used, row, key = row_kernels.unpack_records(block[: held + got], row, key, *arrays)
        held = held + got - used
        block[:held] = block[used : used + held]
        if held == len(block):  # one record larger than the block: a larger block
          begun = block.copy()
          block = _buffer(self.buffers, "block", np.uint8, (2 * len(block),))
          block[:held] = begun
    if held or (row, key) != (rows, len(chunk.keys)):
      raise OSError(f"{path}: spill file cut short ({row} of {rows} rows)")
    os.remove(path)
    return [chunk]

  def stream(self, bucket: int):
    """The bucket's rows as chunks of at most about `SPILL_BLOCK` bytes of records each (a
    larger record, a larger chunk), in the order they were written; the file is kept."""
    path, table, rows = self.path(bucket), self.dst_table.table(), 0
    rest = np.zeros(0, np.uint8)
    with open(path, "rb") as f:
      while block := f.read(SPILL_BLOCK):
        data = np.concatenate([rest, np.frombuffer(block, np.uint8)]) if len(rest) else block
        data = np.frombuffer(data, np.uint8)
        chunk, used = partition.unpack_whole(data, table)
        if used:
          rows += len(chunk)
          yield chunk
        rest = data[used:]
    if len(rest) or rows != self.rows[bucket]:
      raise OSError(f"{path}: spill file cut short ({rows} of {self.rows[bucket]} rows)")

  def sorted(self, bucket: int, memory_mb: int):
    """The bucket's rows in store order (`bucket_sort.SortedBucket`s, one after another): in
    one piece when one sort may hold them, else in slices (`bucket_sort.Slicer`), each sorted
    alone; the bucket's file is removed once read."""
    if self.rows[bucket] <= partition.sort_rows(memory_mb):
      chunks = self.read(bucket)
      if chunks:
        yield bucket_sort.order_bucket(chunks)
      return
    # The bucket reads' arrays and destination table are the slices' too: none held twice.
    yield from sort_in_slices(
      functools.partial(self.stream, bucket), self.path(bucket) + "-slices",
      partition.bucket_rows(memory_mb), self.dst_table, self.buffers,
    )  # fmt: skip
    os.remove(self.path(bucket))


def sort_in_slices(chunks, folder: str, target: int, table=None, buffers=None):
  """The rows of a bucket too large for one sort in store order, as the `SortedBucket` of each
  of its slices (`bucket_sort.Slicer`, at most `target` rows each), one after another.

  `chunks()` gives the bucket's chunks, the same ones in the same order each call: they are
  read twice, to count the rows, then to append each to its slice's file (a `SpillWriter`
  in `folder`, removed at the end, with destination table `table` and arrays `buffers` when
  given). Each slice is read back and sorted when the one before has been taken.
  """
  slicer = bucket_sort.Slicer(target)
  for chunk in chunks():
    slicer.count(chunk)
  count = slicer.plan()
  slices = SpillWriter(folder, count, table, hold=False)
  if buffers is not None:
    slices.buffers = buffers
  try:
    for chunk in chunks():
      cut, key_slice = slicer.cut(chunk)
      slices.add(partition.split_chunks([cut], count, slices.dst_table, key_slice))
  finally:
    slices.close()
  for part in range(count):
    got = slices.read(part)
    if got:
      yield bucket_sort.order_bucket(got)
  shutil.rmtree(folder, ignore_errors=True)


# Files besides the spill files a prepare may hold open at once (its inputs, Arrow's and
# numba's own, the store's memory maps' descriptors are closed once mapped).
FILES_HEADROOM = 256
SPILL_BLOCK = 8 << 20  # bytes of a spill file read at a time (a larger record, a larger block)


def _raise_open_files(wanted: int) -> tuple[bool, tuple]:
  """Raise this process's soft limit on open files toward `wanted`, up to the hard limit:
  (whether `wanted` files may be open now, the (soft, hard) limits before, to restore)."""
  before = resource.getrlimit(resource.RLIMIT_NOFILE)
  soft, hard = before
  infinite = resource.RLIM_INFINITY
  if soft == infinite or soft >= wanted:
    return True, before
  soft = wanted if hard == infinite else min(wanted, hard)
  resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
  return soft >= wanted, before


def _buffer(buffers: dict, name: str, dtype, shape: tuple) -> np.ndarray:
  """An array of `shape` over `buffers[name]`, which grows to fit (and is kept for reuse)."""
  size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
  held = buffers.get(name)
  if held is None or len(held) < size:
    held = buffers[name] = np.empty(size, np.uint8)
  return held[:size].view(dtype).reshape(shape)
