"""`prepare`: raw parquet → the prepared store (cached by a fingerprint of inputs and config).

    maxtext-netdata prepare CONFIG [key=value ...] [--force] [--prune]
        [--runner beam [-- BEAM OPTIONS]]

Reads `grain_train_files` (and `grain_eval_files` if set) through `data.raw.reader`,
validates every row (`data.raw.schema`), partitions the rows by probe hash into buckets
spilled to local files, sorts one bucket at a time into a piece and assembles the pieces into
`<prepared_dir>/<fingerprint>/{train,test[,eval]}/` (`data.prepare.partition`,
`data.prepare.assemble`, `data.store.store`). Memory is bounded by
`network_prepare_memory_mb`, whatever the row count.

The fingerprint covers each input file's URI, size and modification time, the store format
and the config keys that change the store's content; a complete store with the same
fingerprint is opened instead of rebuilt; a complete store of some of the train files (and
the same content keys) is appended to, reading only the other files, and its files no longer
listed, or its rows outside new time bounds (`network_since`, `network_until`), are taken out
where time tells them apart (`data.prepare.append`: the same bytes as a full build). One
process builds a store at a time (a lock file beside it; the others wait, then open it). A
store is built in a temporary directory and renamed into place once complete, with the
summary (`meta.json`) written last: a prepare killed at any point leaves nothing that passes
for a store, and the next one removes its remains. With `network_prepared_dir` on `gs://` or
`s3://` the store is copied from there to the local cache once, or built locally and uploaded
when absent (`data.store.remote_copy`).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import glob
import json
import os
import resource
import shutil
import sys
import time
import uuid

import psutil

from maxtext_netdata.config import load as load_config
from maxtext_netdata.data import remote
from maxtext_netdata.data.prepare import (
  append,
  assemble,
  local_runner,
  merge,
  naming,
  partition,
  summary_text,
  time_merge,
  upgrade,
)  # fmt: skip
from maxtext_netdata.data.prepare.naming import content_key, fingerprint  # noqa: F401
from maxtext_netdata.data.raw import reader
from maxtext_netdata.data.store import remote_copy, store
from maxtext_netdata.errors import ConfigError, DataError


@dataclasses.dataclass
class PreparedSplits:
  """The opened splits: `eval` is the eval-files store, or the test split without them."""

  train: store.PreparedStore
  eval: store.PreparedStore
  summary: dict
  cached: bool


def ensure_prepared(config, *, progress: bool = True) -> PreparedSplits:
  """The store of `config`: opened if complete and current, else prepared now."""
  return prepare(config, progress=progress, force=False)


def prepare(
  config, *, progress: bool = True, force: bool = False, runner=None, prune: bool = False
) -> PreparedSplits:
  """Build the store of `config` unless a current one exists (or `force`); open it.

  `runner` builds the sorted pieces of one set of files (`data.prepare.beam_runner.runner`);
  None is the built-in one (`data.prepare.local_runner`). Listing, locking, assembling and
  caching are shared. `prune` then removes the stores this one supersedes
  (`append.superseded`: the stores that new files were, or could have been, appended to, and
  the store it was updated from), recorded in the summary's `pruned`.
  """
  config, options, train_files, eval_files = _inputs(config)
  splits = _prepare(
    config, options, train_files, eval_files, progress=progress, force=force, runner=runner
  )
  if prune:
    local_dir = os.path.dirname(splits.summary["path"])
    made = [splits.summary.get(k) for k in ("appended", "removed", "recut")]
    made_from = next((m["base"] for m in made if m), "")
    roots = append.superseded(
      local_dir, content_key(config, eval_files), train_files, made_from,
      local_runner.time_bounds(config), naming.recut_key(config, eval_files),
    )  # fmt: skip
    freed = sum(append.remove_store(root) for root in roots)
    splits.summary["pruned"] = {"stores": roots, "bytes": freed}
  return splits


def _inputs(config) -> tuple:
  """(config as prepared, storage options, train files, eval files), the files listed."""
  if not config.grain_train_files.strip():
    raise ConfigError("grain_train_files is empty: set it to raw parquet paths, globs or URIs")
  options = remote.StorageOptions.from_config(config)
  train_files = remote.expand_all(config.grain_train_files, options)
  eval_files = remote.expand_all(config.grain_eval_files, options)
  if eval_files:  # the eval files are the eval split: every row of the train files trains
    config = config.replace(network_test_fraction=0.0)
  return config, options, train_files, eval_files


def _prepare(
  config, options, train_files, eval_files, *, progress: bool, force: bool, runner
) -> PreparedSplits:
  fp = fingerprint(config, train_files, eval_files)
  shared = config.prepared_dir if remote.is_remote(config.prepared_dir) else ""
  local_dir = remote_copy.cache_dir(config) if shared else config.prepared_dir
  root = os.path.join(local_dir, fp)
  if not force:
    cached = _open_complete(root)
    if cached is not None:
      return cached
  os.makedirs(local_dir, exist_ok=True)
  copied_from = ""
  with naming.builder_lock(local_dir, fp, progress):
    if not force:
      cached = _open_complete(root)  # built by the process this one waited for
      if cached is not None:
        return cached
    for stale in glob.glob(os.path.join(glob.escape(local_dir), f".tmp-{fp}-*")):
      shutil.rmtree(stale, ignore_errors=True)  # a killed build's: the lock says none runs
    tmp = os.path.join(local_dir, f".tmp-{fp}-{uuid.uuid4().hex[:8]}")
    try:
      shared_root = remote_copy.join(shared, fp) if shared else ""
      if shared_root and not force and remote_copy.download(shared_root, tmp, options):
        copied_from = shared_root
      else:
        base, key = None, content_key(config, eval_files)
        bounds, recut = local_runner.time_bounds(config), naming.recut_key(config, eval_files)
        summary = None if force else upgrade.upgrade(
          local_dir, tmp, naming.description(config, eval_files), train_files, bounds,
          progress=progress,
        )  # fmt: skip
        if summary is None and not force:
          base = append.find_base(local_dir, key, train_files, bounds, recut=recut)
          why = "" if base else append.no_base_reason(local_dir, key, train_files, bounds, recut)
          if why and progress:
            print(f"prepare: building in full: {why}", file=sys.stderr)
        if summary is None and base is None and progress:
          for old, version, size in append.former_formats(local_dir):
            print(
              f"prepare: {old} is a store of format {version}, which this code does not read"
              f" (deleting it frees {size / 1e6:,.1f} MB): delete it once no older version"
              " of this code needs it",
              file=sys.stderr,
            )
        if summary is None:
          build = _build if base is None else functools.partial(_append, base=base)
          summary = build(config, options, train_files, eval_files, tmp, fp, progress, runner)
        store.write_json(os.path.join(tmp, store.META_FILE), summary)
        if shared_root:
          remote_copy.upload(tmp, shared_root, options)
      if os.path.isdir(root):
        shutil.rmtree(root)  # forced rebuild, or the remains of an interrupted one
      os.rename(tmp, root)
    finally:
      shutil.rmtree(tmp, ignore_errors=True)
  splits = _open_complete(root)
  splits.cached = False
  splits.summary["cached"] = False
  if copied_from:
    splits.summary["copied_from"] = copied_from
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
  summary["path"] = root
  return PreparedSplits(
    train=train,
    eval=store.PreparedStore(os.path.join(root, eval_name)),
    summary=summary,
    cached=True,
  )


def _build_group(
  config, options, files, *, work, name, split, meta, progress, runner, allow_empty=False
) -> tuple:
  """Prepare one set of files into split folder(s) under `work`: (counts, report, probes).

  Files without a valid row are an error unless `allow_empty` (files appended to a store).
  """
  metadata = reader.check_files(files, options)
  total = sum(m.num_rows for m in metadata)
  buckets = partition.num_buckets(total, config.network_prepare_memory_mb)
  pieces_dir = os.path.join(work, f".pieces-{name}")
  label = config.grain_train_files if name == "train" else config.grain_eval_files
  # Straight into the splits unless a time cutoff needs every row's time first.
  if runner is None and (split != "time" or not config.network_test_fraction):
    return local_runner.build(
      config, options, files, metadata, buckets=buckets, work=work, spill_dir=pieces_dir + "-spill",
      split=split, meta=meta, progress=progress, label=label, allow_empty=allow_empty,
    )  # fmt: skip
  build_pieces = local_runner.pieces if runner is None else runner
  pieces, report = build_pieces(
    config, options, files, metadata, buckets=buckets, pieces_dir=pieces_dir, progress=progress
  )
  if not pieces and not allow_empty:
    raise DataError(local_runner.no_rows_message(label, files, report))
  probes = assemble.distinct_probes(pieces)
  counts = assemble.assemble(pieces, work, split, config.network_test_fraction, meta)
  shutil.rmtree(pieces_dir, ignore_errors=True)
  return counts, report, probes


def _build(config, options, train_files, eval_files, tmp, fp, progress, runner) -> dict:
  start, cpu_start = time.perf_counter(), _cpu_seconds()
  rss_start = psutil.Process().memory_info().rss
  meta = {"fingerprint": fp, "source_files": [f.uri for f in train_files]}
  counts, report, probes = _build_group(
    config, options, train_files, work=tmp, name="train", split=config.network_split, meta=meta,
    progress=progress, runner=runner,
  )  # fmt: skip
  if eval_files:
    eval_meta = {"fingerprint": fp, "source_files": [f.uri for f in eval_files]}
    eval_counts, eval_report, _ = _build_group(
      config.replace(network_since="", network_until=""),  # the eval files are kept whole
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
  file_reports = [report.files[f.uri].to_json() for f in train_files]
  return _summary(
    config, fp, train_files, eval_files, counts, report, probes, start, cpu_start, rss_start,
    file_reports, tmp,
  )  # fmt: skip


def _append(config, options, train_files, eval_files, tmp, fp, progress, runner, *, base) -> dict:
  """`_build`'s store from `base` (a store of some of the train files) and the other files:
  those prepared alone, then both merged split by split, the base's rows of files no longer
  listed or outside the time bounds left out (`data.prepare.append`)."""
  start, cpu_start = time.perf_counter(), _cpu_seconds()
  rss_start = psutil.Process().memory_info().rss
  old = base.summary
  old_reports = dict(
    zip(map(tuple, old["train_file_entries"]), old.get("train_file_reports") or [], strict=False)
  )
  removed = [reader.FileReport.from_json(old_reports[tuple(e)]) for e in base.removed]
  bounds = local_runner.time_bounds(config)
  rebound = append.bounds_of(old) != bounds
  recut = base.test_fraction != config.network_test_fraction  # a time split's, cut again
  if progress:
    said = [f"appending {len(base.new_files)} new file(s)"] if base.new_files else []
    if removed:
      said.append(f"removing {len(removed)} file(s) no longer listed")
    if rebound:
      said.append(f"keeping the rows within {local_runner.span_text(bounds)}")
    if recut:
      said.append(
        f"cutting its time split again at test fraction {config.network_test_fraction:g}"
        f" (was {base.test_fraction:g})"
      )
    print(f"prepare: updating store {base.root}: {', '.join(said)}", file=sys.stderr)
  delta = os.path.join(tmp, ".delta")
  meta = {"fingerprint": fp, "source_files": [f.uri for f in train_files]}
  names = assemble.split_names(config.network_split)
  report, new_rows = reader.ReadReport(), 0
  # A time split's cutoff is that of all rows, old and new: the new files are prepared with
  # no test share, and cut with the base's rows at the new cutoff in the merge (as is a base
  # of another test share, at the new one).
  cut = config.network_split == "time" and (config.network_test_fraction > 0 or recut)
  if base.new_files:
    new_counts, report, _ = _build_group(
      config.replace(network_test_fraction=0) if cut else config, options, base.new_files,
      work=delta, name="train", split=config.network_split, meta=meta, progress=progress,
      runner=runner, allow_empty=True,
    )  # fmt: skip
    new_rows = sum(new_counts[n]["rows"] for n in names)
  merge_start = time.perf_counter()
  # The bar's total: exact unless the time bounds changed (then the rows they drop are not
  # known before the merge).
  removed_rows = sum(r.rows_read - r.skipped.total for r in removed)
  rows = sum(old["splits"][n]["rows"] for n in names) + new_rows - removed_rows
  batch_rows = partition.bucket_rows(config.network_prepare_memory_mb)
  counts, probes = {}, None
  with merge.merge_bar(rows, progress) as bar:
    if cut:
      counts, probes = time_merge.merge_time_split(
        base.root, delta, tmp, meta, fraction=config.network_test_fraction, window=base.window,
        batch_rows=batch_rows, bar=bar,
      )  # fmt: skip
    else:
      for name in names:
        sources = [(os.path.join(base.root, name), base.window), (os.path.join(delta, name), None)]
        counts[name] = merge.merge_split(
          sources, os.path.join(tmp, name), {**meta, "split": name}, batch_rows=batch_rows,
          bar=bar,
        )  # fmt: skip
  shutil.rmtree(delta, ignore_errors=True)
  if eval_files:
    eval_meta = {"fingerprint": fp, "source_files": [f.uri for f in eval_files], "split": "eval"}
    counts["eval"] = merge.link_split(
      os.path.join(base.root, "eval"), os.path.join(tmp, "eval"), eval_meta
    )
  if probes is None:  # each probe is in one split
    probes = sum(counts[n]["probes"] for n in names)
  file_reports = []  # kept only when every file's is known (not for a base without them)
  for f in train_files:
    known = report.files.get(f.uri)
    known = known.to_json() if known else old_reports.get(tuple(dataclasses.astuple(f)))
    if known is None:
      file_reports = None
      break
    file_reports.append(known)
  summary = _summary(
    config, fp, train_files, eval_files, counts, report, probes, start, cpu_start, rss_start,
    file_reports, tmp,
  )  # fmt: skip
  # The counts are the whole store's, its speed this run's: new rows read, and the merge.
  summary["rows_read"] += old["rows_read"] - sum(r.rows_read for r in removed)
  skipped = collections.Counter(old["skipped"])
  skipped.update(summary["skipped"])
  for one in removed:
    skipped.subtract(one.skipped.reasons)
  summary["skipped"] = {reason: n for reason, n in sorted(skipped.items()) if n}
  summary["skipped_rows"] = sum(summary["skipped"].values())
  made = {
    "base": base.root,
    "base_rows": old["rows"],
    "merge_seconds": round(time.perf_counter() - merge_start, 3),
  }
  if base.new_files:
    summary["appended"] = {
      **made,
      "new_files": len(base.new_files),
      "new_rows_read": report.rows_read,
    }
  if removed or rebound:
    kept = sum(counts[n]["rows"] for n in names) - new_rows
    dropped = sum(old["splits"][n]["rows"] for n in names) - kept
    summary["removed"] = {**made, "files": len(removed), "rows": dropped, "rebound": rebound}
  if recut:
    summary["recut"] = {**made, "test_fraction": base.test_fraction}
  return summary


def _summary(
  config, fp, train_files, eval_files, counts, report, probes, start, cpu_start, rss_start,
  file_reports, root,
) -> dict:  # fmt: skip
  seconds = time.perf_counter() - start
  cpu = max(_cpu_seconds() - cpu_start, 1e-9)
  peak = peak_rss_bytes()
  for name, split in counts.items():  # each split's first and last second (the time split's
    # test split starts at its cutoff)
    split["span"] = store.time_span(store.PreparedStore(os.path.join(root, name)))
  total = counts["train"]["rows"] + counts["test"]["rows"]
  failed = counts["train"]["failed"] + counts["test"]["failed"]
  return {
    "format_version": store.FORMAT_VERSION,
    "fingerprint": fp,
    "content_key": content_key(config, eval_files),
    "train_files": [f.uri for f in train_files],
    "train_file_entries": append.entries(train_files),
    **({"train_file_reports": file_reports} if file_reports is not None else {}),
    "eval_files": [f.uri for f in eval_files],
    "network_split": config.network_split,
    "network_test_fraction": config.network_test_fraction,
    "time_bounds": list(local_runner.time_bounds(config)),
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
    # None where no raw row was read (an update that only took rows out or cut again)
    "peak_bytes_per_row": (
      round(max(peak - rss_start, 0) / report.rows_read, 1) if report.rows_read else None
    ),
  }


def _cpu_seconds() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def peak_rss_bytes() -> int:
  """This process's peak resident memory: VmHWM, the high-water mark of its own memory.

  Not `ru_maxrss` where /proc has VmHWM: Linux folds into `ru_maxrss` the memory a process
  had before `exec`, which for a command started by another process is its parent's (a
  child of a 1 GiB process, 11 MiB resident itself, reported 1,051 MiB).
  """
  try:
    with open("/proc/self/status", encoding="ascii") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def run(args) -> int:
  config = load_config(args.config, args.overrides)
  runner = None
  if args.runner == "beam":
    try:
      from maxtext_netdata.data.prepare import beam_runner  # noqa: PLC0415 (an optional extra)
    except ImportError as e:
      raise ConfigError(f"--runner beam needs Apache Beam: pip install '.[beam]' ({e})") from None
    runner = beam_runner.runner(getattr(args, "passthrough", []))
  elif getattr(args, "passthrough", []):
    raise ConfigError("options after `--` are Beam pipeline options: add --runner beam")
  splits = prepare(config, progress=True, force=args.force, runner=runner, prune=args.prune)
  print(summary_text.format_summary(splits.summary))
  return 0
