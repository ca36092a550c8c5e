"""`ingest --probe-fraction/--since/--until`: whole probes and a time window, the same rows as
the full ingest's for them, whatever the files."""

import datetime
import glob
import hashlib
import json
import os
import socket
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from maxtext_netdata import cli
from maxtext_netdata.data.ripe.ingest import ingest
from maxtext_netdata.data.ripe.sample import Sample
from maxtext_netdata.data.synthetic.generate import generate

FRACTION = 0.3


def _rows(out_dir) -> list[dict]:
  files = sorted(glob.glob(os.path.join(out_dir, "*.parquet")))
  return pa.concat_tables([pq.read_table(f) for f in files]).to_pylist()


def _in_sample(row: dict) -> bool:
  """The probe hash of docs/spec.md §3 (blake2b of the version byte and 16 address bytes),
  its 8 bytes read little-endian, below FRACTION of 2^64."""
  version, source = row["ip_version"], row["src_addr"]
  address = b""
  if source:
    address = socket.inet_pton(socket.AF_INET6 if version == 6 else socket.AF_INET, source)
  key = bytes([version]) + address.ljust(16, b"\0")
  return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") < FRACTION * 2**64


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
  folder = tmp_path_factory.mktemp("dump")
  paths = generate(str(folder), rows=30_000, shards=3, seed=11, fmt="ripe-json")
  full = ingest(paths, str(folder / "full"), progress=False)
  return paths, _rows(folder / "full"), full


def test_a_sample_keeps_its_probes_rows_as_the_full_ingest_has_them(tmp_path, dump):
  paths, full_rows, full = dump
  seconds = sorted(r["event_time"].timestamp() for r in full_rows)
  since, until = int(seconds[len(seconds) // 4]), int(seconds[3 * len(seconds) // 4])
  expected = [
    r for r in full_rows if _in_sample(r) and since <= r["event_time"].timestamp() < until
  ]
  sample = Sample(FRACTION, since, until)
  summary = ingest(paths, str(tmp_path / "all"), progress=False, sample=sample)
  assert _rows(tmp_path / "all") == expected
  probes = {(r["ip_version"], r["src_addr"]) for r in expected}
  all_probes = {(r["ip_version"], r["src_addr"]) for r in full_rows}
  assert 0.2 < len(probes) / len(all_probes) < 0.4  # whole probes: about the fraction of them
  # One packet a result: a result is a row.
  assert summary.counts.kept == len(expected) and summary.probes == len(probes)
  assert summary.counts.left_out == full.counts.kept - len(expected)
  assert summary.counts.results == full.counts.results
  ingest(paths, str(tmp_path / "reference"), progress=False, sample=sample, scan=False)
  assert _rows(tmp_path / "reference") == expected

  # File by file, on its own: the same probes, so the same rows.
  by_file = []
  for k, path in enumerate(paths):
    ingest([path], str(tmp_path / f"file{k}"), progress=False, sample=sample)
    by_file += _rows(tmp_path / f"file{k}")
  assert by_file == expected


def test_bounds_between_whole_seconds_keep_exactly_the_rows_inside(tmp_path, dump):
  # The results' times are whole seconds: --since a tenth before one keeps that second and not
  # the one before; --until half a second after one keeps that second.
  paths, full_rows, _ = dump
  times = sorted({int(r["event_time"].timestamp()) for r in full_rows})
  first = next(t for t in times[len(times) // 4 :] if t - 1 in times)
  last = times[3 * len(times) // 4]
  iso = lambda t: datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat()  # noqa: E731
  out = str(tmp_path / "out")
  args = ["--since", iso(first - 0.1), "--until", iso(last + 0.5)]
  assert cli.main(["ingest", *paths, "--out", out, *args]) == 0
  expected = [r for r in full_rows if first - 0.1 <= r["event_time"].timestamp() < last + 0.5]
  assert _rows(out) == expected
  assert {int(r["event_time"].timestamp()) for r in expected} >= {first, last}


def test_the_command_line_names_the_sample_in_its_summary_and_marker(tmp_path, dump):
  paths = dump[0]
  out = str(tmp_path / "out")
  args = ["--probe-fraction", "0.5", "--since", "2000-01-01", "--until", "2100-01-01T00:00Z"]
  done = subprocess.run(
    [sys.executable, "-m", "maxtext_netdata", "ingest", *paths, "--out", out, *args],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert done.returncode == 0, done.stderr
  marker = json.load(open(os.path.join(out, ".complete")))
  since = int(datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC).timestamp())
  assert marker["sample"]["probe_fraction"] == 0.5 and marker["sample"]["since"] == since
  assert f"{marker['kept']:,} results of {marker['sample']['probes']:,} probes kept" in done.stdout
  bad = subprocess.run(
    [sys.executable, "-m", "maxtext_netdata", "ingest", *paths, "--out", out]
    + ["--probe-fraction", "0"],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert bad.returncode == 2 and "--probe-fraction must be in (0, 1], got 0.0" in bad.stderr
