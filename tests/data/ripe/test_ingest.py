"""ingest: RIPE Atlas ping results as JSON, in every real shape, → raw parquet (docs/spec.md §1)."""

import bz2
import glob
import gzip
import json
import os
import random
import subprocess
import sys
import threading

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from maxtext_netdata import cli, config
from maxtext_netdata.data.prepare import prepare
from maxtext_netdata.data.ripe.ingest import ingest
from maxtext_netdata.data.synthetic.generate import generate
from maxtext_netdata.errors import DataError
from tests.helpers import folder_files, killed_runs_leftovers
from tests.helpers.ripe_results import FIRMWARE_0, MODERN, T0
from tests.helpers.s3 import s3_server

SPEC_COLUMNS = ["msm_id", "event_time", "src_addr", "dst_addr", "ip_version", "rtt"]

# The rows docs/spec.md §1 says each of ripe_results' shapes becomes.
EXPECTED = [  # (msm_id, seconds after T0, src, dst, version, rtt, prb_id), in time order
  (1003, 3, "80.1.1.1", "193.0.14.129", 4, 58.042, 10),
  (1003, 4, "81.1.1.1", "193.0.14.129", 4, -1.0, 11),
  (2001, 5, "2a00:1::5", "2001:db8::1", 6, 40.0, 8),
  (2001, 5, "2a00:1::5", "2001:db8::1", 6, -1.0, 8),
  (1002, 7, "95.4.3.2", "8.8.8.8", 4, 20.0, 9),
  (1001, 10, "77.1.2.3", "193.0.14.129", 4, 12.5, 7),
  (1001, 10, "77.1.2.3", "193.0.14.129", 4, -1.0, 7),
  (1001, 10, "77.1.2.3", "193.0.14.129", 4, -1.0, 7),
  (1001, 10, "77.1.2.3", "193.0.14.129", 4, 13.25, 7),
]


def _lines(results) -> bytes:
  return b"".join(json.dumps(r).encode() + b"\n" for r in results)


def _write(path, data: bytes) -> str:
  with open(path, "wb") as f:
    f.write(data)
  return str(path)


def _rows(out_dir) -> pa.Table:
  files = sorted(glob.glob(os.path.join(out_dir, "*.parquet")))
  return pa.concat_tables([pq.read_table(f) for f in files])


def _seconds(table):
  return pc.cast(table.column("event_time"), pa.timestamp("s", tz="UTC")).cast(pa.int64())


def _tuples(table):
  seconds = _seconds(table).to_pylist()
  columns = [table.column(c).to_pylist() for c in ("src_addr", "dst_addr", "ip_version", "rtt")]
  return [
    (m, s - T0, *rest, p)
    for m, s, *rest, p in zip(
      table.column("msm_id").to_pylist(),
      seconds,
      *columns,
      table.column("prb_id").to_pylist(),
      strict=True,
    )
  ]


def _cli(*args):
  return subprocess.run(
    [sys.executable, "-m", "maxtext_netdata", *args],
    capture_output=True,
    text=True,
    timeout=120,
  )


def test_every_real_shape_maps_as_the_spec_says(tmp_path):
  path = _write(tmp_path / "mixed.json", _lines(MODERN + FIRMWARE_0))
  summary = ingest([path], str(tmp_path / "out"), progress=False)
  assert _tuples(_rows(tmp_path / "out")) == EXPECTED
  c = summary.counts
  assert (c.results, c.rows, c.other_types, c.duplicates, c.bad_lines) == (7, 9, 2, 1, 0)
  marker = json.load(open(tmp_path / "out" / ".complete"))
  assert marker["rows"] == 9 and marker["files"] == ["pings-00000-of-00001.parquet"]


# Values DuckDB's reader casts (a float id, a boolean, numbers as text, an address that is a
# number): the lines of a block it rejects are read again by halves, and must cast alike.
ODD = [
  dict(MODERN[0], msm_id=1005.6, prb_id="12", timestamp=T0 + 20),
  dict(MODERN[1], af="6", rcvd=True, timestamp=T0 + 21, result=[{"rtt": "7.5"}, {"dup": True}]),
  dict(FIRMWARE_0[0], src_addr=5, timestamp=T0 + 22),
]


def test_whole_block_and_halves_give_the_same_rows(tmp_path):
  results = [dict(r, timestamp=T0 + 100 + i) for i, r in enumerate(MODERN * 20 + ODD * 20)]
  good = _lines(results).splitlines(keepends=True)
  spoiled = list(good)
  for at in (7, 33, 34, 101):  # four bad lines: the block is read again by halves
    spoiled.insert(at, b'{"type": "ping", "msm_id": "x"}\n' if at == 33 else b"not json\n")
  whole = ingest([_write(tmp_path / "a.json", b"".join(good))], str(tmp_path / "a"), progress=False)
  path = _write(tmp_path / "b.json", b"".join(spoiled))
  halves = ingest([path], str(tmp_path / "b"), skip_bad=True, progress=False)
  assert _rows(tmp_path / "b").equals(_rows(tmp_path / "a"))
  assert halves.counts.bad_lines == 4 and whole.counts.rows == halves.counts.rows
  rows = _tuples(_rows(tmp_path / "a"))
  assert (1006, "77.1.2.3", 12.5) in [(r[0], r[2], r[5]) for r in rows]  # 1005.6 rounds
  assert (2001, 6, 7.5) in [(r[0], r[4], r[5]) for r in rows]
  with pytest.raises(DataError, match=r"b.json: line 8: not JSON"):
    ingest([str(tmp_path / "b.json")], str(tmp_path / "c"), progress=False)
  del spoiled[7]
  with pytest.raises(DataError, match=r"b.json: line 33: a field has an unusable value .*x"):
    ingest([_write(tmp_path / "b.json", b"".join(spoiled))], str(tmp_path / "c"), progress=False)


def test_json_array_and_every_compression_give_the_same_rows(tmp_path):
  results = MODERN + [
    # `},{` and escaped quotes inside strings must not split the array element
    dict(MODERN[2], msm_name='a "},{" b \\', timestamp=T0 + 8, msm_id=1004),
  ]
  lines = _lines(results)
  array = json.dumps(results).encode()
  pretty = json.dumps(results, indent=2).encode()
  inputs = {
    "lines.json": lines,
    "lines.json.gz": gzip.compress(lines),
    "lines.json.bz2": bz2.compress(lines),
    "lines.json.zst": pa.Codec("zstd").compress(lines, asbytes=True),
    "array.json": array,
    "pretty.json": pretty,
    "array.json.bz2": bz2.compress(array),
    # UTF-8's byte order mark first, as some tools write it
    "bom-lines.json": b"\xef\xbb\xbf" + lines,
    "bom-array.json": b"\xef\xbb\xbf" + pretty,
    "bom-array.json.gz": gzip.compress(b"\xef\xbb\xbf" + array),
  }
  reference = None
  for name, data in inputs.items():
    out = str(tmp_path / f"out-{name}")
    # A 64-byte block cuts elements and lines everywhere: carries between blocks must hold.
    ingest([_write(tmp_path / name, data)], out, block_bytes=64, progress=False)
    rows = _tuples(_rows(out))
    reference = reference or rows
    assert rows == reference, name
  assert len(reference) == 8 and reference[-1][:2] == (1001, 10)
  assert (1004, 8, "95.4.3.2", "8.8.8.8", 4, 20.0, 9) in reference


@pytest.mark.parametrize(
  "text, line, reason",
  [
    ('{"this is": "not json"\n', 3, "not JSON"),
    ('{"type": "ping", "msm_id": 3, "af": 4, "result": []}\n', 3, "no timestamp"),
    ('{"type": "ping", "msm_id": 3, "timestamp": 5, "af": 5, "result": []}\n', 3, "af is 5"),
  ],
)
def test_a_bad_line_is_one_error_line_naming_file_and_line(tmp_path, text, line, reason):
  good = _lines(MODERN[:2])
  path = _write(tmp_path / "bad.json", good + text.encode() + _lines(MODERN[2:]))
  done = _cli("ingest", path, "--out", str(tmp_path / "out"))
  assert done.returncode == 2, done.stderr
  error = done.stderr.strip().splitlines()[-1]
  assert error.startswith(f"maxtext-netdata ingest: error: {path}: line {line}: "), error
  assert reason in error and "Traceback" not in done.stderr
  assert os.listdir(tmp_path / "out") == []  # no shard, no marker, no work folder left
  # Into a folder holding an earlier run's dataset: that run's files stay as they were.
  killed_runs_leftovers(tmp_path / "out")
  earlier = _cli("ingest", _write(tmp_path / "good.json", good), "--out", str(tmp_path / "out"))
  assert earlier.returncode == 0, earlier.stderr
  before = folder_files(tmp_path / "out")
  assert before.keys() == {".complete", "pings-00000-of-00001.parquet"}  # the killed run's went
  assert _cli("ingest", path, "--out", str(tmp_path / "out")).returncode == 2
  assert folder_files(tmp_path / "out") == before and ".complete" in before

  skipped = _cli("ingest", path, "--out", str(tmp_path / "out"), "--skip-bad")
  assert skipped.returncode == 0, skipped.stderr
  assert "1 bad lines" in skipped.stdout and "7 rows written" in skipped.stdout


@pytest.mark.parametrize("readers", [1, 4])
def test_bad_line_number_counts_every_earlier_block(tmp_path, readers):
  # One time for all: the stable sort keeps the input's order, which the threads must keep.
  lines = _lines([dict(MODERN[0], msm_id=i) for i in range(500)]).splitlines(True)
  lines.insert(450, b"[1, 2]\n")  # the first bad line, in a block mapped beside the next
  lines.insert(455, b"not json at all\n")
  path = _write(tmp_path / "long.json", b"".join(lines))
  with pytest.raises(DataError, match=r"long.json: line 451: not a JSON object \(an array\)"):
    ingest([path], str(tmp_path / "out"), block_bytes=1000, progress=False, readers=readers)
  done = ingest(
    [path], str(tmp_path / "out"), block_bytes=1000, progress=False, skip_bad=True, readers=readers
  )
  assert done.counts.bad_lines == 2 and done.counts.rows == 500 * 4
  assert _rows(tmp_path / "out").column("msm_id").to_pylist() == [
    i for i in range(500) for _ in "1234"
  ]


@pytest.mark.parametrize("name", ["dump.json.bz2", "dump.json.gz", "dump.json"])
def test_a_run_that_stops_leaves_no_reading_thread(tmp_path, name):
  # The bad line comes first: the file is still being read when the run stops.
  lines = b"not json\n" + _lines([dict(MODERN[0], timestamp=T0 + i) for i in range(3_000)])
  data = {".bz2": bz2.compress, ".gz": gzip.compress}.get(os.path.splitext(name)[1], bytes)
  path = _write(tmp_path / name, data(lines))
  with pytest.raises(DataError, match="line 1: not JSON") as stopped:
    ingest([path], str(tmp_path / "out"), block_bytes=4096, progress=False)
  # Checked while the error (and with it every frame it came through) is still held. The
  # kernels' warm-up thread (`ingest-compile*`, a machine's first run) is no reading thread: it
  # goes on until numba's cache holds them, so that the next run loads them.
  reading = ("ingest-map", "ingest-read-ahead")
  assert [t.name for t in threading.enumerate() if t.name.startswith(reading)] == []
  assert stopped.value.line == 1


def test_truncated_bz2_is_an_error_not_a_hang(tmp_path):
  data = bz2.compress(_lines([dict(MODERN[0], timestamp=T0 + i) for i in range(20_000)]))
  path = _write(tmp_path / "dump.bz2", data[: len(data) * 2 // 3])
  done = _cli("ingest", path, "--out", str(tmp_path / "out"))
  assert done.returncode == 2
  error = done.stderr.strip().splitlines()[-1]
  # 17 kB of bz2, decompressed in one read, which fails before ingest has seen a line.
  assert f"{path}: corrupt or truncated bz2 data before its first line" in error
  assert "Traceback" not in done.stderr


def test_only_other_types_is_an_error(tmp_path):
  path = _write(tmp_path / "dns.json", _lines([MODERN[3], FIRMWARE_0[2]]))
  with pytest.raises(DataError, match="no ping result gave a row"):
    ingest([path], str(tmp_path / "out"), progress=False)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
  """The same 20,000 generated measurements as parquet and as RIPE Atlas JSON lines."""
  root = tmp_path_factory.mktemp("generated")
  parquet = generate(str(root / "parquet"), rows=20_000, shards=2, seed=3, progress=False)
  ripe = generate(
    str(root / "json"), rows=20_000, shards=2, seed=3, progress=False, fmt="ripe-json"
  )
  table = pa.concat_tables([pq.read_table(p) for p in parquet])
  return table, ripe


@pytest.mark.parametrize("run_rows", [1_000_000, 3_000])  # in memory; external merge of runs
def test_generate_then_ingest_gives_back_generates_parquet(tmp_path, generated, run_rows):
  table, ripe = generated
  out = str(tmp_path / "out")
  summary = ingest(ripe, out, shards=3, run_rows=run_rows, block_bytes=1 << 20, progress=False)
  rows = _rows(out)
  assert len(glob.glob(os.path.join(out, "pings-*-of-00003.parquet"))) == 3
  assert rows.select(SPEC_COLUMNS).equals(table.select(SPEC_COLUMNS))
  failed = pc.sum(pc.less(table.column("rtt"), 0)).as_py()
  assert 0 < failed < table.num_rows and summary.counts.rows == table.num_rows


def test_two_files_are_sorted_globally_by_time(tmp_path, generated):
  table, ripe = generated
  lines = b"".join(open(p, "rb").read() for p in ripe).splitlines(keepends=True)
  rng = random.Random(0)
  halves = ([], [])
  for line in lines:  # each file time-sorted, the two interleaved
    halves[rng.random() < 0.5].append(line)
  paths = [_write(tmp_path / f"part{i}.json", b"".join(h)) for i, h in enumerate(halves)]
  out = str(tmp_path / "out")
  ingest(paths, out, shards=2, run_rows=2_500, progress=False)
  rows = _rows(out)
  seconds = _seconds(rows).to_numpy()
  assert (seconds[1:] >= seconds[:-1]).all()
  keys = [(c, "ascending") for c in SPEC_COLUMNS]
  assert rows.select(SPEC_COLUMNS).sort_by(keys).equals(table.select(SPEC_COLUMNS).sort_by(keys))


def test_ingest_then_prepare(tmp_path, generated):
  _, ripe = generated
  out = str(tmp_path / "raw")
  assert cli.main(["ingest", *ripe, "--out", out, "--shards", "2"]) == 0
  cfg = config.load(
    None, [f"grain_train_files={out}/*.parquet", f"network_prepared_dir={tmp_path / 'store'}"]
  )
  splits = prepare.prepare(cfg, progress=False)
  assert splits.train.num_rows + splits.eval.num_rows == 20_000


def test_a_folder_of_dumps_is_every_file_in_it_whose_name_is_not_hidden(tmp_path):
  # RIPE's dump names carry no .json; a hidden file (an editor's, a copy tool's) is no dump.
  folder = tmp_path / "dumps"
  (folder / "day2").mkdir(parents=True)
  files = [
    _write(folder / "ping-2025-07-01T0000.bz2", bz2.compress(_lines(MODERN[:2]))),
    _write(folder / "day2" / "ping-2025-07-02T0000", _lines(MODERN[2:])),
  ]
  _write(folder / ".ping-2025-07-01T0100.bz2.part", b"not a dump")
  by_name = ingest(files, str(tmp_path / "named"), progress=False)
  by_folder = ingest([str(folder)], str(tmp_path / "folder"), progress=False)
  named, found = folder_files(tmp_path / "named"), folder_files(tmp_path / "folder")
  assert found.pop(".complete") != named.pop(".complete")  # the inputs as given: the folder
  assert found == named and by_folder.counts == by_name.counts and by_name.counts.rows == 7


def test_s3_input_through_the_storage_layer(tmp_path, monkeypatch, generated):
  _, ripe = generated
  with s3_server(monkeypatch, "atlas") as client:
    for path in ripe:
      with open(path, "rb") as f:
        name = os.path.basename(path) + ".bz2"
        client.put_object(Bucket="atlas", Key=f"dumps/{name}", Body=bz2.compress(f.read()))
    ingest(["s3://atlas/dumps/*.bz2"], str(tmp_path / "s3"), shards=2, progress=False)
  ingest(ripe, str(tmp_path / "local"), shards=2, progress=False)
  assert _rows(tmp_path / "s3").equals(_rows(tmp_path / "local"))
