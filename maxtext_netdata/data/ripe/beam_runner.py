"""`ingest --runner beam`: the same ingest as an Apache Beam pipeline, one input file a worker.

    maxtext-netdata ingest INPUT... --out DIR [--shards K ...] --runner beam [-- BEAM OPTIONS]

inputs (listed here, in name order) → each file mapped to rows by the built-in runner's code
(`ingest._mapped_blocks`: the compiled scanner, `data.ripe.reference` for the rest) and
written as time-sorted run files (`ingest.gather_runs`) → one worker merges every file's runs
into the shards (`ingest.write_shards`, the built-in runner's merge and writer) and writes
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

The run files and the result are written under a temporary folder in DIR, so DIR must be one
that every worker and the launching process see: a local folder for the DirectRunner (the
default), a shared mount (Filestore, NFS, a GCS FUSE mount of a bucket) for Dataflow, Flink
or Spark, as `prepare --runner beam`'s store folder. Inputs may be `gs://` / `s3://`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from maxtext_netdata.data import remote
from maxtext_netdata.data.raw.layout import clear_outputs, write_complete_marker
from maxtext_netdata.data.ripe import ingest as builtin
from maxtext_netdata.data.ripe import reference
from maxtext_netdata.data.ripe import scan as ripe_scan
from maxtext_netdata.data.ripe.sample import Sample
from maxtext_netdata.errors import DataError, WritesTo

_RESULT = "result.json"


@contextlib.contextmanager
def _temporary_files_in(folder: str):
  """Python's temporary files made in `folder` while the pipeline runs, removed with it.

  Beam's DirectRunner first tries to start Prism, making a folder in the system's temporary
  directory that it leaves behind when Prism cannot start; as `data.prepare.beam_runner`'s
  (a room `data.ripe` does not import).
  """
  os.makedirs(folder, exist_ok=True)
  saved, tempfile.tempdir = tempfile.tempdir, folder
  try:
    yield
  finally:
    tempfile.tempdir = saved
    shutil.rmtree(folder, ignore_errors=True)


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
) -> builtin.Summary:
  """`ingest.ingest` as a Beam pipeline run with `beam_args` (DirectRunner when none): the
  same files and marker in `out_dir`, the same DataError for bad input."""
  started = time.perf_counter()
  options = builtin.storage_options()
  entries = remote.expand_all(inputs, options)
  os.makedirs(out_dir, exist_ok=True)
  clear_outputs(out_dir)
  work_dir = tempfile.mkdtemp(prefix=".ingest-runs-", dir=out_dir)
  settings = {
    "options": options,
    "block_bytes": block_bytes,
    "run_rows": run_rows,
    "skip_bad": skip_bad,
    "sample": sample,
  }
  try:
    pipeline_options = PipelineOptions(beam_args or ["--runner=DirectRunner"])
    with (
      _temporary_files_in(work_dir + "-tmp"),
      beam.Pipeline(options=pipeline_options) as pipeline,
    ):
      _ = (
        pipeline
        | "files" >> beam.Create(list(enumerate(entries)))
        # Any: the type Beam infers from the report's first key (a dict of ints) fails to encode
        | "map to sorted runs"
        >> beam.ParDo(_MapFile(settings, work_dir)).with_output_types(beam.typehints.Any)
        | "all files" >> beam.combiners.ToList()
        | "merge into shards" >> beam.Map(_merge, work_dir, out_dir, inputs, shards, sample)
      )
    with open(os.path.join(work_dir, _RESULT), encoding="utf-8") as f:
      result = json.load(f)
    if "error" in result:
      raise DataError(result["error"])
    return builtin.Summary(
      reference.Counts(**result["counts"]),
      [os.path.join(out_dir, name) for name in result["files"]],
      time.perf_counter() - started,
      sample,
      result["probes"],
    )
  except BaseException:
    with contextlib.suppress(OSError):
      clear_outputs(out_dir)
    raise
  finally:
    shutil.rmtree(work_dir, ignore_errors=True)


class _MapFile(beam.DoFn):
  """One input file → its time-sorted run files in the work folder, and a report: counts,
  runs, probe keys (when sampling), or the file's first error."""

  def __init__(self, settings: dict, work_dir: str):
    self.settings, self.work_dir = settings, work_dir

  def setup(self) -> None:
    ripe_scan.load()

  def process(self, indexed):
    index, entry = indexed
    s = self.settings
    counts, runs, probes = reference.Counts(), [], set()
    report = {"index": index}
    try:
      tables = builtin._mapped_blocks(
        [entry], s["options"], s["block_bytes"], None, counts, s["skip_bad"], 0, True, s["sample"]
      )
      prefix = f"run-{index:06d}"
      rest = builtin.gather_runs(
        tables, self.work_dir, s["run_rows"], s["sample"], runs, probes, prefix
      )
      if rest:
        runs.append(builtin._write_run(rest, self.work_dir, len(runs), prefix))
    except DataError as e:  # the first bad line or unreadable data: the merge reports it
      report["error"] = str(e)
    report.update(counts=dataclasses.asdict(counts), runs=runs, probes=sorted(probes))
    yield report


def _merge(reports: list[dict], work_dir, out_dir, inputs, shards, sample) -> None:
  """Every file's runs, in input order, → the shards and the marker (the built-in runner's
  code); the outcome, or the first file's error, → `work_dir`/result.json."""
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
    paths = builtin.write_shards(out_dir, runs, counts.rows, files)
    probes = len(set().union(*(r["probes"] for r in reports))) if sample else 0
    write_complete_marker(out_dir, builtin.marker(counts, sample, probes, inputs, paths))
    result = {
      "counts": dataclasses.asdict(counts),
      "files": [os.path.basename(p) for p in paths],
      "probes": probes,
    }
  except DataError as e:
    result = {"error": str(e)}
    with contextlib.suppress(OSError):
      clear_outputs(out_dir)
  path = os.path.join(work_dir, _RESULT)
  with WritesTo(path), open(path, "w", encoding="utf-8") as f:
    json.dump(result, f)
