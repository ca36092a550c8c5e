"""prepare: raw parquet → the prepared store, on generated data and on each kind of bad input."""

import collections
import os
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from maxtext_netdata import cli, config
from maxtext_netdata.data.prepare import local_runner, prepare, summary_text
from maxtext_netdata.data.raw import addresses, reader, schema
from maxtext_netdata.data.ripe.scanner import kernel as scanner_kernel
from maxtext_netdata.data.store import store
from maxtext_netdata.data.synthetic.generate import generate
from maxtext_netdata.errors import DataError
from maxtext_netdata.format import tokenizer
from tests.helpers.pipeline import store_files


@pytest.fixture(scope="module")
def raw_files(tmp_path_factory):
  return generate(
    str(tmp_path_factory.mktemp("raw")), rows=20_000, shards=3, seed=0, progress=False
  )


def make_config(prepared_dir, files, *overrides):
  files = files if isinstance(files, str) else ",".join(files)
  return config.load(
    None, [f"grain_train_files={files}", f"network_prepared_dir={prepared_dir}", *overrides]
  )


def raw_rows(files) -> collections.Counter:
  """(version, src bytes, dst bytes, seconds, rtt float32) of every raw row, as a multiset."""
  out = collections.Counter()
  for path in files:
    table = pq.read_table(path)
    columns, _ = schema.validate_table(table, source=path)
    rtt_bytes, _ = tokenizer.rtt_bytes(columns.rtt)  # the spec's payload, in numpy
    for i in range(len(columns)):
      out[
        (
          int(columns.version[i]),
          columns.src[i].tobytes(),
          columns.dst[i].tobytes(),
          int(columns.seconds[i]),
          rtt_bytes[i].tobytes(),
        )
      ] += 1
  return out


def store_rows(split: store.PreparedStore) -> collections.Counter:
  out = collections.Counter()
  dst = split.dst  # decoded: dst_table[dst_index]
  for p in range(split.num_probes):
    rows = split.probe_rows(p)
    for i in range(rows.start, rows.stop):
      out[
        (
          int(split.probe_version[p]),
          split.probe_src[p].tobytes(),
          dst[i].tobytes(),
          int(split.seconds[i]),
          split.rtt_bytes[i].tobytes(),
        )
      ] += 1
  return out


def probe_keys(split: store.PreparedStore) -> set:
  return {(int(v), s.tobytes()) for v, s in zip(split.probe_version, split.probe_src, strict=True)}


def test_store_holds_every_row_grouped_by_probe_and_time_sorted(tmp_path, raw_files):
  splits = prepare.prepare(make_config(tmp_path, raw_files), progress=False)
  train, test = splits.train, splits.eval
  assert not splits.cached
  assert train.num_rows + test.num_rows == sum(pq.read_metadata(f).num_rows for f in raw_files)
  assert store_rows(train) + store_rows(test) == raw_rows(raw_files)
  assert not probe_keys(train) & probe_keys(test)
  for split in (train, test):
    offsets = split.probe_offsets
    assert offsets[0] == 0 and offsets[-1] == split.num_rows
    assert (np.diff(offsets) > 0).all()
    probe_of_row = np.repeat(np.arange(split.num_probes), np.diff(offsets))
    same_probe = probe_of_row[1:] == probe_of_row[:-1]
    assert (np.diff(split.seconds.astype(np.int64))[same_probe] >= 0).all()
    # The destinations: a table of the distinct ones, in the order of their first row.
    table, index = np.asarray(split.dst_table), np.asarray(split.dst_index)
    assert len(np.unique(table, axis=0)) == len(table)
    first = np.unique(index, return_index=True)[1]
    np.testing.assert_array_equal(np.sort(first), first)
    np.testing.assert_array_equal(index[np.sort(first)], np.arange(len(table)))
    assert split.hashed_order is None
  summary = splits.summary
  assert summary["rows"] == summary["rows_read"] == train.num_rows + test.num_rows
  assert summary["probes"] == train.num_probes + test.num_probes
  assert 0.05 < test.num_probes / summary["probes"] < 0.2
  assert summary["failed_share"] == pytest.approx(
    (train.failed.sum() + test.failed.sum()) / summary["rows"]
  )


def test_store_content_does_not_depend_on_files_or_row_order(tmp_path, raw_files):
  first = prepare.prepare(make_config(tmp_path / "a", raw_files), progress=False)
  # The same rows shuffled into differently named files, in another order.
  table = pa.concat_tables([pq.read_table(f) for f in raw_files])
  order = np.random.default_rng(1).permutation(table.num_rows)
  table = table.take(order)
  other = []
  for k, part in enumerate(np.array_split(np.arange(table.num_rows), 2)):
    path = str(tmp_path / f"z{1 - k}.parquet")
    pq.write_table(table.take(part), path, row_group_size=3000)
    other.append(path)
  second = prepare.prepare(make_config(tmp_path / "b", other[::-1]), progress=False)
  for name in ("train", "eval"):
    a, b = getattr(first, name), getattr(second, name)
    for array in (*store.PROBE_ARRAYS, *store.ROW_FILES, *store.TABLE_ARRAYS):
      np.testing.assert_array_equal(getattr(a, array), getattr(b, array), err_msg=array)


def test_a_store_of_a_former_format_is_named_not_read_or_removed(tmp_path, raw_files, capsys):
  """A store of another format version (a folder of format 2 beside the new one) is no base
  and no cache; building beside it says where it is and how large, once, and keeps it."""
  old = tmp_path / "0123456789abcdef"
  (old / "train").mkdir(parents=True)
  (old / "train" / "dst.npy").write_bytes(b"x" * 3 * 2**20)
  (tmp_path / "elsewhere.npy").write_bytes(b"y" * 2**20)  # linked: deleting frees nothing
  os.link(tmp_path / "elsewhere.npy", old / "train" / "probe_src.npy")
  store.write_json(str(old / store.META_FILE), {"format_version": 2})
  built = prepare.prepare(make_config(tmp_path, raw_files), progress=True)
  said = [line for line in capsys.readouterr().err.splitlines() if "format 2" in line]
  assert said == [
    f"prepare: {old} is a store of format 2, which this code does not read (deleting it frees"
    " 3.1 MB): delete it once no older version of this code needs it"
  ]
  assert not built.cached and old.is_dir()
  again = prepare.prepare(make_config(tmp_path, raw_files), progress=True)
  assert again.cached and "format 2" not in capsys.readouterr().err


def test_probe_split_is_stable_whatever_the_other_files(tmp_path, raw_files):
  full = prepare.prepare(make_config(tmp_path / "full", raw_files), progress=False)
  part = prepare.prepare(make_config(tmp_path / "part", raw_files[1]), progress=False)
  assert probe_keys(part.eval) <= probe_keys(full.eval)
  assert probe_keys(part.train) <= probe_keys(full.train)


def test_time_split_holds_out_the_latest_rows(tmp_path, raw_files):
  splits = prepare.prepare(
    make_config(tmp_path, raw_files, "network_split=time", "network_test_fraction=0.2"),
    progress=False,
  )
  assert splits.train.seconds.max() < splits.eval.seconds.min()
  share = splits.eval.num_rows / (splits.train.num_rows + splits.eval.num_rows)
  assert 0.19 < share < 0.25
  # The summary gives each split's first and last second: the test split's first, the cutoff.
  seconds = np.concatenate([splits.train.seconds, splits.eval.seconds])
  cutoff = int(np.quantile(seconds, 0.8, method="higher"))
  spans = {name: splits.summary["splits"][name]["span"] for name in ("train", "test")}
  assert spans == {
    "train": [int(splits.train.seconds.min()), int(splits.train.seconds.max())],
    "test": [cutoff, int(seconds.max())],
  }
  text = summary_text.format_summary(splits.summary)
  assert f"test      {splits.eval.num_rows:,} rows" in text
  assert (
    f" probes, {local_runner.utc(cutoff)} to {local_runner.utc(int(seconds.max()))} UTC" in text
  )


def test_a_time_split_with_no_test_share_is_built_without_pieces_the_same(
  tmp_path, raw_files, monkeypatch
):
  """No cutoff to find: the rows go straight into the splits, as the probe split's do (the
  new files of a time split's update), and the store is the one the pieces give."""
  overrides = ("network_split=time", "network_test_fraction=0")
  through_pieces = prepare.prepare(
    make_config(tmp_path / "pieces", raw_files, *overrides),
    progress=False,
    runner=local_runner.pieces,
  )
  written = []
  monkeypatch.setattr(local_runner, "write_pieces", lambda *a: written.append(a) or [])
  direct = prepare.prepare(make_config(tmp_path / "direct", raw_files, *overrides), progress=False)
  assert not written
  a, b = store_files(direct.summary["path"]), store_files(through_pieces.summary["path"])
  assert a.keys() == b.keys() and "train/seconds.npy" in a
  assert all(a[name] == b[name] for name in a)
  assert direct.summary["splits"] == through_pieces.summary["splits"]
  assert direct.summary["splits"]["test"]["rows"] == 0


def test_eval_files_become_the_eval_split(tmp_path, raw_files):
  cfg = make_config(tmp_path, raw_files[:2], f"grain_eval_files={raw_files[2]}")
  splits = prepare.prepare(cfg, progress=False)
  assert splits.eval.num_rows == pq.read_metadata(raw_files[2]).num_rows
  assert splits.eval.meta["split"] == "eval"
  # No probe of the train files is held out for a test split nothing would read.
  assert cfg.network_test_fraction > 0
  assert splits.train.num_rows == sum(pq.read_metadata(f).num_rows for f in raw_files[:2])


def test_hashed_field_order_is_stored(tmp_path, raw_files):
  splits = prepare.prepare(
    make_config(tmp_path, raw_files[0], "network_field_order=hashed"), progress=False
  )
  split = splits.train
  assert split.hashed_order.shape == (split.num_rows, 2)
  p = 0
  rows = split.probe_rows(p)
  src = addresses.format_address(split.probe_src[p], int(split.probe_version[p]))
  dst = [addresses.format_address(d, int(split.probe_version[p])) for d in split.dst[rows]]
  for has_ts in (False, True):
    expected = tokenizer.hashed_orders(
      [src] * len(dst), dst, split.seconds[rows], np.full(len(dst), has_ts)
    )
    np.testing.assert_array_equal(split.hashed_order[rows, int(has_ts)], expected)


def test_cached_store_is_reused_and_rebuilt_when_an_input_changes(tmp_path, raw_files):
  files = [str(tmp_path / os.path.basename(f)) for f in raw_files]
  for src, dst in zip(raw_files, files, strict=True):
    with open(src, "rb") as f_in, open(dst, "wb") as f_out:
      f_out.write(f_in.read())
  cfg = make_config(tmp_path / "prep", files)
  first = prepare.prepare(cfg, progress=False)
  meta_path = os.path.join(first.summary["path"], store.META_FILE)
  before = os.stat(meta_path).st_mtime_ns
  again = prepare.ensure_prepared(cfg, progress=False)
  assert again.cached and again.summary["path"] == first.summary["path"]
  assert os.stat(meta_path).st_mtime_ns == before

  table = pq.read_table(files[0])
  pq.write_table(table.slice(0, table.num_rows - 10), files[0])
  changed = prepare.ensure_prepared(cfg, progress=False)
  assert not changed.cached and changed.summary["path"] != first.summary["path"]
  assert changed.summary["rows"] == first.summary["rows"] - 10

  assert (
    prepare.ensure_prepared(cfg.replace(network_test_fraction=0.3), progress=False).cached is False
  )
  forced = prepare.prepare(cfg, progress=False, force=True)
  assert not forced.cached and forced.summary["path"] == changed.summary["path"]


def good_table(n=50):
  return pa.table(
    {
      "msm_id": pa.array(np.arange(n), pa.int64()),
      "event_time": pa.array(np.arange(n) + 1_751_328_000, pa.timestamp("s")),
      "src_addr": [f"192.0.2.{i % 5}" for i in range(n)],
      "dst_addr": ["8.8.8.8"] * n,
      "ip_version": pa.array([4] * n, pa.int8()),
      "rtt": pa.array(np.linspace(1, 100, n)),
    }
  )


def with_column(table, name, values, type_=None):
  index = table.schema.get_field_index(name)
  return table.set_column(index, name, pa.array(values, type_))


BAD_TABLES = {
  "missing column": (lambda t: t.drop_columns(["rtt"]), r"missing column\(s\) rtt"),
  # An address column is read as a dictionary: pyarrow raised KeyError when it was missing.
  "missing address": (lambda t: t.drop_columns(["src_addr"]), r"missing column\(s\) src_addr"),
  "named twice": (
    lambda t: pa.Table.from_arrays([*t.columns, t["rtt"]], names=[*t.column_names, "rtt"]),
    r"column\(s\) rtt named more than once",
  ),
  "wrong type": (lambda t: with_column(t, "rtt", [str(x) for x in range(50)]), "'rtt' has type"),
  "binary address": (  # read as a dictionary, named as the file has it
    lambda t: with_column(t, "dst_addr", [b"8.8.8.8"] * 50, pa.binary()),
    r"column 'dst_addr' has type binary, expected string$",
  ),
  "unparsable address": (
    lambda t: with_column(t, "dst_addr", ["8.8.8.8"] * 7 + ["not-an-ip"] + ["8.8.8.8"] * 42),
    "row 7",
  ),
  "version mismatch": (
    lambda t: with_column(t, "src_addr", ["192.0.2.1"] * 9 + ["2001:db8::1"] + ["192.0.2.1"] * 40),
    "row 9",
  ),
  "NaN RTT": (lambda t: with_column(t, "rtt", [1.0] * 11 + [np.nan] + [1.0] * 38), "row 11"),
  "infinite RTT": (lambda t: with_column(t, "rtt", [1.0] * 12 + [np.inf] + [1.0] * 37), "row 12"),
}


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
def test_bad_input_is_an_error_naming_file_and_row(tmp_path, case):
  make, expected = BAD_TABLES[case]
  pq.write_table(good_table(), tmp_path / "good.parquet")
  bad = str(tmp_path / "bad.parquet")
  pq.write_table(make(good_table()), bad)
  cfg = make_config(tmp_path / "prep", str(tmp_path / "*.parquet"))
  with pytest.raises(DataError, match=expected) as error:
    prepare.prepare(cfg, progress=False)
  assert bad in str(error.value)
  assert not os.path.exists(tmp_path / "prep") or not os.listdir(tmp_path / "prep")


def _delta_strings(table, path):
  # DuckDB's and Spark's format 2 writers store strings so; Arrow's reader cannot decode them
  # into a dictionary ("Not yet implemented: DecodeArrow of DictAccumulator").
  encodings = {"src_addr": "DELTA_LENGTH_BYTE_ARRAY", "dst_addr": "DELTA_BYTE_ARRAY"}
  pq.write_table(table, path, use_dictionary=False, column_encoding=encodings)
  return table


def _null_typed(table, path):
  # pandas writes a column of only None as Arrow's null type.
  pq.write_table(with_column(table, "dst_addr", [None] * table.num_rows), path)
  return with_column(table, "dst_addr", [None] * table.num_rows, pa.string())


@pytest.mark.parametrize("write", [_delta_strings, _null_typed], ids=["delta", "null type"])
def test_files_other_writers_make_read_as_the_same_rows(tmp_path, write):
  same = write(good_table(), str(tmp_path / "other.parquet"))  # the same rows, as we write
  pq.write_table(same, tmp_path / "plain.parquet")
  plain, _ = reader.read_raw(str(tmp_path / "plain.parquet"))
  other, _ = reader.read_raw(str(tmp_path / "other.parquet"))
  for name in ("src", "dst", "version", "seconds"):
    np.testing.assert_array_equal(getattr(other, name), getattr(plain, name), err_msg=name)


def test_the_error_names_the_first_bad_row_whatever_its_problem(tmp_path):
  # Checked column by column, the first problem's rows came first: a null time at row 30
  # was named before a NaN RTT at row 10.
  table = with_column(good_table(), "rtt", [1.0] * 10 + [np.nan] + [1.0] * 39)
  times = table.column("event_time").to_pylist()
  table = with_column(table, "event_time", times[:30] + [None] + times[31:], pa.timestamp("s"))
  table = with_column(table, "ip_version", [4] * 20 + [7] + [4] * 29, pa.int8())
  pq.write_table(table, tmp_path / "bad.parquet")
  with pytest.raises(DataError, match=r"bad.parquet: row 10: rtt is NaN"):
    prepare.prepare(make_config(tmp_path / "prep", str(tmp_path / "bad.parquet")), progress=False)


@pytest.mark.parametrize("split", ["probe", "time"])  # straight into the splits; pieces first
def test_files_whose_every_row_is_bad_say_why_when_skipped(tmp_path, split):
  table = with_column(good_table(), "rtt", [np.nan] * 45 + [1.0] * 5)
  table = with_column(table, "ip_version", [4] * 45 + [5] * 5, pa.int8())
  pq.write_table(table, tmp_path / "bad.parquet")
  cfg = make_config(
    tmp_path / "prep", str(tmp_path / "bad.parquet"), "network_skip_bad_rows=true",
    f"network_split={split}",
  )  # fmt: skip
  with pytest.raises(DataError) as error:
    prepare.prepare(cfg, progress=False)
  assert str(error.value) == (
    f"{tmp_path / 'bad.parquet'}: no valid rows in 1 file(s) (50 rows read, every one skipped"
    " as bad; ip_version is not 4 or 6: 5, rtt is NaN, infinite or null: 45)"
  )


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_corrupt_file_is_an_error_naming_it(tmp_path, damage):
  path = str(tmp_path / "bad.parquet")
  pq.write_table(good_table(), path)
  data = open(path, "rb").read()
  with open(path, "wb") as f:
    f.write(data[: len(data) // 2] if damage == "truncated" else os.urandom(len(data)))
  with pytest.raises(DataError, match="not a readable parquet file") as error:
    prepare.prepare(make_config(tmp_path / "prep", path), progress=False)
  assert path in str(error.value)


def test_no_matching_file_names_the_pattern(tmp_path):
  pattern = str(tmp_path / "nothing-*.parquet")
  with pytest.raises(DataError, match="no file matches") as error:
    prepare.prepare(make_config(tmp_path / "prep", pattern), progress=False)
  assert pattern in str(error.value)


def test_skip_mode_drops_and_counts_bad_rows(tmp_path):
  table = good_table()
  table = with_column(table, "rtt", [1.0] * 11 + [np.nan, np.inf] + [1.0] * 37)
  table = with_column(table, "dst_addr", ["8.8.8.8"] * 20 + ["bogus"] + ["8.8.8.8"] * 29)
  pq.write_table(table, tmp_path / "a.parquet")
  splits = prepare.prepare(
    make_config(tmp_path / "prep", str(tmp_path / "a.parquet"), "network_skip_bad_rows=true"),
    progress=False,
  )
  summary = splits.summary
  assert summary["rows_read"] == 50 and summary["rows"] == 47
  assert summary["skipped"] == {
    "rtt is NaN, infinite or null": 2,
    "dst_addr unparsable or not matching ip_version": 1,
  }
  assert "skipped   3 rows" in summary_text.format_summary(summary)


def test_a_store_keeps_times_from_1970_to_2106_and_no_other(tmp_path):
  """A store's seconds are uint32: the reader refuses a time before 1970 or after
  2106-02-07 06:28:15 UTC (a bad row, never a wrapped time), and keeps the last one exactly."""
  # One bound for the store, the raw reader and ingest's scanner (rooms that import none of
  # the others): each keeps its own constant.
  assert schema.LAST_SECOND == store.SECONDS_MAX == scanner_kernel.LAST_SECOND == 2**32 - 1
  seconds = np.arange(50) + 1_751_328_000
  seconds[[3, 4]] = schema.LAST_SECOND  # the last second a store keeps (probe 192.0.2.3, .4)
  seconds[[7, 9]] = schema.LAST_SECOND + 1, -1
  table = with_column(good_table(), "event_time", seconds, pa.timestamp("s"))
  path = str(tmp_path / "times.parquet")
  pq.write_table(table, path)
  with pytest.raises(DataError, match="before 1970 or after 2106") as error:
    prepare.prepare(make_config(tmp_path / "prep", path), progress=False)
  assert f"{path}: row 7:" in str(error.value) and "(value 4294967296)" in str(error.value)
  splits = prepare.prepare(
    make_config(tmp_path / "prep", path, "network_skip_bad_rows=true", "network_test_fraction=0"),
    progress=False,
  )
  assert splits.summary["skipped"] == {
    "event_time is before 1970 or after 2106-02-07 06:28:15 UTC": 2
  }
  train = splits.train
  assert train.seconds.dtype == np.uint32 and train.num_rows == 48
  assert sorted(train.seconds.tolist()) == sorted(np.delete(seconds, [7, 9]).tolist())
  for probe in range(train.num_probes):
    rows = train.probe_rows(probe)
    assert (np.diff(train.seconds[rows].astype(np.int64)) >= 0).all()
  assert int(train.seconds.max()) == schema.LAST_SECOND


def test_failure_midway_leaves_no_store(tmp_path, raw_files):
  bad = good_table()
  bad = with_column(bad, "dst_addr", ["8.8.8.8"] * 30 + ["999.1.1.1"] + ["8.8.8.8"] * 19)
  bad_path = str(tmp_path / "zz-last.parquet")
  pq.write_table(bad, bad_path)
  prepared = tmp_path / "prep"
  with pytest.raises(DataError, match="row 30"):
    prepare.prepare(make_config(prepared, [*raw_files, bad_path]), progress=False)
  assert os.listdir(prepared) == []  # neither a store nor a temporary directory


def test_remains_of_an_interrupted_build_are_not_a_store(tmp_path, raw_files):
  cfg = make_config(tmp_path, raw_files[0])
  splits = prepare.prepare(cfg, progress=False)
  root = splits.summary["path"]
  os.remove(os.path.join(root, store.META_FILE))  # as if stopped before the last write
  rebuilt = prepare.ensure_prepared(cfg, progress=False)
  assert not rebuilt.cached and rebuilt.train.num_rows == splits.train.num_rows


def test_cli_prints_the_summary_and_reports_errors_in_one_line(tmp_path, raw_files, capsys):
  overrides = [f"grain_train_files={raw_files[0]}", f"network_prepared_dir={tmp_path}"]
  assert cli.main(["prepare", "base.yml", *overrides]) == 0
  out = capsys.readouterr().out
  assert "probes" in out and "rows/s" in out and "peak RSS" in out
  assert cli.main(["prepare", "base.yml", *overrides]) == 0
  assert "(cached)" in capsys.readouterr().out
  missing = str(tmp_path / "missing-*.parquet")
  assert cli.main(["prepare", "base.yml", f"grain_train_files={missing}"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and missing in err[0]


_BIG_PARENT = """
import subprocess, sys
import numpy as np
held = np.ones(96 << 20)  # 768 MiB resident in this process
sys.exit(subprocess.run(sys.argv[1:]).returncode)
"""


def test_the_peak_memory_reported_is_the_commands_own_not_its_parents(tmp_path, raw_files):
  # Linux folds the memory a process had before exec into ru_maxrss: a prepare started by a
  # 768 MiB process reported at least 768 MiB.
  run = subprocess.run(
    [
      sys.executable,
      "-c",
      _BIG_PARENT,
      sys.executable,
      "-m",
      "maxtext_netdata",
      "prepare",
      "base.yml",
      f"grain_train_files={raw_files[0]}",
      f"network_prepared_dir={tmp_path}",
    ],  # fmt: skip
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
  )
  assert run.returncode == 0, run.stderr[-2000:]
  peak = float(re.search(r"peak RSS ([\d,]+) MiB", run.stdout).group(1).replace(",", ""))
  assert 50 < peak < 700, run.stdout
