"""`prepare --runner beam`: the same prepare as an Apache Beam pipeline.

    maxtext-netdata prepare CONFIG [key=value ...] --runner beam [-- BEAM PIPELINE OPTIONS]

read each file in batches and partition its rows by probe bucket (`partition.read_chunks`, a file's batches
gathered by `partition.Gather` into one record a bucket) → GroupByKey on the bucket → sort each bucket and write it as a piece
(`local_runner.write_pieces`; a bucket larger than one sort in slices). The functions are the built-in runner's, so both build
byte-identical stores; listing, the builder lock, assembling the pieces into the store and
caching stay in `data.prepare.prepare`. Beam's DirectRunner runs it unless the options after `--`
name another runner (`--runner=DataflowRunner --project ... --temp_location gs://...`).

The pieces and the read reports are written under the store's temporary folder, so that
folder must be one that every worker and the launching process see: a local folder for the
DirectRunner, a shared mount (Filestore, GCS FUSE, NFS) for a distributed runner.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile

import numpy as np

from maxtext_netdata.data import beam_temp
from maxtext_netdata.data.prepare import bucket_sort, local_runner, partition
from maxtext_netdata.data.raw import reader

beam_temp.quiet_notices()  # before Beam is imported: its import logs one of them
import apache_beam as beam  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402


def runner(beam_args: list[str]):
  """A `prepare.prepare(runner=...)` that runs the piece building as a Beam pipeline."""

  def build_pieces(config, options, files, metadata, *, buckets, pieces_dir, progress):
    del metadata, progress  # workers read each file's footer themselves
    reports_dir = pieces_dir + "-reports"
    os.makedirs(reports_dir, exist_ok=True)
    settings = {
      "buckets": buckets,
      "hashed": local_runner.uses_hashed_order(config),
      "skip_bad": config.network_skip_bad_rows,
      "bounds": local_runner.time_bounds(config),
      "gather_rows": partition.gather_rows(buckets, config.network_prepare_memory_mb),
      "sort_rows": partition.sort_rows(config.network_prepare_memory_mb),
      "slice_rows": partition.bucket_rows(config.network_prepare_memory_mb),
    }
    pipeline_options = PipelineOptions(beam_args or ["--runner=DirectRunner"])
    with (
      beam_temp.interrupts_as_such(),
      beam_temp.temporary_files_in(pieces_dir + "-tmp"),
      beam.Pipeline(options=pipeline_options) as pipeline,
    ):
      _ = (
        pipeline
        | "files" >> beam.Create(list(enumerate(files)))
        | "read and partition" >> beam.FlatMap(_read_and_partition, options, settings, reports_dir)
        | "group by bucket" >> beam.GroupByKey()
        | "sort and write" >> beam.Map(_sort_and_write, pieces_dir, settings)
      )
    report = reader.ReadReport()
    for name in sorted(os.listdir(reports_dir)):
      with open(os.path.join(reports_dir, name), encoding="utf-8") as f:
        one = json.load(f)
      report.add_file(one["uri"], reader.FileReport.from_json(one["report"]))
    shutil.rmtree(reports_dir)  # read: no part of the store
    pieces = (
      sorted(os.path.join(pieces_dir, name) for name in os.listdir(pieces_dir))
      if os.path.isdir(pieces_dir)
      else []
    )
    return pieces, report

  return build_pieces


def _read_and_partition(indexed, options, settings, reports_dir):
  """(bucket, chunk bytes) of one file's rows; its read report goes to `reports_dir`."""
  index, entry = indexed
  metadata = reader.check_files([entry], options)[0]
  report = reader.ReadReport()
  gather = partition.Gather(settings["buckets"], settings["gather_rows"])
  chunks = partition.read_chunks(
    entry,
    metadata,
    options,
    hashed=settings["hashed"],
    skip_bad=settings["skip_bad"],
    report=report,
    bounds=settings["bounds"],
  )
  for records in (*map(gather.add, chunks), gather.flush()):
    if records is not None:
      for bucket, record in records:
        yield bucket, record.tobytes()
  result = {"uri": entry.uri, "report": report.files[entry.uri].to_json()}
  with open(os.path.join(reports_dir, f"{index:06d}.json"), "w", encoding="utf-8") as f:
    json.dump(result, f)


def _sort_and_write(grouped, pieces_dir, settings):
  """A bucket's records (Beam's grouped values: iterable again and again) sorted and written
  as pieces: whole, or in slices in a local folder when one sort may not hold its rows
  (`local_runner.sort_in_slices`)."""
  bucket, records = grouped
  bucket = int(bucket)
  rows = sum(partition.whole_records(np.frombuffer(r, np.uint8))[1] for r in records)
  if rows <= settings["sort_rows"]:
    parts = [bucket_sort.order_bucket([partition.read_records(list(records))])]
    return local_runner.write_pieces(bucket, parts, pieces_dir)
  with tempfile.TemporaryDirectory(prefix=f"bucket-{bucket:05d}-slices-") as folder:
    chunks = functools.partial(_record_chunks, records)
    parts = local_runner.sort_in_slices(chunks, folder, settings["slice_rows"])
    return local_runner.write_pieces(bucket, parts, pieces_dir)


def _record_chunks(records):
  """A chunk of each of a bucket's records, in their order."""
  for record in records:
    yield partition.read_records([record])
