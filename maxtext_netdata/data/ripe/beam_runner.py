"""`ingest --runner beam`: the same ingest as an Apache Beam pipeline, one input file a worker.

    maxtext-netdata ingest INPUT... --out DIR [--shards K ...] --runner beam [-- BEAM OPTIONS]

inputs (listed here, in name order) → each file mapped to rows by the built-in runner's code
(`ingest._mapped_blocks`: the compiled scanner, `data.ripe.reference` for the rest) and
written as time-sorted run files (`shard_sort.gather_runs`) → one worker merges every file's runs
into the shards (`shard_sort.write_shards`, the built-in runner's merge and writer) and writes
the `.complete` marker. The merge orders equal times by input order whatever the runs, and
the writer cuts row groups by row count alone, so both runners write byte-identical files
and the same marker for the same inputs and `--shards`. A unit of work is a whole file (a
month of dumps is ~700 hourly files): a compressed stream cannot be split, and a plain file
split into byte ranges would need the line numbers before its range for its errors.

Bad input does not fail the job: a worker reports its file's first error (`DataError`: a bad
line, naming file and line, or unreadable data) and the merge reports the first file's, the
error the built-in runner stops at, written to the work folder for the launching process to
raise as the CLI's one-line error. `--skip-bad` counts and the sample's counts are summed over
the files, the sample's probes are the union of theirs.

The run files and the result are written under a temporary folder in DIR (`.staging-*` in a
local one, `layout.staged`, `.ingest-runs-*` in a bucket; removed at the end), so DIR must be
one that every worker and the launching process see: a local folder for the DirectRunner (the
default); `gs://` / `s3://` (through `data.remote`'s pyarrow filesystems) or a shared mount
for Dataflow, Flink or Spark. In a local folder the shards are written in the work folder and
moved in place of an earlier run's once whole, as the built-in runner does (`layout.publish`:
a run that fails leaves the earlier run's files; one run at a time writes the folder); in a
bucket, where a move is a copy, an earlier run's files are deleted first and each shard is
written under its own name (an object appears whole when closed), the marker last.
Inputs may be `gs://` / `s3://` as for the built-in runner.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import tempfile
import time
import uuid
from collections.abc import Iterator

import pyarrow.fs as pafs

from maxtext_netdata.data import beam_temp, remote
from maxtext_netdata.data.raw import layout
from maxtext_netdata.data.raw.layout import COMPLETE_MARKER
from maxtext_netdata.data.ripe import ingest as builtin
from maxtext_netdata.data.ripe import reference, shard_sort
from maxtext_netdata.data.ripe import scan as ripe_scan
from maxtext_netdata.data.ripe.sample import Sample
from maxtext_netdata.errors import DataError, WritesTo

beam_temp.quiet_notices()  # before Beam is imported: its import logs one of them
import apache_beam as beam  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402

_RESULT = "result.json"


class _Output:
  """The output folder, local or a bucket's (`gs://`, `s3://`), as every step opens it.

  A local folder is written as the built-in runner writes it (`data.raw.layout`); in a bucket
  the shards are written under their names (an object appears whole when closed) and the
  marker last, as a local run's rename does.
  """

  def __init__(self, uri: str, options: remote.StorageOptions):
    self.uri = uri
    fs, self.path = remote.filesystem(uri, options)
    self.filesystem = None if isinstance(fs, pafs.LocalFileSystem) else fs

  def join(self, *names: str) -> str:
    return os.path.join(self.path, *names)

  @contextlib.contextmanager
  def work_dir(self) -> Iterator[str]:
    """The run's own folder inside the output folder while the block runs: in a local one,
    `layout.staged`'s (one run at a time writes the folder); in a bucket, `.ingest-runs-*`."""
    if self.filesystem is None:
      with layout.staged(self.path) as work_dir:
        yield work_dir
      return
    work_dir = self.join(f".ingest-runs-{uuid.uuid4().hex[:12]}")
    self.filesystem.create_dir(work_dir)
    try:
      yield work_dir
    finally:
      with contextlib.suppress(OSError):
        self.filesystem.delete_dir(work_dir)

  def clear(self) -> None:
    """In a bucket, the marker, then the shards, of an earlier run (`layout.clear_outputs`'s
    names); nothing in a local folder, whose earlier files `publish` replaces."""
    if self.filesystem is None:
      return
    selector = pafs.FileSelector(self.path, allow_not_found=True)
    names = {info.base_name for info in self.filesystem.get_file_info(selector)}
    if COMPLETE_MARKER in names:
      self.filesystem.delete_file(self.join(COMPLETE_MARKER))
    for name in sorted(names):
      if name.startswith("pings-") and name.endswith((".parquet", ".json")):
        self.filesystem.delete_file(self.join(name))

  def write_json(self, path: str, content: dict) -> None:
    if self.filesystem is None:
      with WritesTo(path), open(path, "w", encoding="utf-8") as f:
        json.dump(content, f)
    else:
      with WritesTo(path), self.filesystem.open_output_stream(path) as f:
        f.write(json.dumps(content).encode())

  def read_json(self, path: str) -> dict:
    if self.filesystem is None:
      with open(path, encoding="utf-8") as f:
        return json.load(f)
    with self.filesystem.open_input_stream(path) as f:
      return json.loads(f.read())

  def write_shards(self, work_dir: str, pieces, rows: int, files: int, content) -> list[str]:
    """`shard_sort.write_shards` of `pieces`, then the marker of `content(paths)`: through
    the work folder and `layout.publish` in a local folder, in place in a bucket."""
    if self.filesystem is None:
      return shard_sort.publish_shards(work_dir, self.path, pieces, rows, files, content)
    paths = shard_sort.write_shards(self.path, pieces, rows, files, self.filesystem)
    self.write_json(self.join(COMPLETE_MARKER), content(paths))
    return paths


def ingest(
  inputs: list[str],
  out_dir: str,
  *,
  beam_args: list[str] | None = None,
  shards: int = 0,
  skip_bad: bool = False,
  sample: Sample | None = None,
  block_bytes: int = builtin.BLOCK_BYTES,
  run_rows: int = builtin.RUN_ROWS,
  decompress_threads: int = 0,
) -> builtin.Summary:
  """`ingest.ingest` as a Beam pipeline run with `beam_args` (DirectRunner when none): the
  same files and marker in `out_dir` (a folder, or `gs://` / `s3://`), the same DataError for
  bad input. `decompress_threads` is each worker's for its bz2 file (0: every core of its
  machine; 1 where the runner starts a worker process per core, as Dataflow does)."""
  started = time.perf_counter()
  options = builtin.storage_options()
  entries = remote.expand_all(inputs, options, remote.VISIBLE_FILES)
  output = _Output(out_dir, options)
  settings = {
    "options": options,
    "block_bytes": block_bytes,
    "run_rows": run_rows,
    "skip_bad": skip_bad,
    "sample": sample,
    "decompress_threads": decompress_threads,
  }
  with output.work_dir() as work_dir:
    try:
      output.clear()
      pipeline_options = PipelineOptions(beam_args or ["--runner=DirectRunner"])
      with (
        beam_temp.interrupts_as_such(),
        beam_temp.temporary_files_in(tempfile.mkdtemp(prefix="ingest-beam-")),
        beam.Pipeline(options=pipeline_options) as pipeline,
      ):
        _ = (
          pipeline
          | "files" >> beam.Create(list(enumerate(entries)))
          # Any: the type Beam infers from the report's first key (a dict of ints) fails to encode
          | "map to sorted runs"
          >> beam.ParDo(_MapFile(settings, out_dir, work_dir)).with_output_types(beam.typehints.Any)
          | "all files" >> beam.combiners.ToList()
          | "merge into shards"
          >> beam.Map(_merge, options, out_dir, work_dir, inputs, shards, sample)
        )
      result = output.read_json(os.path.join(work_dir, _RESULT))
      if "error" in result:
        raise DataError(result["error"])
      return builtin.Summary(
        reference.Counts(**result["counts"]),
        [output.join(name) if output.filesystem is None else f"{out_dir.rstrip('/')}/{name}"
         for name in result["files"]],
        time.perf_counter() - started,
        sample,
        result["probes"],
      )  # fmt: skip
    except BaseException:
      with contextlib.suppress(OSError):
        output.clear()
      raise


class _MapFile(beam.DoFn):
  """One input file → its time-sorted run files in the work folder, and a report: counts,
  runs, probe keys (when sampling), or the file's first error."""

  def __init__(self, settings: dict, out_dir: str, work_dir: str):
    self.settings, self.out_dir, self.work_dir = settings, out_dir, work_dir

  def setup(self) -> None:
    ripe_scan.load()
    self.output = _Output(self.out_dir, self.settings["options"])

  def process(self, indexed):
    index, entry = indexed
    s, fs = self.settings, self.output.filesystem
    counts, runs, probes = reference.Counts(), [], set()
    report = {"index": index}
    try:
      tables = builtin._mapped_blocks(
        [entry], s["options"], s["block_bytes"], None, counts, s["skip_bad"], 0, True, s["sample"],
        s["decompress_threads"],
      )  # fmt: skip
      prefix = f"run-{index:06d}"
      rest = shard_sort.gather_runs(
        tables, self.work_dir, s["run_rows"], s["sample"], runs, probes, prefix, fs
      )
      if rest:
        runs.append(shard_sort.write_run(rest, self.work_dir, len(runs), prefix, fs))
    except DataError as e:  # the first bad line or unreadable data: the merge reports it
      report["error"] = str(e)
    report.update(counts=dataclasses.asdict(counts), runs=runs, probes=sorted(probes))
    yield report


def _merge(reports: list[dict], options, out_dir, work_dir, inputs, shards, sample) -> None:
  """Every file's runs, in input order, → the shards and the marker (the built-in runner's
  code); the outcome, or the first file's error, → `work_dir`/result.json."""
  output = _Output(out_dir, options)
  reports = sorted(reports, key=lambda r: r["index"])
  try:
    if error := next((r["error"] for r in reports if "error" in r), None):
      raise DataError(error)
    counts = reference.Counts()
    for report in reports:
      for name, value in report["counts"].items():
        setattr(counts, name, getattr(counts, name) + value)
    builtin.check_rows(counts, inputs, sample)
    runs = [path for report in reports for path in report["runs"]]
    files = builtin.shard_count(shards, counts.rows)
    pieces = shard_sort.merge(runs, output.filesystem)
    probes = len(set().union(*(r["probes"] for r in reports))) if sample else 0
    paths = output.write_shards(
      work_dir, pieces, counts.rows, files,
      functools.partial(builtin.marker, counts, sample, probes, inputs),
    )  # fmt: skip
    result = {
      "counts": dataclasses.asdict(counts),
      "files": [os.path.basename(p) for p in paths],
      "probes": probes,
    }
  except DataError as e:
    result = {"error": str(e)}
    with contextlib.suppress(OSError):
      output.clear()
  output.write_json(os.path.join(work_dir, _RESULT), result)
