"""`prepare`: raw parquet → the prepared store (cached by a fingerprint of inputs and config).

    maxtext-netdata prepare CONFIG [key=value ...] [--force] [--runner beam [-- BEAM OPTIONS]]

Reads `grain_train_files` (and `grain_eval_files` if set) through `data.remote`, validates
every row (`data.schema`), partitions the rows by probe hash into buckets spilled to local
files, sorts one bucket at a time into a piece and assembles the pieces into
`<prepared_dir>/<fingerprint>/{train,test[,eval]}/` (`data.shards`, `data.assemble`,
`data.store`). Memory is bounded by `network_prepare_memory_mb`, whatever the row count.

The fingerprint covers each input file's URI, size and modification time, the store format
and the config keys that change the store's content; a complete store with the same
fingerprint is opened instead of rebuilt. One process builds a store at a time (a lock file
beside it; the others wait, then open it). A store is built in a temporary directory and
renamed into place once complete, with the summary (`meta.json`) written last: a prepare
killed at any point leaves nothing that passes for a store, and the next one removes its
remains.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import glob
import hashlib
import json
import os
import resource
import shutil
import signal
import sys
import time
import uuid

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import tqdm

from maxtext_netdata.config import ConfigError
from maxtext_netdata.config import load as load_config
from maxtext_netdata.data import assemble, remote, schema, shards, store
from maxtext_netdata.errors import DataError


@dataclasses.dataclass
class PreparedSplits:
  """The opened splits: `eval` is the eval-files store, or the test split without them."""

  train: store.PreparedStore
  eval: store.PreparedStore
  summary: dict
  cached: bool


# Config keys whose value changes the store's content.
_CONTENT_KEYS = ("network_split", "network_test_fraction", "network_skip_bad_rows")
_BATCH_ROWS = 1 << 18  # rows validated at a time: bounds memory whatever the row-group size
# Set to a stage name ("reading", "partitioned", "sorted", "assembled"), a prepare stops
# itself there with SIGSTOP: the crash tests kill it at a known point.
PAUSE_ENV = "MAXTEXT_NETDATA_PREPARE_PAUSE_AT"


def _hashed(config) -> bool:
  return config.network_field_order == "hashed"


def fingerprint(
  config, train_files: list[remote.FileEntry], eval_files: list[remote.FileEntry]
) -> str:
  """Hex digest naming the store that `config` and these files produce."""
  description = {
    "format_version": store.FORMAT_VERSION,
    "train_files": [dataclasses.astuple(f) for f in train_files],
    "eval_files": [dataclasses.astuple(f) for f in eval_files],
    "hashed_order": _hashed(config),
    **{key: config[key] for key in _CONTENT_KEYS},
  }
  text = json.dumps(description, sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def ensure_prepared(config, *, progress: bool = True) -> PreparedSplits:
  """The store of `config`: opened if complete and current, else prepared now."""
  return prepare(config, progress=progress, force=False)


def prepare(config, *, progress: bool = True, force: bool = False, runner=None) -> PreparedSplits:
  """Build the store of `config` unless a current one exists (or `force`); open it.

  `runner` builds the sorted pieces of one set of files (`data.prepare_beam.runner`); None
  is the built-in one (`_local_pieces`). Listing, locking, assembling and caching are shared.
  """
  if not config.grain_train_files.strip():
    raise ConfigError("grain_train_files is empty: set it to raw parquet paths, globs or URIs")
  options = remote.StorageOptions.from_config(config)
  train_files = remote.expand_all(config.grain_train_files, options)
  eval_files = remote.expand_all(config.grain_eval_files, options)
  fp = fingerprint(config, train_files, eval_files)
  root = os.path.join(config.prepared_dir, fp)
  if not force:
    cached = _open_complete(root)
    if cached is not None:
      return cached
  os.makedirs(config.prepared_dir, exist_ok=True)
  with _builder_lock(config.prepared_dir, fp, progress):
    if not force:
      cached = _open_complete(root)  # built by the process this one waited for
      if cached is not None:
        return cached
    for stale in glob.glob(os.path.join(glob.escape(config.prepared_dir), f".tmp-{fp}-*")):
      shutil.rmtree(stale, ignore_errors=True)  # a killed build's: the lock says none runs
    tmp = os.path.join(config.prepared_dir, f".tmp-{fp}-{uuid.uuid4().hex[:8]}")
    try:
      summary = _build(config, options, train_files, eval_files, tmp, fp, progress, runner)
      summary["path"] = root
      store.write_json(os.path.join(tmp, store.META_FILE), summary)
      if os.path.isdir(root):
        shutil.rmtree(root)  # forced rebuild, or the remains of an interrupted one
      os.rename(tmp, root)
    finally:
      shutil.rmtree(tmp, ignore_errors=True)
  splits = _open_complete(root)
  splits.cached = False
  splits.summary["cached"] = False
  return splits


@contextlib.contextmanager
def _builder_lock(prepared_dir: str, fp: str, progress: bool):
  """Hold `<prepared_dir>/.lock-<fp>` while building: one builder per store.

  `flock` is released by the kernel when the holder dies, even by SIGKILL. The holder removes
  the file when done, so a waiter that wakes holding a removed file tries again. On a shared
  mount it works where the filesystem supports `flock` (NFSv4, Lustre; not GCS FUSE).
  """
  path = os.path.join(prepared_dir, f".lock-{fp}")
  told = False
  while True:
    f = open(path, "a")  # noqa: SIM115 (closed below or after the build)
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      if progress and not told:
        print(f"prepare: another process is building store {fp}; waiting", file=sys.stderr)
        told = True
      fcntl.flock(f, fcntl.LOCK_EX)
    try:
      current = os.stat(path).st_ino == os.fstat(f.fileno()).st_ino
    except FileNotFoundError:
      current = False
    if current:
      break
    f.close()
  try:
    yield
  finally:
    os.remove(path)
    f.close()


def _open_complete(root: str) -> PreparedSplits | None:
  """The splits under `root`, or None if it holds no complete store of this format."""
  try:
    with open(os.path.join(root, store.META_FILE), encoding="utf-8") as f:
      summary = json.load(f)
  except (OSError, json.JSONDecodeError):
    return None
  if summary.get("format_version") != store.FORMAT_VERSION:
    return None
  train = store.PreparedStore(os.path.join(root, "train"))
  eval_name = "eval" if summary.get("eval_files") else "test"
  summary["cached"] = True
  return PreparedSplits(
    train=train,
    eval=store.PreparedStore(os.path.join(root, eval_name)),
    summary=summary,
    cached=True,
  )


@dataclasses.dataclass
class _ReadReport:
  rows_read: int = 0
  skipped: schema.SkipReport = dataclasses.field(default_factory=schema.SkipReport)


def _open_parquet(
  entry: remote.FileEntry, options: remote.StorageOptions, metadata=None
) -> pq.ParquetFile:
  """The parquet file of `entry`; with its `metadata` known, the footer is not read again."""

  def attempt():
    handle = remote.open_input_file(entry, options)
    try:
      return pq.ParquetFile(handle, metadata=metadata, **schema.PARQUET_READ_OPTIONS)
    except OSError as e:
      if remote.is_remote(entry.uri) and not remote.is_permanent(e):
        raise  # transient: with_retries tries again
      raise DataError(f"{entry.uri}: not a readable parquet file ({_one_line(e)})") from None
    except pa.ArrowException as e:
      raise DataError(f"{entry.uri}: not a readable parquet file ({_one_line(e)})") from None

  return remote.with_retries(attempt, uri=entry.uri, what="open", options=options)


def _one_line(error: BaseException) -> str:
  return " ".join(str(error).split())


def _tables(entry: remote.FileEntry, metadata, options: remote.StorageOptions):
  """(table, first row number) of each batch of one file, re-opening on transient errors.

  After a transient failure the file is opened again and reading resumes at the batch that
  failed: finished row groups are not read again. `network_remote_retries` bounds the
  failures in a row, not per file, so a long file survives a flaky connection.
  """
  group, skip, row, failures = 0, 0, 0, 0
  while True:
    try:
      parquet = _open_parquet(entry, options, metadata)
      while group < metadata.num_row_groups:
        batches = parquet.iter_batches(
          batch_size=_BATCH_ROWS, row_groups=[group], columns=list(schema.REQUIRED_COLUMNS)
        )
        for index, batch in enumerate(batches):
          if index >= skip:
            # Checked before `_coalesced` unifies dictionaries, which trusts their indices.
            schema.check_decoded(batch, source=entry.uri, row_offset=row)
            yield pa.Table.from_batches([batch]), row
            row += batch.num_rows
            skip, failures = index + 1, 0
        group, skip = group + 1, 0
      return
    except OSError as e:
      failures += 1
      if not remote.is_remote(entry.uri) or remote.is_permanent(e) or failures >= options.retries:
        raise DataError(f"{entry.uri}: read failed at row {row}: {_one_line(e)}") from None
      time.sleep(options.backoff_s * 2 ** (failures - 1))
    except pa.ArrowException as e:
      raise DataError(f"{entry.uri}: corrupt parquet data at row {row} ({_one_line(e)})") from None


def _coalesced(tables):
  """(table, first row) of about `_BATCH_ROWS` rows each, joined from consecutive tables.

  Each parquet row group comes with its own dictionaries; joining small row groups (and
  unifying their dictionaries, which Arrow does in C++) keeps the fixed cost per table off
  files written with small row groups.
  """
  pending, pending_rows, first = [], 0, 0
  for table, first_row in tables:
    if not pending:
      first = first_row
    pending.append(table)
    pending_rows += table.num_rows
    if pending_rows >= _BATCH_ROWS:
      yield pa.concat_tables(pending).combine_chunks(), first
      pending, pending_rows = [], 0
  if pending:
    yield pa.concat_tables(pending).combine_chunks(), first


def check_files(files, options) -> list:
  """The parquet footer of each file, every schema checked before any long work starts."""
  metadata = []
  for entry in files:
    parquet = _open_parquet(entry, options)
    schema.check_schema(parquet.schema_arrow, entry.uri)
    metadata.append(parquet.metadata)
  return metadata


def read_partitioned(entry, metadata, options, *, buckets, hashed, skip_bad, report, on_rows=None):
  """(bucket, shards.Chunk) of every valid row of one file; counts rows in `report`."""
  for table, first_row in _coalesced(_tables(entry, metadata, options)):
    columns, skipped = schema.validate_table(
      table, source=entry.uri, row_offset=first_row, skip_bad=skip_bad
    )
    report.rows_read += table.num_rows
    report.skipped.merge(skipped)
    if len(columns):
      yield from shards.partition(columns, buckets, hashed)
    if on_rows is not None:
      on_rows(table.num_rows)


def _pause_point(stage: str) -> None:
  """Stop this process at `stage` when the environment asks (the crash tests kill it there)."""
  if os.environ.get(PAUSE_ENV) == stage:
    os.kill(os.getpid(), signal.SIGSTOP)


def _build_group(config, options, files, *, work, name, split, meta, progress, runner) -> tuple:
  """Prepare one set of files into split folder(s) under `work`: (counts, report, probes)."""
  metadata = check_files(files, options)
  total = sum(m.num_rows for m in metadata)
  buckets = shards.num_buckets(total, config.network_prepare_memory_mb)
  pieces_dir = os.path.join(work, f".pieces-{name}")
  build_pieces = _local_pieces if runner is None else runner
  pieces, report = build_pieces(
    config, options, files, metadata, buckets=buckets, pieces_dir=pieces_dir, progress=progress
  )
  if not pieces:
    label = config.grain_train_files if name == "train" else config.grain_eval_files
    raise DataError(f"{label}: no valid rows in {len(files)} file(s)")
  _pause_point("sorted")
  probes = sum(store.PreparedStore(path).num_probes for path in pieces)
  counts = assemble.assemble(pieces, work, split, config.network_test_fraction, meta)
  shutil.rmtree(pieces_dir, ignore_errors=True)
  return counts, report, probes


def _local_pieces(config, options, files, metadata, *, buckets, pieces_dir, progress) -> tuple:
  """The built-in runner: buckets spilled to local files, then sorted one at a time.

  Returns the piece folders in bucket order and the read report.
  """
  spill = shards.SpillWriter(pieces_dir + "-spill", buckets)
  report = _ReadReport()
  hashed, skip_bad = _hashed(config), config.network_skip_bad_rows
  total = sum(m.num_rows for m in metadata)
  with tqdm.tqdm(
    total=total, desc="prepare: read", unit="row", unit_scale=True, disable=not progress
  ) as bar:
    try:
      for entry, file_metadata in zip(files, metadata, strict=True):
        parts = read_partitioned(
          entry,
          file_metadata,
          options,
          buckets=buckets,
          hashed=hashed,
          skip_bad=skip_bad,
          report=report,
          on_rows=bar.update,
        )
        for bucket, chunk in parts:
          spill.add(bucket, chunk)
        _pause_point("reading")
    finally:
      spill.close()
  _pause_point("partitioned")
  pieces = []
  for bucket in tqdm.tqdm(
    range(buckets), desc="prepare: sort", unit="bucket", disable=not progress
  ):
    chunks = spill.read(bucket)
    if chunks:
      pieces.append(sort_and_write(bucket, chunks, pieces_dir))
  shutil.rmtree(pieces_dir + "-spill", ignore_errors=True)
  return pieces, report


def sort_and_write(bucket: int, chunks: list, pieces_dir: str) -> str:
  """Sort one bucket's chunks into the piece `<pieces_dir>/<bucket>`; its folder."""
  path = os.path.join(pieces_dir, f"{bucket:05d}")
  shards.write_piece(shards.sort_bucket(chunks), path, {})
  return path


def _build(config, options, train_files, eval_files, tmp, fp, progress, runner) -> dict:
  start, cpu_start = time.perf_counter(), _cpu_seconds()
  rss_start = psutil.Process().memory_info().rss
  meta = {"fingerprint": fp, "source_files": [f.uri for f in train_files]}
  counts, report, probes = _build_group(
    config,
    options,
    train_files,
    work=tmp,
    name="train",
    split=config.network_split,
    meta=meta,
    progress=progress,
    runner=runner,
  )
  if eval_files:
    eval_meta = {"fingerprint": fp, "source_files": [f.uri for f in eval_files]}
    eval_counts, eval_report, _ = _build_group(
      config,
      options,
      eval_files,
      work=tmp,
      name="eval",
      split="all",
      meta=eval_meta,
      progress=progress,
      runner=runner,
    )
    counts.update(eval_counts)
    report.rows_read += eval_report.rows_read
    report.skipped.merge(eval_report.skipped)
  _pause_point("assembled")
  return _summary(
    config, fp, train_files, eval_files, counts, report, probes, start, cpu_start, rss_start
  )


def _summary(
  config, fp, train_files, eval_files, counts, report, probes, start, cpu_start, rss_start
) -> dict:
  seconds = time.perf_counter() - start
  cpu = max(_cpu_seconds() - cpu_start, 1e-9)
  peak = _peak_rss_bytes()
  total = counts["train"]["rows"] + counts["test"]["rows"]
  failed = counts["train"]["failed"] + counts["test"]["failed"]
  return {
    "format_version": store.FORMAT_VERSION,
    "fingerprint": fp,
    "train_files": [f.uri for f in train_files],
    "eval_files": [f.uri for f in eval_files],
    "network_split": config.network_split,
    "network_test_fraction": config.network_test_fraction,
    "rows_read": report.rows_read,
    "rows": total,
    "probes": probes,
    "splits": counts,
    "failed_share": failed / total if total else 0.0,
    "skipped": dict(report.skipped.reasons),
    "skipped_rows": report.skipped.total,
    "seconds": round(seconds, 3),
    "rows_per_s": round(report.rows_read / seconds) if seconds else 0,
    "rows_per_cpu_s": round(report.rows_read / cpu),
    "peak_rss_bytes": peak,
    "peak_bytes_per_row": round(max(peak - rss_start, 0) / max(report.rows_read, 1), 1),
  }


def _cpu_seconds() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def _peak_rss_bytes() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def format_summary(summary: dict) -> str:
  """The summary as a few readable lines."""
  splits = summary["splits"]
  lines = [
    f"store     {summary['path']}{'  (cached)' if summary.get('cached') else ''}",
    f"rows      {summary['rows']:,} of {summary['rows_read']:,} read, "
    f"{summary['probes']:,} probes, {summary['failed_share']:.1%} failed",
  ]
  for name in ("train", "test", "eval"):
    if name in splits:
      lines.append(f"{name:<9} {splits[name]['rows']:,} rows, {splits[name]['probes']:,} probes")
  if summary["skipped"]:
    reasons = ", ".join(f"{reason}: {n:,}" for reason, n in sorted(summary["skipped"].items()))
    lines.append(f"skipped   {summary['skipped_rows']:,} rows ({reasons})")
  lines.append(
    f"speed     {summary['seconds']:.2f} s, {summary['rows_per_s']:,} rows/s, "
    f"{summary['rows_per_cpu_s']:,} rows per CPU-second"
  )
  lines.append(
    f"memory    peak RSS {summary['peak_rss_bytes'] / 2**20:,.0f} MiB, "
    f"{summary['peak_bytes_per_row']} bytes per raw row above the start"
  )
  return "\n".join(lines)


def add_arguments(parser) -> None:
  parser.add_argument("config", help="YAML config (e.g. configs/base.yml)")
  parser.add_argument("overrides", nargs="*", help="key=value config overrides")
  parser.add_argument("--force", action="store_true", help="rebuild even if a current store exists")
  parser.add_argument(
    "--runner",
    choices=("builtin", "beam"),
    default="builtin",
    help="builtin: this process; beam: an Apache Beam pipeline (pip install '.[beam]'), its"
    " options after `--` (DirectRunner by default)",
  )


def run(args) -> int:
  config = load_config(args.config, args.overrides)
  runner = None
  if args.runner == "beam":
    try:
      from maxtext_netdata.data import prepare_beam  # noqa: PLC0415 (an optional extra)
    except ImportError as e:
      raise ConfigError(f"--runner beam needs Apache Beam: pip install '.[beam]' ({e})") from None
    runner = prepare_beam.runner(getattr(args, "passthrough", []))
  elif getattr(args, "passthrough", []):
    raise ConfigError("options after `--` are Beam pipeline options: add --runner beam")
  splits = prepare(config, progress=True, force=args.force, runner=runner)
  print(format_summary(splits.summary))
  return 0
