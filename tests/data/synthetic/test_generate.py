"""generate: realistic, deterministic, time-sorted raw parquet that the schema accepts."""

import collections
import errno
import json
import os
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from maxtext_netdata import cli
from maxtext_netdata.data import file_lock
from maxtext_netdata.data.raw import reader
from maxtext_netdata.data.synthetic import generate as generate_module
from maxtext_netdata.data.synthetic.generate import generate
from tests.helpers import folder_files, killed_runs_leftovers


def _table(files):
  return pa.concat_tables([pq.read_table(f) for f in files])


def _bytes(files):
  return [open(f, "rb").read() for f in files]


def test_same_seed_same_files_other_seed_other_files(tmp_path):
  first = generate(str(tmp_path / "a"), rows=20_000, shards=2, seed=5, progress=False)
  again = generate(str(tmp_path / "b"), rows=20_000, shards=2, seed=5, progress=False)
  other = generate(str(tmp_path / "c"), rows=20_000, shards=2, seed=6, progress=False)
  assert _bytes(first) == _bytes(again)
  assert _bytes(first)[0] != _bytes(other)[0]
  assert _table(first).equals(_table(again))
  assert not _table(first).column("rtt").equals(_table(other).column("rtt"))


def test_schema_and_row_count(sample_files):
  table = _table(sample_files)
  assert table.num_rows == 80_000
  assert [pq.read_metadata(f).num_rows for f in sample_files] == [20_000] * 4
  assert table.schema.names == [
    "msm_id",
    "event_time",
    "src_addr",
    "dst_addr",
    "ip_version",
    "rtt",
    "size",
    "packet_error_count",
  ]
  types = {field.name: field.type for field in table.schema}
  assert types["msm_id"] == pa.int64() and types["rtt"] == pa.float64()
  assert pa.types.is_timestamp(types["event_time"])
  assert types["src_addr"] == pa.string() and types["dst_addr"] == pa.string()
  assert pa.types.is_integer(types["ip_version"])


def test_every_row_is_valid_and_versions_match(sample_files):
  total = 0
  for path in sample_files:
    columns, report = reader.read_raw(path)
    assert report.total == 0
    total += len(columns)
    v4 = columns.version == 4
    assert not columns.src[v4, 4:].any() and not columns.dst[v4, 4:].any()
  assert total == 80_000


def test_statistics_like_real_dumps(sample_files):
  table = _table(sample_files)
  rtt = table.column("rtt").to_numpy()
  ok = rtt >= 0
  assert set(rtt[~ok].tolist()) == {-1.0}
  assert 0.05 <= 1 - ok.mean() <= 0.17
  assert 0.45 <= (table.column("ip_version").to_numpy() == 4).mean() <= 0.72
  p50, p90 = np.percentile(rtt[ok], [50, 90])
  assert 15 <= p50 <= 120 and 120 <= p90 <= 450
  assert 1_000 < rtt.max() <= 300_000
  src = table.column("src_addr")
  dst = table.column("dst_addr")
  assert 0 < pc.sum(pc.equal(src, "")).as_py() < 100 and 0 < dst.null_count < 100


def test_probes_long_and_short_and_streams_periodic(sample_files):
  table = _table(sample_files)
  counts = collections.Counter(table.column("src_addr").to_pylist())
  counts.pop("", None)
  assert max(counts.values()) >= 2_000 and min(counts.values()) < 100
  assert len(counts) >= 20
  seconds = table.column("event_time").cast(pa.int64()).to_numpy() // 1000
  by_stream = collections.defaultdict(list)
  streams = zip(
    table.column("src_addr").to_pylist(), table.column("msm_id").to_pylist(), strict=True
  )
  for key, t in zip(streams, seconds.tolist(), strict=True):
    by_stream[key].append(t)
  gaps = np.concatenate([np.diff(v) for v in by_stream.values() if len(v) > 1])
  assert np.median(gaps) >= 60 and np.percentile(gaps, 2) >= 59


def test_time_sorted_across_shards_and_probe_in_every_shard(sample_files):
  tables = [pq.read_table(f) for f in sample_files]
  times = np.concatenate([t.column("event_time").cast(pa.int64()).to_numpy() for t in tables])
  assert (np.diff(times) >= 0).all()
  busiest = collections.Counter(_table(sample_files).column("src_addr").to_pylist()).most_common(1)
  for t in tables:
    assert busiest[0][0] in set(t.column("src_addr").to_pylist())


def test_rtt_is_learnable_from_addresses(sample_files):
  """The same (source, destination) pair has a stable RTT; different pairs differ widely."""
  table = _table(sample_files)
  rtt = table.column("rtt").to_numpy()
  pairs = collections.defaultdict(list)
  for s, d, r in zip(
    table.column("src_addr").to_pylist(),
    table.column("dst_addr").to_pylist(),
    rtt.tolist(),
    strict=True,
  ):
    if r >= 0:
      pairs[(s, d)].append(r)
  medians = np.array([np.median(v) for v in pairs.values() if len(v) >= 20])
  spread = np.median(
    [np.median(np.abs(np.array(v) / np.median(v) - 1)) for v in pairs.values() if len(v) >= 20]
  )
  assert spread < 0.1
  assert np.percentile(medians, 90) > 5 * np.percentile(medians, 10)


def test_marker_written_and_stale_shards_removed(tmp_path):
  out = str(tmp_path / "raw")
  generate(out, rows=4_000, shards=4, progress=False)
  paths = generate(out, rows=3_000, shards=2, progress=False)
  assert sorted(os.listdir(out)) == [".complete"] + sorted(os.path.basename(p) for p in paths)
  with open(os.path.join(out, ".complete")) as f:
    marker = json.load(f)
  assert marker["rows"] == 3_000 and marker["files"] == [os.path.basename(p) for p in paths]
  assert sum(pq.read_metadata(p).num_rows for p in paths) == 3_000


def test_a_run_that_fails_leaves_the_earlier_runs_files_as_they_were(tmp_path, monkeypatch):
  out = str(tmp_path / "raw")
  generate(out, rows=4_000, shards=4, progress=False)
  before = folder_files(out)
  made = generate_module._piece_table
  calls = []

  def failing(*args, **kwargs):  # the third time slice: two files written by then
    calls.append(1)
    if len(calls) == 3:
      raise KeyboardInterrupt
    return made(*args, **kwargs)

  monkeypatch.setattr(generate_module, "_piece_table", failing)
  with pytest.raises(KeyboardInterrupt):
    generate(out, rows=3_000, shards=3, seed=5, progress=False)
  assert folder_files(out) == before  # no file of the failed run, none of its folder


def test_bad_sizes_are_rejected(tmp_path):
  with pytest.raises(ValueError, match="rows >= shards"):
    generate(str(tmp_path), rows=3, shards=4)


def test_cli(tmp_path, capsys):
  out = str(tmp_path / "cli")
  assert cli.main(["generate", "--out", out, "--rows", "2000", "--shards", "2", "--seed", "3"]) == 0
  assert "2,000 rows in 2 files" in capsys.readouterr().out
  assert os.path.exists(os.path.join(out, ".complete"))
  assert cli.main(["generate", "--out", out, "--rows", "1", "--shards", "2"]) == 2
  assert "error: need --rows >= --shards" in capsys.readouterr().err


def test_large_runs_are_written_in_time_slices(tmp_path, monkeypatch):
  monkeypatch.setattr(generate_module, "PIECE_ROWS", 3_000)
  paths = generate(str(tmp_path), rows=20_000, shards=2, seed=1, progress=False)
  assert [pq.ParquetFile(p).num_row_groups for p in paths] == [4, 4]
  table = _table(paths)
  assert table.num_rows == 20_000
  assert (np.diff(table.column("event_time").cast(pa.int64()).to_numpy()) >= 0).all()
  columns, _ = reader.read_raw(paths[1])
  assert len(columns) == 10_000


def test_ripe_json_is_one_result_per_row_and_deterministic(tmp_path, capsys):
  out = str(tmp_path / "json")
  argv = ["generate", "--out", out, "--rows", "3000", "--shards", "2", "--format", "ripe-json"]
  assert cli.main(argv) == 0
  paths = sorted(os.path.join(out, n) for n in os.listdir(out) if n.endswith(".json"))
  assert [os.path.basename(p) for p in paths] == [
    "pings-00000-of-00002.json",
    "pings-00001-of-00002.json",
  ]
  first = _bytes(paths)
  assert cli.main(argv) == 0 and _bytes(paths) == first
  results = [json.loads(line) for p in paths for line in open(p, encoding="utf-8")]
  parquet = _table(generate(str(tmp_path / "pq"), rows=3000, shards=2, progress=False))
  assert len(results) == parquet.num_rows == 3000
  assert {r["type"] for r in results} == {"ping"} and all(len(r["result"]) == 1 for r in results)
  assert [r["from"] for r in results] == parquet.column("src_addr").to_pylist()
  seconds = parquet.column("event_time").cast(pa.timestamp("s", tz="UTC")).cast(pa.int64())
  assert [r["timestamp"] for r in results] == seconds.to_pylist()
  failed = [r["result"][0] for r in results if r["avg"] == -1]
  kinds = collections.Counter(next(iter(p)) for p in failed)
  assert kinds["x"] > 0 and kinds["error"] > 0 and set(kinds) == {"x", "error"}


def test_a_flipped_bit_in_a_data_page_is_caught_by_its_checksum(tmp_path):
  path = generate(str(tmp_path), rows=5_000, shards=1, seed=1, progress=False)[0]
  column = pq.ParquetFile(path).metadata.row_group(0).column(0)
  data = bytearray(open(path, "rb").read())
  # Into the page's body, past its header: the value bytes the checksum covers.
  data[column.data_page_offset + column.total_compressed_size - 8] ^= 0x10
  with open(path, "wb") as f:
    f.write(data)
  with pytest.raises(OSError, match="CRC checksum verification failed"):
    pq.read_table(path, page_checksum_verification=True)


def test_one_run_writes_a_folder_and_a_killed_runs_folder_is_removed_by_the_next(tmp_path):
  out = tmp_path / "raw"
  command = [sys.executable, "-m", "maxtext_netdata", "generate", "--out", str(out)]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  first = subprocess.Popen(
    [*command, "--rows", "40000000", "--shards", "4"], env=env, stderr=subprocess.DEVNULL
  )
  try:
    deadline = time.monotonic() + 120
    while not list(out.glob(".staging-*/pings-*")):  # the first file is being written
      assert first.poll() is None and time.monotonic() < deadline, "generate did not start"
      time.sleep(0.05)
    second = subprocess.run(
      [*command, "--rows", "1000", "--shards", "1"],
      env=env,
      capture_output=True,
      text=True,
      timeout=120,
    )
    assert first.poll() is None, "the first run ended before the second was refused"
    assert second.returncode == 2
    assert second.stderr.splitlines()[-1] == (
      f"maxtext-netdata generate: error: {out}: another run is writing this folder;"
      " wait for it to end or write elsewhere"
    )
  finally:
    first.kill()  # SIGKILL: nothing of it runs to clean up
    first.wait()
  assert list(out.glob(".staging-*")) and (out / ".writing").exists()
  paths = generate(str(out), rows=1_000, shards=1, progress=False)
  assert sorted(os.listdir(out)) == [".complete", os.path.basename(paths[0])]


@pytest.mark.parametrize(
  ("out", "error"),
  [
    ("file", "file: not a folder; the output needs a folder"),
    ("file/sub", "file/sub: cannot make the output folder: not a directory"),
    ("", "'': cannot make the output folder: no such file or directory"),
  ],
)
def test_an_output_that_cannot_be_a_folder_is_one_line(tmp_path, monkeypatch, capsys, out, error):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "file").write_text("a file")
  assert cli.main(["generate", "--out", out, "--rows", "100", "--shards", "1"]) == 2
  assert capsys.readouterr().err == f"maxtext-netdata generate: error: {error}\n"
  assert sorted(os.listdir(tmp_path)) == ["file"]


def test_a_folder_on_a_filesystem_without_locks_is_written_without_one(tmp_path, monkeypatch):
  # NFSv3 without lockd refuses flock with ENOLCK: the run goes on, unlocked, and leaves the
  # staging folder it cannot tell from a live run's.
  def no_locks(f, operation):
    raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

  monkeypatch.setattr(file_lock.fcntl, "flock", no_locks)
  out = tmp_path / "raw"
  killed_runs_leftovers(out)
  (out / ".writing").unlink()
  paths = generate(str(out), rows=1_000, shards=1, progress=False)
  names = sorted(os.listdir(out))
  assert names == [".complete", ".staging-killed", os.path.basename(paths[0])]
