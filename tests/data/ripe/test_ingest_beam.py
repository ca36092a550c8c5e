"""ingest on Apache Beam's DirectRunner writes the built-in runner's files and marker, byte
for byte, over JSON lines, bz2 and a JSON array; bad input is the same one-line error."""

import bz2
import json
import os
import random
import subprocess
import sys
import tempfile

import pytest

from maxtext_netdata import cli
from maxtext_netdata.data.raw.layout import FILE_PATTERN
from maxtext_netdata.data.ripe import decompress, shard_sort
from maxtext_netdata.data.ripe import ingest as builtin
from maxtext_netdata.data.ripe.sample import Sample
from maxtext_netdata.data.synthetic.generate import generate
from tests.helpers import folder_files, killed_runs_leftovers
from tests.helpers.ripe_results import FIRMWARE_0, MODERN
from tests.helpers.s3 import s3_server

beam = pytest.importorskip("apache_beam")  # the `beam` extra (scripts/test.sh installs it)

from maxtext_netdata.data.ripe import beam_runner  # noqa: E402

DIRECT = ["--runner=DirectRunner", "--direct_num_workers=1"]
BAD = b'{"type": "ping", "msm_id": "x"}\n'  # JSON, an array element, but no usable ping


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
  """Realistic ping results (generate's), shuffled: files overlap in time; their times cut to
  the minute, so each file has many results of one time (the merge's order of equal times)."""
  [path] = generate(
    str(tmp_path_factory.mktemp("json")), rows=9_000, shards=1, seed=3, progress=False,
    fmt="ripe-json",
  )  # fmt: skip
  results = []
  with open(path, "rb") as f:
    for line in f:
      result = json.loads(line)
      result["timestamp"] -= result["timestamp"] % 60
      results.append(json.dumps(result, separators=(",", ":")).encode() + b"\n")
  random.Random(0).shuffle(results)
  return results


def _inputs(folder, lines, bad_at=()) -> list[str]:
  """Three JSON-lines files (one with every real shape), one .bz2, one JSON array; a bad line
  at each (file, line) of `bad_at`."""
  parts = [list(lines[i::5]) for i in range(5)]
  parts[1] += [json.dumps(r).encode() + b"\n" for r in MODERN + FIRMWARE_0]
  for file, line in bad_at:
    parts[file].insert(line - 1, BAD)
  os.makedirs(folder, exist_ok=True)
  paths = []
  for i, part in enumerate(parts[:3]):
    paths.append(os.path.join(folder, f"hour-{i}.json"))
    with open(paths[-1], "wb") as f:
      f.writelines(part)
  paths.append(os.path.join(folder, "hour-3.json.bz2"))
  with open(paths[-1], "wb") as f:
    f.write(bz2.compress(b"".join(parts[3])))
  paths.append(os.path.join(folder, "hour-4.json"))
  with open(paths[-1], "wb") as f:
    f.write(b"[" + b",\n".join(line.rstrip(b"\n") for line in parts[4]) + b"]")
  return paths


def _both(tmp_path, inputs, **kwargs):
  """The built-in runner's files (one run sorted in memory) and the Beam runner's (runs of
  1,000 rows a file, merged): the same bytes whatever the runs."""
  a = builtin.ingest(inputs, str(tmp_path / "builtin"), progress=False, **kwargs)
  b = beam_runner.ingest(inputs, str(tmp_path / "beam"), beam_args=DIRECT, run_rows=1_000, **kwargs)
  return a, b, folder_files(tmp_path / "builtin"), folder_files(tmp_path / "beam")


@pytest.mark.parametrize("shards", [0, 3])
def test_beam_writes_the_builtin_files_and_marker(tmp_path, lines, shards, monkeypatch):
  # Batches of 64 rows (of ~3 results a second) merged: equal times across batch ends.
  monkeypatch.setattr(shard_sort, "_MERGE_BATCH", 64)
  inputs = _inputs(tmp_path / "in", lines)
  a, b, files_a, files_b = _both(tmp_path, inputs, shards=shards)
  assert (
    list(files_a)
    == list(files_b)
    == [
      ".complete",
      *(FILE_PATTERN.format(k, shards or 1) for k in range(shards or 1)),
    ]
  )
  for name in files_a:
    assert files_a[name] == files_b[name], name
  assert b.counts == a.counts and a.counts.rows == 9_000 + 9 and a.counts.other_types == 2
  assert [os.path.basename(p) for p in b.files] == [os.path.basename(p) for p in a.files]
  assert [n for n in os.listdir(tmp_path / "beam") if n.startswith(".")] == [".complete"]


def test_skipped_bad_lines_are_counted_over_every_worker(tmp_path, lines):
  inputs = _inputs(tmp_path / "in", lines, bad_at=[(0, 5), (3, 100), (4, 7)])
  a, b, files_a, files_b = _both(tmp_path, inputs, shards=2, skip_bad=True)
  assert files_a == files_b
  assert a.counts.bad_lines == b.counts.bad_lines == 3
  assert json.loads(files_b[".complete"])["bad_lines"] == 3


def test_a_sample_keeps_the_same_probes_and_times(tmp_path, lines):
  inputs = _inputs(tmp_path / "in", lines)
  all_rows = builtin.ingest(inputs, str(tmp_path / "all"), progress=False)
  times = sorted(json.loads(line)["timestamp"] for line in lines)
  sample = Sample(0.5, since=times[1_000], until=times[7_000])
  a, b, files_a, files_b = _both(tmp_path, inputs, shards=2, sample=sample)
  assert files_a == files_b
  assert 0 < a.counts.rows < all_rows.counts.rows and b.probes == a.probes > 0
  marker = json.loads(files_b[".complete"])
  assert marker["sample"]["probes"] == a.probes and marker["left_out"] > 0


def test_a_bad_line_fails_the_cli_with_the_builtin_one_line_error(tmp_path, lines, capsys):
  inputs = _inputs(tmp_path / "in", lines, bad_at=[(2, 40), (4, 3)])
  code = cli.main(["ingest", *inputs, "--out", str(tmp_path / "a")])
  builtin_error = capsys.readouterr().err
  code_beam = cli.main(["ingest", *inputs, "--out", str(tmp_path / "b"), "--runner", "beam"])
  beam_error = capsys.readouterr().err
  assert code == code_beam == 2
  assert beam_error == builtin_error.splitlines(keepends=True)[-1]  # after the progress bar
  assert beam_error.startswith(f"maxtext-netdata ingest: error: {inputs[2]}: line 40: a field")
  assert beam_error.count("\n") == 1
  assert os.listdir(tmp_path / "b") == []
  # Into a folder holding an earlier run's dataset: that run's files stay as they were.
  killed_runs_leftovers(tmp_path / "b")
  assert cli.main(["ingest", *inputs[:2], "--out", str(tmp_path / "b"), "--runner", "beam"]) == 0
  before = folder_files(tmp_path / "b")
  assert ".complete" in before and not [n for n in before if n.startswith(".") and n != ".complete"]
  assert cli.main(["ingest", *inputs, "--out", str(tmp_path / "b"), "--runner", "beam"]) == 2
  assert folder_files(tmp_path / "b") == before and ".complete" in before


def test_cli_passes_the_options_after_the_separator_to_beam(tmp_path, lines, capsys, monkeypatch):
  inputs = _inputs(tmp_path / "in", lines)
  out = str(tmp_path / "out")
  (tmp_path / "tmp").mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
  assert cli.main(["ingest", *inputs, "--out", out, "--runner", "beam", "--", *DIRECT]) == 0
  assert "9,009 rows written in 1 files" in capsys.readouterr().out
  assert os.listdir(tmp_path / "tmp") == []  # Beam's temporary folders removed with the run
  assert sorted(os.listdir(out)) == [".complete", FILE_PATTERN.format(0, 1)]
  assert cli.main(["ingest", *inputs, "--out", out, "--", *DIRECT]) == 2
  assert "add --runner beam" in capsys.readouterr().err
  assert cli.main(["ingest", *inputs, "--out", "gs://bucket/raw"]) == 2
  assert "a bucket needs --runner beam" in capsys.readouterr().err


def test_a_bucket_output_gets_the_builtinfolder_files(tmp_path, lines, monkeypatch):
  # s3:// (a local S3 server) as gs:// on Dataflow: runs, shards and marker through pyarrow.fs.
  inputs = _inputs(tmp_path / "in", lines)
  builtin.ingest(inputs, str(tmp_path / "builtin"), shards=2, progress=False)
  with s3_server(monkeypatch, "atlas") as client:
    client.put_object(Bucket="atlas", Key="raw/pings-00000-of-00009.parquet", Body=b"old")
    summary = beam_runner.ingest(
      inputs, "s3://atlas/raw", beam_args=DIRECT, shards=2, run_rows=1_000
    )
    listed = client.list_objects_v2(Bucket="atlas", Prefix="raw/")["Contents"]
    files = {
      o["Key"][4:]: client.get_object(Bucket="atlas", Key=o["Key"])["Body"].read()
      for o in listed
      if not o["Key"].endswith("/")  # pyarrow's empty marker of a folder
    }
  assert files == folder_files(tmp_path / "builtin")  # the earlier run's file gone, no work folder
  assert summary.files == [f"s3://atlas/raw/{FILE_PATTERN.format(k, 2)}" for k in range(2)]


@pytest.mark.slow  # the worker processes start in ~15 s
def test_worker_processes_write_the_builtinfolder_files(tmp_path, lines):
  # Each file mapped in another process (pickled settings, runs in the shared folder).
  inputs = _inputs(tmp_path / "in", lines, bad_at=[(1, 9)])
  builtin.ingest(inputs, str(tmp_path / "builtin"), shards=2, skip_bad=True, progress=False)
  beam_args = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
  summary = beam_runner.ingest(
    inputs, str(tmp_path / "beam"), beam_args=beam_args, shards=2, skip_bad=True, run_rows=1_000
  )
  assert folder_files(tmp_path / "beam") == folder_files(tmp_path / "builtin")
  assert summary.counts.bad_lines == 1


def test_cli_gives_beam_workers_the_decompress_threads(tmp_path, lines, monkeypatch):
  # Each worker decodes its bz2 file on --decompress-threads threads (1 where Dataflow runs a
  # worker process per vCPU): the count reaches the real reader, the output is the same.
  inputs = _inputs(tmp_path / "in", lines)
  seen = []
  real = decompress.Bz2Stream

  def recording(raw, threads):
    seen.append(threads)
    return real(raw, threads)

  monkeypatch.setattr(decompress, "Bz2Stream", recording)
  out = str(tmp_path / "beam")
  command = ["ingest", *inputs, "--out", out, "--runner", "beam", "--decompress-threads", "3"]
  assert cli.main([*command, "--", *DIRECT]) == 0
  assert seen == [3]  # the one .bz2 input
  builtin.ingest(inputs, str(tmp_path / "builtin"), progress=False)
  assert folder_files(out) == folder_files(tmp_path / "builtin")


# A run whose first mapped file sends the process SIGNAL inside the step's DoFn, then goes on.
_SIGNALLED_RUN = """
import os, signal, sys
from maxtext_netdata import cli
from maxtext_netdata.data.ripe import beam_runner
process = beam_runner._MapFile.process
def signalled(self, element):
  os.kill(os.getpid(), getattr(signal, sys.argv[1]))
  yield from process(self, element)
beam_runner._MapFile.process = signalled
sys.exit(cli.main(["ingest", *sys.argv[3:], "--out", sys.argv[2], "--runner", "beam"]))
"""


@pytest.mark.parametrize(
  ("signame", "status", "said"),
  [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated (SIGTERM)")],
)
def test_an_interrupt_in_a_step_ends_the_run_in_one_line(tmp_path, lines, signame, status, said):
  # Beam raises an exception of a step again as a RuntimeError after logging its traceback.
  inputs = _inputs(tmp_path / "in", lines)
  out = tmp_path / "out"
  done = subprocess.run(
    [sys.executable, "-c", _SIGNALLED_RUN, signame, str(out), *inputs],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert done.returncode == status, done.stderr[-3000:]
  assert done.stderr.splitlines() == [f"maxtext-netdata ingest: {said}"], done.stderr[-3000:]
  assert os.listdir(out) == []
