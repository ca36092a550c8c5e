"""The built-in runner of `prepare`: this process reads, spills, sorts and assembles.

Rows are partitioned by probe bucket (`partition.partition`) into one spill file per bucket
(`SpillWriter`, the runner's GroupByKey), then one bucket at a time is read back and sorted
(`partition.order_bucket`). For the probe split and eval files each sorted bucket goes straight
into the splits (`build`); for the time split, whose cutoff needs every row's time first, each
is written as a piece and the pieces are assembled afterwards (`pieces`), as the Beam runner
does.
"""

from __future__ import annotations

import datetime
import os
import shutil

import numpy as np
import tqdm

from maxtext_netdata.config import iso_seconds
from maxtext_netdata.data.prepare import assemble, partition
from maxtext_netdata.data.raw import reader
from maxtext_netdata.data.store import store
from maxtext_netdata.errors import ConfigError, DataError, WritesTo


def uses_hashed_order(config) -> bool:
  """Whether the store keeps each row's hashed field order (`network_field_order: hashed`)."""
  return config.network_field_order == "hashed"


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


def span_text(bounds) -> str:
  """`time_bounds` as text: "2025-07-02 00:00:00 to 2025-07-09 00:00:00 UTC"."""

  def utc(seconds: int | None) -> str:
    if seconds is None:
      return "..."
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")

  since, until = bounds
  if since is None and until is None:
    return "no time bounds"
  return f"{utc(since)} to {utc(until)} UTC"


def spill(config, options, files, metadata, *, buckets, folder, progress, on_chunk=None):
  """Read and partition every file into a `SpillWriter`: (the writer, read report)."""
  writer = SpillWriter(folder, buckets)
  report = reader.ReadReport()
  with_order, skip_bad = uses_hashed_order(config), config.network_skip_bad_rows
  bounds = time_bounds(config)
  total = sum(m.num_rows for m in metadata)
  with tqdm.tqdm(
    total=total, desc="prepare: read", unit="row", unit_scale=True, disable=not progress
  ) as bar:
    try:
      for entry, file_metadata in zip(files, metadata, strict=True):
        parts = partition.read_partitioned(
          entry,
          file_metadata,
          options,
          buckets=buckets,
          hashed=with_order,
          skip_bad=skip_bad,
          report=report,
          on_rows=bar.update,
          bounds=bounds,
        )
        for bucket, chunk in parts:
          writer.add(bucket, chunk)
          if on_chunk is not None:
            on_chunk(chunk)
    finally:
      writer.close()
  return writer, report


def build(config, options, files, metadata, *, buckets, work, spill_dir, split, meta,
                 progress, label, allow_empty=False) -> tuple:  # fmt: skip
  """The built-in runner for the probe split and eval files: each sorted bucket goes straight
  into the splits, no piece written and read back. The splits' sizes, needed up front, are
  counted while partitioning (a probe's split follows from its hash alone).

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
    raise DataError(f"{label}: no valid rows in {len(files)} file(s)")
  probes = 0
  with assemble.Assembler(
    work, split, fraction, meta, totals, uses_hashed_order(config)
  ) as assembler:
    for bucket in tqdm.tqdm(
      range(buckets), desc="prepare: sort", unit="bucket", disable=not progress
    ):
      chunks = spill_files.read(bucket)
      if chunks:
        sorted_bucket = partition.order_bucket(chunks)
        del chunks
        assembler.add(sorted_bucket)
        probes += sorted_bucket.num_probes
        del sorted_bucket
  shutil.rmtree(spill_dir, ignore_errors=True)
  return assembler.finish(), report, probes


def pieces(config, options, files, metadata, *, buckets, pieces_dir, progress) -> tuple:
  """The built-in runner for the time split: buckets spilled to local files, each sorted
  into a piece (the time cutoff needs every row's time before any row can be placed).

  Returns the piece folders in bucket order and the read report.
  """
  spill_files, report = spill(
    config, options, files, metadata, buckets=buckets, folder=pieces_dir + "-spill",
    progress=progress,
  )  # fmt: skip
  pieces = []
  for bucket in tqdm.tqdm(
    range(buckets), desc="prepare: sort", unit="bucket", disable=not progress
  ):
    chunks = spill_files.read(bucket)
    if chunks:
      pieces.append(sort_and_write(bucket, chunks, pieces_dir))
  shutil.rmtree(pieces_dir + "-spill", ignore_errors=True)
  return pieces, report


def sort_and_write(bucket: int, chunks: list, pieces_dir: str) -> str:
  """Sort one bucket's chunks into the piece `<pieces_dir>/<bucket>`; its folder."""
  path = os.path.join(pieces_dir, f"{bucket:05d}")
  partition.write_piece(partition.sort_bucket(chunks), path, {})
  return path


class SpillWriter:
  """Chunks appended to one local file per bucket: the built-in runner's GroupByKey.

  With one bucket the chunks stay in memory instead: the bucket is read back whole anyway,
  and the memory budget that allowed one bucket counts its rows.
  """

  def __init__(self, folder: str, buckets: int):
    os.makedirs(folder, exist_ok=True)
    self.folder = folder
    self.rows = [0] * buckets
    self.files: dict[int, object] = {}
    self.held: list[partition.Chunk] | None = [] if buckets == 1 else None
    self.buffers: dict[str, np.ndarray] = {}

  def path(self, bucket: int) -> str:
    return os.path.join(self.folder, f"bucket-{bucket:05d}.bin")

  def add(self, bucket: int, chunk: partition.Chunk) -> None:
    self.rows[bucket] += len(chunk)
    if self.held is not None:
      self.held.append(chunk)
      return
    f = self.files.get(bucket)
    if f is None:
      f = self.files[bucket] = open(self.path(bucket), "wb")  # noqa: SIM115 (closed in close)
    parts = chunk.parts()
    with WritesTo(f.name):
      f.write(sum(len(p) for p in parts).to_bytes(8, "little"))
      f.writelines(parts)

  def close(self) -> None:
    failed = None
    for f in self.files.values():
      try:
        with WritesTo(f.name):
          f.close()  # flushes: a full disk can show here first
      except OSError as e:
        failed = failed or e
    if failed is not None:
      raise failed

  def read(self, bucket: int) -> list[partition.Chunk]:
    """The bucket's chunks; the file is removed once read (its rows now live in memory).

    From a file, the records are read straight into one chunk's preallocated arrays (no
    intermediate buffer, no copy into place afterwards). Those arrays are this writer's
    buffers, reused by the next read: the runner is done with a bucket before it reads the
    next, and memory already touched costs no page faults (~40k fewer per 16M rows).
    """
    if self.held is not None:
      chunks, self.held = self.held, []
      return chunks
    if bucket not in self.files:
      return []
    with open(self.path(bucket), "rb") as f:
      chunk = _read_records(f, self.rows[bucket], self.buffers)
    os.remove(self.path(bucket))
    return [chunk]


def _buffer(buffers: dict, name: str, dtype, shape: tuple) -> np.ndarray:
  """An array of `shape` over `buffers[name]`, which grows to fit (and is kept for reuse)."""
  size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
  held = buffers.get(name)
  if held is None or len(held) < size:
    held = buffers[name] = np.empty(size, np.uint8)
  return held[:size].view(dtype).reshape(shape)


def _read_records(f, rows: int, buffers: dict) -> partition.Chunk:
  """The `Chunk.parts` records of file `f` (`rows` rows in all) as one chunk."""
  columns, hashed = None, False
  probe = _buffer(buffers, "probe", np.int32, (rows,))
  keys, hashes = [], []
  at, key_at = 0, 0

  def read_into(array: np.ndarray) -> None:
    view = memoryview(array).cast("B")
    if f.readinto(view) != len(view):
      raise OSError(f"{f.name}: spill file cut short")

  while size := f.read(8):
    head = np.frombuffer(f.read(24), np.int64)
    n, k, hashed = int(head[0]), int(head[1]), bool(head[2])
    if columns is None:
      columns = {}
      for name in partition._names(hashed):
        dtype, tail = store.ROW_ARRAYS[name]
        columns[name] = _buffer(buffers, name, dtype, (rows, *tail))
    key_part, hash_part = np.empty((k, 17), np.uint8), np.empty(k, np.uint64)
    read_into(key_part)
    read_into(hash_part)
    keys.append(key_part)
    hashes.append(hash_part)
    read_into(probe[at : at + n])
    probe[at : at + n] += key_at
    for name in partition._names(hashed):
      read_into(columns[name][at : at + n])
    at, key_at = at + n, key_at + k
    del size
  assert at == rows, (f.name, at, rows)
  return partition.Chunk(np.concatenate(keys), np.concatenate(hashes), probe, columns)
