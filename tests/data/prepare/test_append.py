"""prepare with new files beside those of an existing store: only the new ones are read, and
the store is the one a full build gives, byte for byte (docs/prepare.md, "New files: append")."""

import glob
import json
import os
import shutil
import signal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from maxtext_netdata import cli, config
from maxtext_netdata.data.prepare import merge, prepare, summary_text
from maxtext_netdata.errors import ConfigError, DataError
from tests.data.prepare.test_partition import _prepare_process, _wait_stopped
from tests.data.prepare.test_prepare import good_table, make_config, with_column
from tests.helpers.pipeline import store_files

# 256 MiB: the smallest budget, 65,536-row batches, so each merge here takes several.
SMALL = "network_prepare_memory_mb=256"


COUNTS = (
  "fingerprint",
  "rows",
  "rows_read",
  "probes",
  "splits",
  "skipped",
  "skipped_rows",
  "train_file_reports",
)


def assert_same_store(appended, full):
  assert appended.summary["fingerprint"] == full.summary["fingerprint"]
  a, b = store_files(appended.summary["path"]), store_files(full.summary["path"])
  assert sorted(a) == sorted(b)
  different = [name for name in sorted(a) if a[name] != b[name]]
  assert not different, different
  for key in COUNTS:
    assert appended.summary[key] == full.summary[key], key


TIME_SPLIT = ["network_split=time", "network_test_fraction=0.2"]
CASES = {
  # base files, new files: the new rows of each probe after, before and between its old ones
  "a new day": ([0, 1, 2], [3], []),
  "an earlier day": ([1, 2, 3], [0], []),
  "days between": ([0, 2], [1, 3], []),
  "a day within the base's days": ([0, 2], [1], []),
  # With eval files no train row is held out.
  "hashed order, eval files, time split": (
    [0, 1],
    [2],
    ["network_field_order=hashed", "network_split=time"],
  ),
  # A time split with a test share: the cutoff moves with the new rows, forwards (a new day),
  # backwards (an earlier day) or both ways across the base's days (days between).
  "a new day, time split": ([0, 1, 2], [3], TIME_SPLIT),
  "an earlier day, time split": ([1, 2, 3], [0], TIME_SPLIT),
  "days between, time split": ([0, 2], [1, 3], TIME_SPLIT),
  "hashed order, a new day, time split": ([0, 1], [2], [*TIME_SPLIT, "network_field_order=hashed"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_new_files_are_appended_into_the_store_a_full_build_gives(tmp_path, days, case):
  old, new, overrides = CASES[case]
  eval_files = []
  if "eval" in case:
    eval_files, overrides = [days[3]], [*overrides, f"grain_eval_files={days[3]}"]
  before = [days[i] for i in old]
  after = sorted(before + [days[i] for i in new])
  base = prepare.prepare(make_config(tmp_path / "inc", before, SMALL, *overrides), progress=False)
  appended = prepare.prepare(
    make_config(tmp_path / "inc", after, SMALL, *overrides), progress=False
  )
  full = prepare.prepare(make_config(tmp_path / "full", after, SMALL, *overrides), progress=False)
  assert "appended" not in full.summary
  info = appended.summary["appended"]
  assert info["base"] == base.summary["path"] and info["new_files"] == len(new)
  assert info["new_rows_read"] == sum(pq.read_metadata(days[i]).num_rows for i in new)
  assert_same_store(appended, full)
  if eval_files:
    assert appended.eval.num_rows == pq.read_metadata(days[3]).num_rows
  assert "appended  " in summary_text.format_summary(appended.summary)
  # The next day is appended to the appended store, the one holding the most of the files.
  if case == "a new day":
    shutil.rmtree(full.summary["path"])
    again = prepare.prepare(make_config(tmp_path / "inc", after, SMALL), progress=False)
    assert again.cached
    prepare.prepare(make_config(tmp_path / "inc", days[:2], SMALL), progress=False)
    extra = str(tmp_path / "day5.parquet")
    table = pq.read_table(days[3])
    shifted = table.set_column(
      table.schema.get_field_index("event_time"),
      "event_time",
      pa.array(
        table["event_time"].to_numpy().astype("datetime64[s]") + np.timedelta64(86_400, "s")
      ),
    )
    pq.write_table(shifted, extra)
    chained = prepare.prepare(make_config(tmp_path / "inc", [*after, extra], SMALL), progress=False)
    assert chained.summary["appended"]["base"] == appended.summary["path"]
    full = prepare.prepare(make_config(tmp_path / "full", [*after, extra], SMALL), progress=False)
    assert_same_store(chained, full)


def valid_rows(*paths) -> int:
  return sum(pq.read_metadata(path).num_rows for path in paths)


WINDOWS = {
  # base files, then current files
  "the oldest day leaves": ([0, 1, 2], [1, 2]),
  "the oldest day leaves, a new day comes": ([0, 1, 2], [1, 2, 3]),
  "two days leave, a new day comes": ([0, 1, 2], [2, 3]),
  "the newest day leaves": ([0, 1, 2], [0, 1]),
  "eval files, time split: a day leaves, one comes": ([0, 1], [1, 2]),
  "time split: the oldest day leaves, a new day comes": ([0, 1, 2], [1, 2, 3]),
}


@pytest.mark.parametrize("case", sorted(WINDOWS))
def test_files_no_longer_listed_leave_the_store_a_full_build_gives(tmp_path, days, case):
  before, after = ([days[i] for i in files] for files in WINDOWS[case])
  overrides = [SMALL, "network_field_order=hashed"] if "two" in case else [SMALL]
  if "eval" in case:
    overrides += [f"grain_eval_files={days[3]}", "network_split=time"]
  elif "time split" in case:
    overrides += TIME_SPLIT
  base = prepare.prepare(make_config(tmp_path / "inc", before, *overrides), progress=False)
  rolled = prepare.prepare(make_config(tmp_path / "inc", after, *overrides), progress=False)
  full = prepare.prepare(make_config(tmp_path / "full", after, *overrides), progress=False)
  assert "removed" not in full.summary
  gone = sorted(set(before) - set(after))
  assert rolled.summary["removed"] == {
    "base": base.summary["path"],
    "base_rows": base.summary["rows"],
    "files": len(gone),
    "rows": valid_rows(*gone),
    "rebound": False,
    "merge_seconds": rolled.summary["removed"]["merge_seconds"],
  }
  new = sorted(set(after) - set(before))
  assert ("appended" in rolled.summary) == bool(new)
  assert_same_store(rolled, full)
  text = summary_text.format_summary(rolled.summary)
  assert f"removed   {valid_rows(*gone):,} rows of {base.summary['path']}" in text
  assert f"rows): {len(gone)} file(s) no longer listed" in text
  assert ("no file read" in text) == (not new)
  # The day after: the next window from the rolled store, whose file reports came through.
  if case == "the oldest day leaves, a new day comes":
    again = prepare.prepare(make_config(tmp_path / "inc", days[2:], *overrides), progress=False)
    assert again.summary["removed"]["base"] == rolled.summary["path"]
    full = prepare.prepare(make_config(tmp_path / "full", days[2:], *overrides), progress=False)
    assert_same_store(again, full)


def test_files_that_cannot_be_told_apart_by_time_are_built_in_full(tmp_path, days, capsys):
  prep = tmp_path / "prep"
  base = prepare.prepare(make_config(prep, days[:3]), progress=False)
  # The middle day's rows fall between those of the days kept: the whole store is built.
  middle = prepare.prepare(make_config(prep, [days[0], days[2]]), progress=True)
  assert "removed" not in middle.summary and "appended" not in middle.summary
  assert (
    f"prepare: building in full: store {base.summary['path']} holds 1 file(s) no longer"
    f" listed ({days[1]}) whose rows are not all before, or all after, those it keeps"
  ) in capsys.readouterr().err
  assert middle.summary["rows_read"] == valid_rows(days[0], days[2])
  # A store written before summaries kept each file's times: appended to, not taken from.
  old = tmp_path / "old"
  base = prepare.prepare(make_config(old, days[:3]), progress=False)
  meta_path = os.path.join(base.summary["path"], "meta.json")
  with open(meta_path, encoding="utf-8") as f:
    meta = json.load(f)
  del meta["train_file_reports"]
  with open(meta_path, "w", encoding="utf-8") as f:
    json.dump(meta, f)
  later = prepare.prepare(make_config(old, days[1:3]), progress=True)
  assert "removed" not in later.summary
  assert "was prepared before stores kept their files' times" in capsys.readouterr().err
  appended = prepare.prepare(make_config(old, days[:4]), progress=False)
  assert appended.summary["appended"]["base"] == base.summary["path"]
  assert "train_file_reports" not in appended.summary
  # A day that overlaps the next one by a second is not taken out either.
  files = copies(tmp_path, days[:2])
  table = pq.read_table(files[0])
  index = table.schema.get_field_index("event_time")
  times = table["event_time"].to_numpy().astype("datetime64[s]")
  last = pq.read_table(files[1])["event_time"].to_numpy().astype("datetime64[s]").min()
  times[-1] = last  # the first day's last row in the second day's first second
  pq.write_table(table.set_column(index, "event_time", pa.array(times)), files[0])
  prepare.prepare(make_config(prep, files), progress=False)
  alone = prepare.prepare(make_config(prep, files[1:]), progress=False)
  assert "removed" not in alone.summary
  assert_same_store(
    alone, prepare.prepare(make_config(tmp_path / "full", files[1:]), progress=False)
  )
  # An edge day rewritten (its old rows leave, its new ones come): the store of both files.
  files = copies(tmp_path / "edge", days[1:3])
  prepare.prepare(make_config(prep, files), progress=False)
  pq.write_table(pq.read_table(files[0]).slice(0, 1000), files[0])
  rewritten = prepare.prepare(make_config(prep, files), progress=False)
  assert rewritten.summary["removed"]["files"] == 1
  assert rewritten.summary["appended"]["new_files"] == 1
  assert rewritten.summary["rows"] == 1000 + valid_rows(days[2])
  assert_same_store(
    rewritten, prepare.prepare(make_config(tmp_path / "full", files), progress=False)
  )


def copies(tmp_path, files):
  os.makedirs(tmp_path, exist_ok=True)
  out = []
  for path in files:
    out.append(str(tmp_path / os.path.basename(path)))
    shutil.copyfile(path, out[-1])
  return out


def test_a_store_is_built_in_full_when_it_cannot_be_appended_to(tmp_path, days):
  files = copies(tmp_path, days)
  prep = tmp_path / "prep"

  def built(files, *overrides, force=False):
    cfg = make_config(prep, files, *overrides)
    return "appended" not in prepare.prepare(cfg, progress=False, force=force).summary

  # Another test fraction, or bad rows dropped instead of refused: another content.
  assert built(files[:3]) and built(files, "network_test_fraction=0.25")
  assert built(files, "network_skip_bad_rows=true")
  # An old file between others rewritten: its old rows cannot be told from theirs by time.
  pq.write_table(pq.read_table(files[1]).slice(0, 1000), files[1])
  assert built(files)
  # --force: a full build, though the store of the first three files is now a base.
  assert built(files[:3])
  assert built(files, force=True)


def test_a_bad_new_file_is_an_error_and_the_store_stays(tmp_path, days):
  prep = tmp_path / "prep"
  base = prepare.prepare(make_config(prep, days[:3]), progress=False)
  bad = with_column(good_table(), "rtt", [1.0] * 11 + [np.nan] + [1.0] * 38)
  bad_path = str(tmp_path / "bad.parquet")
  pq.write_table(bad, bad_path)
  with pytest.raises(DataError, match=r"bad\.parquet.*row 11"):
    prepare.prepare(make_config(prep, [*days[:3], bad_path]), progress=False)
  assert sorted(os.listdir(prep)) == [os.path.basename(base.summary["path"])]  # no temporary
  assert prepare.ensure_prepared(make_config(prep, days[:3]), progress=False).cached
  # With bad rows dropped, a new file of nothing else adds its counts and no row.
  skip = "network_skip_bad_rows=true"
  only_bad = with_column(good_table(), "rtt", [np.nan] * 50)
  pq.write_table(only_bad, bad_path)
  first = prepare.prepare(make_config(prep, days[:3], skip), progress=False)
  appended = prepare.prepare(make_config(prep, [*days[:3], bad_path], skip), progress=False)
  assert appended.summary["appended"]["new_rows_read"] == 50
  full = prepare.prepare(
    make_config(tmp_path / "full", [*days[:3], bad_path], skip), progress=False
  )
  assert appended.summary["skipped"] == full.summary["skipped"] != {}
  assert_same_store(appended, full)
  # Taken out again with the first day, its skipped rows leave the counts with it.
  shutil.rmtree(first.summary["path"])
  rolled = prepare.prepare(make_config(prep, days[1:3], skip), progress=False)
  assert rolled.summary["removed"]["files"] == 2
  full = prepare.prepare(make_config(tmp_path / "full2", days[1:3], skip), progress=False)
  assert rolled.summary["skipped"] == full.summary["skipped"] == {}
  assert_same_store(rolled, full)


def test_a_base_whose_destination_index_is_past_its_table_is_an_error(tmp_path, days):
  prep = tmp_path / "prep"
  base = prepare.prepare(make_config(prep, days[:3]), progress=False)
  index = np.load(os.path.join(base.summary["path"], "train", "dst_index.npy"), mmap_mode="r+")
  index[len(index) // 2] = 1_000_000  # past its table (a damaged file)
  index.flush()
  del index
  folder = os.path.join(base.summary["path"], "train")
  with pytest.raises(DataError, match=f"^{folder}: a destination index past its table of "):
    prepare.prepare(make_config(prep, days), progress=False)
  assert sorted(os.listdir(prep)) == [os.path.basename(base.summary["path"])]  # no temporary


def test_cli_says_what_it_appended_removed_and_pruned(tmp_path, days, capsys):
  def run(*files) -> tuple[dict, str]:
    files = f"grain_train_files={','.join(files)}"
    argv = ["prepare", "base.yml", files, f"network_prepared_dir={tmp_path}", "--prune"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    lines = {line[:10]: line[10:] for line in captured.out.splitlines()}
    return lines, captured.err

  run(days[0])
  lines, err = run(days[0], days[1])
  assert lines["appended  "].startswith(f"1 new file(s), {valid_rows(days[1]):,} rows read, to ")
  base = lines["appended  "].split(" to ")[1].split(" (")[0]
  assert lines["pruned    "].startswith(f"1 superseded store(s) ({os.path.basename(base)})")
  assert not os.path.exists(base)
  assert "prepare: updating store " in err and ": appending 1 new file(s)\n" in err
  # A rolling window: the first day leaves as the third comes; the base goes with --prune.
  lines, err = run(days[1], days[2])
  assert lines["removed   "].startswith(f"{valid_rows(days[0]):,} rows of ")
  assert lines["removed   "].endswith(" rows): 1 file(s) no longer listed")
  base = lines["removed   "].split(" of ")[1].split(" (")[0]
  assert lines["pruned    "].startswith(f"1 superseded store(s) ({os.path.basename(base)})")
  assert not os.path.exists(base)
  assert ": appending 1 new file(s), removing 1 file(s) no longer listed\n" in err


def test_prune_removes_the_stores_the_new_one_supersedes_and_no_other(tmp_path, days):
  prep = tmp_path / "prep"
  first = prepare.prepare(make_config(prep, days[:1]), progress=False)
  second = prepare.prepare(make_config(prep, days[:2]), progress=False)
  other_key = prepare.prepare(
    make_config(prep, days[:2], "network_test_fraction=0.3"), progress=False
  )
  other_files = prepare.prepare(make_config(prep, [days[0], days[3]]), progress=False)
  # A run still reading the old store keeps its open files; new opens see no store there.
  seconds = os.path.join(second.summary["path"], "train", "seconds.npy")
  header = np.load(seconds, mmap_mode="r").offset
  held = open(seconds, "rb")  # noqa: SIM115
  third = prepare.prepare(make_config(prep, days[:3]), progress=False, prune=True)
  assert sorted(third.summary["pruned"]["stores"]) == sorted(
    [first.summary["path"], second.summary["path"]]
  )
  assert third.summary["pruned"]["bytes"] > 0
  left = {os.path.join(str(prep), name) for name in os.listdir(prep)}
  assert left == {third.summary["path"], other_key.summary["path"], other_files.summary["path"]}
  assert len(held.read()) == header + second.train.num_rows * 4
  held.close()
  assert third.train.num_rows + third.eval.num_rows == sum(
    pq.read_metadata(d).num_rows for d in days[:3]
  )
  # Nothing left to prune: cached, and the CLI says so.
  again = prepare.prepare(make_config(prep, days[:3]), progress=False, prune=True)
  assert again.cached and again.summary["pruned"] == {"stores": [], "bytes": 0}
  line = next(x for x in summary_text.format_summary(again.summary).splitlines() if "pruned" in x)
  assert line.startswith("pruned    0 superseded store(s)")


def test_an_append_killed_while_merging_leaves_the_base_and_a_rerun_appends(tmp_path, days):
  prep = tmp_path / "prep"
  base = prepare.prepare(make_config(prep, days[:3]), progress=False)
  process = _prepare_process(prep, days, pause_at="merging")
  try:
    _wait_stopped(process)
    work = glob.glob(str(prep / ".tmp-*"))
    assert len(work) == 1 and os.path.isdir(os.path.join(work[0], "train"))  # one split merged
  finally:
    process.send_signal(signal.SIGKILL)
    process.wait()
  assert process.returncode == -signal.SIGKILL
  assert prepare.ensure_prepared(make_config(prep, days[:3]), progress=False).cached
  appended = prepare.prepare(make_config(prep, days), progress=False)
  assert appended.summary["appended"]["base"] == base.summary["path"]
  names = {base.summary["path"], appended.summary["path"]}
  assert {os.path.join(str(prep), name) for name in os.listdir(prep)} == names
  assert_same_store(appended, prepare.prepare(make_config(tmp_path / "full", days), progress=False))


@pytest.fixture(scope="module")
def late_days(days, tmp_path_factory):
  """The four days, each after the first with late results: a copy of 2% of the day before's
  rows (their times in that day), as RIPE's daily dumps hold the results that arrived that day."""
  folder = tmp_path_factory.mktemp("late")
  out = []
  for k, path in enumerate(days):
    table = pq.read_table(path)
    if k:
      before = pq.read_table(days[k - 1])
      table = pa.concat_tables([table, before.slice(0, len(before) // 50)])
    out.append(str(folder / os.path.basename(path)))
    pq.write_table(table, out[-1])
  return out


def day_start(path) -> str:
  """The first time of a day's file (before any late result is added), ISO 8601."""
  times = pq.read_table(path, columns=["event_time"])["event_time"].to_numpy()
  return str(times.min().astype("datetime64[s]"))


def test_a_time_split_appended_with_late_results_sorts_only_the_day_they_fall_in(
  tmp_path, days, late_days, monkeypatch
):
  inc = tmp_path / "inc"
  prepare.prepare(make_config(inc, late_days[:3], SMALL, *TIME_SPLIT), progress=False)
  middle_rows = []
  middle_chunks = merge._Parts.middle_chunks

  def counted(self, names):
    chunks = middle_chunks(self, names)
    middle_rows.append(sum(len(c.probe) for c in chunks))
    return chunks

  monkeypatch.setattr(merge._Parts, "middle_chunks", counted)
  appended = prepare.prepare(make_config(inc, late_days, SMALL, *TIME_SPLIT), progress=False)
  monkeypatch.undo()
  full = prepare.prepare(
    make_config(tmp_path / "full", late_days, SMALL, *TIME_SPLIT), progress=False
  )
  assert_same_store(appended, full)
  # The new day's late results fall in the base's last day: the rows sorted again are at
  # most that day's and the late ones, not the new day's own or a probe's whole window.
  late = valid_rows(days[2]) // 50
  assert late <= sum(middle_rows) <= valid_rows(days[2]) + late


def test_time_bounds_roll_a_window_whose_days_hold_late_results(tmp_path, days, late_days, capsys):
  since = [day_start(path) for path in days]
  # Without bounds the first day's rows and the second day's late ones interleave: in full.
  prepare.prepare(make_config(tmp_path / "plain", late_days[:3]), progress=False)
  plain = prepare.prepare(make_config(tmp_path / "plain", late_days[1:]), progress=True)
  assert "removed" not in plain.summary
  assert "whose rows are not all before, or all after" in capsys.readouterr().err
  # With the window's start moved to the second day: the first day's file and the second
  # day's late results leave the store by time, no file read but the new day.
  inc = tmp_path / "inc"
  base = prepare.prepare(
    make_config(inc, late_days[:3], SMALL, f"network_since={since[0]}"), progress=False
  )
  rolled_config = make_config(inc, late_days[1:], SMALL, f"network_since={since[1]}")
  rolled = prepare.prepare(rolled_config, progress=False)
  full = prepare.prepare(
    make_config(tmp_path / "full", late_days[1:], SMALL, f"network_since={since[1]}"),
    progress=False,
  )
  assert "removed" not in full.summary
  assert_same_store(rolled, full)
  info = rolled.summary["removed"]
  assert info["base"] == base.summary["path"] and info["files"] == 1 and info["rebound"]
  late = pq.read_metadata(days[0]).num_rows // 50
  # Kept: the second and third days, and the third day's late results of the second.
  assert info["rows"] == base.summary["rows"] - (valid_rows(*days[1:3]) + late)
  assert rolled.summary["appended"]["new_files"] == 1
  start = config.iso_seconds(since[1])
  assert min(rolled.train.seconds.min(), rolled.eval.seconds.min()) == start
  assert rolled.summary["rows"] == valid_rows(*days[1:]) + 2 * late  # late results kept
  text = summary_text.format_summary(rolled.summary)
  assert (
    f"window    {since[1].replace('T', ' ')} to ... UTC: {late:,} valid rows outside it" in text
  )
  assert "the rows outside the new time bounds" in text


def test_time_bounds_narrowed_read_no_file_and_widened_build_in_full(tmp_path, days, capsys):
  until = [day_start(path) for path in days]
  prep, overrides = tmp_path / "prep", [SMALL, f"grain_eval_files={days[3]}"]
  prepare.prepare(make_config(prep, days[:3], *overrides), progress=False)
  narrowed = prepare.prepare(
    make_config(prep, days[:3], *overrides, f"network_until={until[2]}"), progress=False
  )
  assert narrowed.summary["removed"]["files"] == 0 and narrowed.summary["removed"]["rebound"]
  assert "no file read" in summary_text.format_summary(narrowed.summary)
  assert narrowed.train.num_rows == valid_rows(*days[:2])
  assert narrowed.eval.num_rows == valid_rows(days[3])  # the eval files are kept whole
  full = prepare.prepare(
    make_config(tmp_path / "full", days[:3], *overrides, f"network_until={until[2]}"),
    progress=False,
  )
  assert_same_store(narrowed, full)
  # From the narrowed store alone, a wider window needs rows it does not have: in full.
  shutil.rmtree(prep)
  prepare.prepare(
    make_config(prep, days[:3], *overrides, f"network_until={until[2]}"), progress=False
  )
  capsys.readouterr()
  widened = prepare.prepare(
    make_config(prep, days[:3], *overrides, f"network_until={until[3]}"), progress=True
  )
  assert "removed" not in widened.summary
  assert widened.train.num_rows == valid_rows(*days[:3])
  err = capsys.readouterr().err
  assert "which leaves out rows within" in err and "a file it keeps" in err


def test_time_bounds_that_are_not_a_window_are_a_one_line_error(tmp_path, days):
  bad = make_config(
    tmp_path, days[:1], "network_since=2025-07-02", "network_until=2025-07-01T23:00:00"
  )
  with pytest.raises(ConfigError, match=r"network_until \(2025-07-01T23:00:00\) must be after"):
    prepare.prepare(bad, progress=False)
