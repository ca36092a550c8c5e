"""prepare on Apache Beam's DirectRunner builds the built-in runner's store, byte for byte."""

import os
import subprocess
import sys

import pytest

from maxtext_netdata import cli
from maxtext_netdata.data.prepare import partition, prepare
from maxtext_netdata.data.synthetic.generate import generate
from tests.helpers import REPO
from tests.helpers.pipeline import store_config, store_files

beam = pytest.importorskip("apache_beam")  # the `beam` extra (scripts/test.sh installs it)

from maxtext_netdata.data.prepare import beam_runner  # noqa: E402


@pytest.fixture(scope="module")
def raw_files(tmp_path_factory):
  return generate(
    str(tmp_path_factory.mktemp("raw")), rows=20_000, shards=3, seed=2, progress=False
  )


WINDOW = ("network_since=2025-07-01T01:00:00", "network_until=2025-07-01T05:00:00")


@pytest.mark.parametrize(
  "overrides, sliced",
  [((), False), (("network_split=time",), False), (WINDOW, False), ((), True)],
  ids=["probe", "time", "time bounds", "buckets in slices"],
)
def test_beam_direct_runner_builds_the_builtin_store(
  tmp_path, raw_files, monkeypatch, overrides, sliced
):
  monkeypatch.setattr(partition, "MAX_BUCKET_ROWS", 3_000)  # 7 buckets: a real GroupByKey
  builtin = prepare.prepare(store_config(tmp_path / "a", raw_files, *overrides), progress=False)
  if sliced:  # Beam's buckets over one sort's rows: cut into slices of 700 rows at most
    monkeypatch.setattr(partition, "sort_rows", lambda memory_mb: 700)
    monkeypatch.setattr(partition, "bucket_rows", lambda memory_mb: 700)
    monkeypatch.setattr(partition, "num_buckets", lambda rows, memory_mb: 7)
  on_beam = prepare.prepare(
    store_config(tmp_path / "b", raw_files, *overrides),
    progress=False,
    runner=beam_runner.runner(["--runner=DirectRunner", "--direct_num_workers=1"]),
  )
  a, b = (
    store_files(builtin.summary["path"]),
    store_files(on_beam.summary["path"]),
  )
  assert a.keys() == b.keys() and "train/dst_index.npy" in a and "train/dst_table.npy" in a
  for name in a:
    assert a[name] == b[name], name
  assert on_beam.summary["rows_read"] == builtin.summary["rows_read"] == 20_000
  assert on_beam.summary["rows"] == builtin.summary["rows"]
  assert (builtin.summary["rows"] < 20_000) == (overrides == WINDOW)
  assert on_beam.summary["probes"] == builtin.summary["probes"]
  # Each file's rows and times, by which a file later leaves the store (docs/prepare.md).
  reports = on_beam.summary["train_file_reports"]
  assert reports == builtin.summary["train_file_reports"]
  assert len(reports) == 3 and all(r[2] is not None and r[2] <= r[3] for r in reports)
  assert os.listdir(tmp_path / "b") == [os.path.basename(on_beam.summary["path"])]


def test_a_day_prepared_on_beam_is_appended_to_a_time_split_store(tmp_path, raw_files):
  """The new files prepared on Beam with no test share, then cut with the base's rows at
  the cutoff of them all: the built-in full build's store (docs/prepare.md, "New files")."""
  split = ("network_split=time", "network_test_fraction=0.2")
  prepare.prepare(store_config(tmp_path / "inc", raw_files[:2], *split), progress=False)
  appended = prepare.prepare(
    store_config(tmp_path / "inc", raw_files, *split),
    progress=False,
    runner=beam_runner.runner(["--runner=DirectRunner", "--direct_num_workers=1"]),
  )
  assert appended.summary["appended"]["new_files"] == 1
  full = prepare.prepare(store_config(tmp_path / "full", raw_files, *split), progress=False)
  a, b = store_files(appended.summary["path"]), store_files(full.summary["path"])
  assert a.keys() == b.keys() and "test/seconds.npy" in a
  for name in a:
    assert a[name] == b[name], name
  assert appended.summary["splits"] == full.summary["splits"]


def test_cli_runs_beam_with_pipeline_options_after_the_separator(tmp_path, raw_files, capsys):
  code = cli.main(
    [
      "prepare",
      str(REPO / "configs" / "base.yml"),
      f"grain_train_files={','.join(raw_files)}",
      f"network_prepared_dir={tmp_path}",
      "--runner",
      "beam",
      "--",
      "--runner=DirectRunner",
    ]
  )
  assert code == 0
  assert "20,000 of 20,000 read" in capsys.readouterr().out


def test_a_beam_prepare_leaves_nothing_in_the_temporary_directory(tmp_path, raw_files):
  # Beam's DirectRunner tries Prism first and, when it cannot start, left a beam-temp* folder
  # in the temporary directory on every run.
  temporary = tmp_path / "tmp"
  temporary.mkdir()
  base = str(REPO / "configs" / "base.yml")
  run = subprocess.run(
    [
      sys.executable,
      "-m",
      "maxtext_netdata",
      "prepare",
      base,
      f"grain_train_files={','.join(raw_files)}",
      f"network_prepared_dir={tmp_path / 'store'}",
      "--runner",
      "beam",
    ],  # fmt: skip
    env={**os.environ, "TMPDIR": str(temporary), "JAX_PLATFORMS": "cpu"},
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert run.returncode == 0, run.stderr[-2000:]
  assert os.listdir(temporary) == []


# A prepare whose first file, read in the step's function, sends the process SIGINT first.
_INTERRUPTED_PREPARE = """
import os, signal, sys
from maxtext_netdata import cli
from maxtext_netdata.data.prepare import beam_runner
read = beam_runner._read_and_partition
def interrupted(*args):
  os.kill(os.getpid(), signal.SIGINT)
  return read(*args)
beam_runner._read_and_partition = interrupted
sys.exit(cli.main(["prepare", *sys.argv[1:], "--runner", "beam"]))
"""


def test_ctrl_c_in_a_step_ends_the_prepare_in_one_line(tmp_path, raw_files):
  # Beam raises an exception of a step again as a RuntimeError after logging its traceback.
  base = str(REPO / "configs" / "base.yml")
  files, store = f"grain_train_files={','.join(raw_files)}", tmp_path / "store"
  run = subprocess.run(
    [sys.executable, "-c", _INTERRUPTED_PREPARE, base, files, f"network_prepared_dir={store}"],
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert run.returncode == 130, run.stderr[-3000:]
  assert run.stderr.splitlines()[-1] == "maxtext-netdata prepare: interrupted", run.stderr[-3000:]
  assert "Traceback" not in run.stderr and "apitools" not in run.stderr
  assert os.listdir(store) == []  # no store, no temporary folder, no lock file
