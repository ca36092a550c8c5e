"""`prepare`: raw parquet → the prepared store (cached by a fingerprint of inputs and config).

    maxtext-netdata prepare CONFIG [key=value ...] [--force]

Reads `grain_train_files` (and `grain_eval_files` if set) through `data.remote`, validates
every row (`data.schema`), groups rows by probe (source address, version), sorts each probe
by time and writes `<prepared_dir>/<fingerprint>/{train,test[,eval]}/` (see `data.store`).

The fingerprint covers each input file's URI, size and modification time, the store format
and the config keys that change the store's content; a complete store with the same
fingerprint is opened instead of rebuilt. A store is built in a temporary directory and
renamed into place once complete, with the summary (`meta.json`) written last: an
interrupted prepare leaves nothing that passes for a store.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import resource
import shutil
import sys
import time
import uuid

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from maxtext_netdata.config import ConfigError
from maxtext_netdata.config import load as load_config
from maxtext_netdata.data import remote, schema, store
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


def prepare(config, *, progress: bool = True, force: bool = False) -> PreparedSplits:
  """Build the store of `config` unless a current one exists (or `force`); open it."""
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
  tmp = os.path.join(config.prepared_dir, f".tmp-{fp}-{uuid.uuid4().hex[:8]}")
  try:
    summary = _build(config, options, train_files, eval_files, tmp, fp, progress)
    summary["path"] = root
    store.write_json(os.path.join(tmp, store.META_FILE), summary)
    if os.path.isdir(root) and (force or _open_complete(root) is None):
      shutil.rmtree(root)  # forced rebuild, or the remains of an interrupted one
    try:
      os.rename(tmp, root)
    except OSError:
      # Another process finished the same store first: its content is identical.
      if _open_complete(root) is None:
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  splits = _open_complete(root)
  splits.cached = False
  splits.summary["cached"] = False
  return splits


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


def _stable_fraction(probe_version: np.ndarray, probe_src: np.ndarray) -> np.ndarray:
  """A number in [0, 1) per probe from a hash of its address: the same on every machine."""
  out = np.empty(len(probe_version), dtype=np.float64)
  for i in range(len(out)):
    key = bytes([int(probe_version[i])]) + probe_src[i].tobytes()
    out[i] = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2.0**64
  return out


def _test_rows(config, rows: store.ProbeRows) -> np.ndarray:
  """bool [N] over `rows` (sorted): the rows held out as the test split."""
  fraction = config.network_test_fraction
  if fraction <= 0 or rows.num_rows == 0:
    return np.zeros(rows.num_rows, dtype=bool)
  if config.network_split == "time":
    cutoff = np.quantile(rows.seconds, 1.0 - fraction, method="higher")
    return rows.seconds >= cutoff
  test_probe = _stable_fraction(rows.probe_version, rows.probe_src) < fraction
  return np.repeat(test_probe, np.diff(rows.probe_offsets))


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


def _read(files, options, *, label: str, hashed: bool, skip_bad: bool, progress) -> tuple:
  """All valid rows of `files` grouped by probe: (store.ProbeRows, _ReadReport)."""
  metadata = []
  for entry in files:  # every schema is checked before any long work starts
    parquet = _open_parquet(entry, options)
    schema.check_schema(parquet.schema_arrow, entry.uri)
    metadata.append(parquet.metadata)
  builder = store.ProbeRowsBuilder(sum(m.num_rows for m in metadata), hashed=hashed)
  report = _ReadReport()
  for done, (entry, file_metadata) in enumerate(zip(files, metadata, strict=True)):
    for table, first_row in _coalesced(_tables(entry, file_metadata, options)):
      columns, skipped = schema.validate_table(
        table, source=entry.uri, row_offset=first_row, skip_bad=skip_bad
      )
      builder.add(columns)
      report.rows_read += table.num_rows
      report.skipped.merge(skipped)
      progress(done, len(files), report.rows_read)
    progress(done + 1, len(files), report.rows_read)
  if builder.size == 0:
    raise DataError(f"{label}: no valid rows in {len(files)} file(s)")
  progress.stage(f"grouping {builder.size:,} rows by probe and sorting")
  return builder.finish(), report


def _build(config, options, train_files, eval_files, tmp: str, fp: str, progress: bool) -> dict:
  start, cpu_start = time.perf_counter(), _cpu_seconds()
  rss_start = psutil.Process().memory_info().rss
  read_options = {
    "hashed": _hashed(config),
    "skip_bad": config.network_skip_bad_rows,
    "progress": _Progress(progress),
  }
  meta = {"fingerprint": fp, "source_files": [f.uri for f in train_files]}

  rows, report = _read(train_files, options, label=config.grain_train_files, **read_options)
  test = _test_rows(config, rows)
  read_options["progress"].stage("writing the train and test splits")
  counts = {
    "train": rows.write(os.path.join(tmp, "train"), {**meta, "split": "train"}, ~test),
    "test": rows.write(os.path.join(tmp, "test"), {**meta, "split": "test"}, test),
  }
  total, probes = rows.num_rows, rows.num_probes
  del rows, test
  if eval_files:
    eval_rows, eval_report = _read(
      eval_files, options, label=config.grain_eval_files, **read_options
    )
    eval_meta = {"fingerprint": fp, "source_files": [f.uri for f in eval_files], "split": "eval"}
    counts["eval"] = eval_rows.write(os.path.join(tmp, "eval"), eval_meta)
    report.rows_read += eval_report.rows_read
    report.skipped.merge(eval_report.skipped)
    del eval_rows
  read_options["progress"].close()

  seconds = time.perf_counter() - start
  cpu = max(_cpu_seconds() - cpu_start, 1e-9)
  peak = _peak_rss_bytes()
  failed = counts["train"]["failed"] + counts["test"]["failed"]
  return {
    "format_version": store.FORMAT_VERSION,
    "fingerprint": fp,
    "train_files": meta["source_files"],
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


class _Progress:
  """One self-overwriting stderr line: files and rows read, rows/s."""

  def __init__(self, enabled: bool):
    self.enabled = enabled
    self.start = time.perf_counter()
    self.last = 0.0
    self.shown = False
    self.width = 0  # of the longest line so far, so that a shorter one covers it

  def __call__(self, files_done: int, files_total: int, rows: int) -> None:
    now = time.perf_counter()
    if not self.enabled or (now - self.last < 0.25 and files_done < files_total):
      return
    self.last = now
    rate = rows / max(now - self.start, 1e-9)
    line = f"prepare: files {files_done}/{files_total}  rows {rows:,}  {rate / 1e6:.2f}M rows/s"
    self.width = max(self.width, len(line))
    sys.stderr.write("\r" + line.ljust(self.width))
    sys.stderr.flush()
    self.shown = True

  def stage(self, text: str) -> None:
    """Show a step that has no row count (sorting, writing) after the last count."""
    if self.enabled:
      line = f"prepare: {text} ..."
      self.width = max(self.width, len(line))
      sys.stderr.write("\r" + line.ljust(self.width))
      sys.stderr.flush()
      self.shown = True

  def close(self) -> None:
    if self.shown:
      sys.stderr.write("\r" + "prepare: done".ljust(self.width) + "\n")
      sys.stderr.flush()


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


def run(args) -> int:
  config = load_config(args.config, args.overrides)
  splits = prepare(config, progress=True, force=args.force)
  print(format_summary(splits.summary))
  return 0
