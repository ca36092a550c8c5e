"""Benchmark of updating a prepared store (a new day appended; a window rolled by a day),
against full builds of the same files.

    python benchmarks/bench_append.py [--rows 8000000] [--days 8] [--data DIR] [--keep DIR]
        [--split probe|time] [--test-fraction 0.1] [--recut 0.2]

Generates `--rows` raw rows as `--days` time-ordered files (reused from `--data` when already
there), prepares all but the last, then, each in a fresh process (so that its peak RSS is its
own): the window rolled by a day (the first day removed and the last added, in one prepare
from that store), the last day appended to that store, and both file sets prepared in full.
Prints each command's wall time and peak RSS, the updates' split into reading the new day and
merging, the merge's speed in rows/s and MB/s of store written, and, as the floor for a merge
that writes the whole store again, a plain copy of the base store's files in the same run.
"same store" compares every file of the updated store with the full build's, byte for byte.
With `--split time` each store holds the latest `--test-fraction` of the rows as its test
split, whose cutoff each update moves; `--recut F` then cuts the store of all the files again
at test fraction F (the same files, no file read) against a full build at F.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

_CHILD = """
import json, sys
from maxtext_netdata import config
from maxtext_netdata.data.prepare import prepare
files, prepared, extra = sys.argv[1].split(","), sys.argv[2], json.loads(sys.argv[3])
overrides = [f"grain_train_files={','.join(files)}", f"network_prepared_dir={prepared}", *extra]
cfg = config.load(None, overrides)
print(json.dumps(prepare.prepare(cfg, progress=False).summary))
"""


def _prepare(files: list[str], prepared: str, *overrides: str) -> tuple[dict, float]:
  start = time.perf_counter()
  run = subprocess.run(
    [sys.executable, "-c", _CHILD, ",".join(files), prepared, json.dumps(overrides)],
    capture_output=True,
    text=True,
    check=True,
  )
  return json.loads(run.stdout.splitlines()[-1]), time.perf_counter() - start


def _store_bytes(root: str) -> int:
  return sum(
    os.path.getsize(os.path.join(folder, name))
    for folder, _, names in os.walk(root)
    for name in names
  )


def _same(a: dict, b: dict) -> str:
  """Whether two prepared stores hold the same files, byte for byte (their summaries, which
  hold times and paths, aside), and their fingerprint."""
  names = [_files(a["path"]), _files(b["path"])]
  same = names[0] == names[1] and all(
    filecmp.cmp(os.path.join(a["path"], n), os.path.join(b["path"], n), shallow=False)
    for n in names[0]
  )
  return f"{same} (fingerprint {b['fingerprint']})"


def _files(root: str) -> list[str]:
  """A store's files but its summary, relative to `root`."""
  paths = (os.path.join(folder, n) for folder, _, names in os.walk(root) for n in names)
  return sorted(os.path.relpath(p, root) for p in paths if p != os.path.join(root, "meta.json"))


def _late_window(files: list[str], work: str, share: float, split: list[str]) -> None:
  """The window rolled by a day over days with late results, by `network_since`."""
  import pyarrow as pa  # noqa: PLC0415
  import pyarrow.parquet as pq  # noqa: PLC0415

  late, starts, before = [], [], None
  for k, path in enumerate(files):
    table = pq.read_table(path)
    starts.append(str(table["event_time"].to_numpy().min().astype("datetime64[s]")))
    if before is not None:
      table = pa.concat_tables([table, before.slice(0, int(len(before) * share))])
    late.append(os.path.join(work, "late", f"day-{k:03d}.parquet"))
    os.makedirs(os.path.dirname(late[-1]), exist_ok=True)
    pq.write_table(table, late[-1])
    before = pq.read_table(path)
  mib = 2**20
  _prepare(late[:-1], os.path.join(work, "late_inc"), f"network_since={starts[0]}", *split)
  rolled, rolled_s = _prepare(
    late[1:], os.path.join(work, "late_inc"), f"network_since={starts[1]}", *split
  )
  full, full_s = _prepare(
    late[1:], os.path.join(work, "late_full"), f"network_since={starts[1]}", *split
  )
  removed = rolled["removed"]
  print(
    f"late results    {share:.0%} of each day's rows filed under the next day; the window rolled"
    f" by network_since={starts[1]}"
  )
  print(
    f"window rolled   {rolled_s:.2f} s ({rolled['seconds']:.2f} s in prepare: the new day"
    f" {rolled['seconds'] - removed['merge_seconds']:.2f} s, the merge with"
    f" {removed['rows']:,} rows left out {removed['merge_seconds']:.2f} s),"
    f" peak RSS {rolled['peak_rss_bytes'] / mib:,.0f} MiB"
  )
  print(
    f"its full build  {full_s:.2f} s ({full['seconds']:.2f} s in prepare),"
    f" peak RSS {full['peak_rss_bytes'] / mib:,.0f} MiB"
  )
  print(f"full / rolled   {full['seconds'] / rolled['seconds']:.2f}x (time in prepare)")
  print(f"same store      {_same(rolled, full)}")


def _recut(files: list[str], work: str, share: float) -> None:
  """The store of all the files (the append's) cut again at test fraction `share`."""
  split = ["network_split=time", f"network_test_fraction={share}"]
  recut, recut_s = _prepare(files, os.path.join(work, "inc"), *split)
  full, full_s = _prepare(files, os.path.join(work, "full_recut"), *split)
  print(
    f"cut again       {recut_s:.2f} s ({recut['seconds']:.2f} s in prepare, test fraction"
    f" {recut['recut']['test_fraction']:g} -> {share:g}, no file read),"
    f" peak RSS {recut['peak_rss_bytes'] / 2**20:,.0f} MiB"
  )
  print(f"its full build  {full_s:.2f} s ({full['seconds']:.2f} s in prepare)")
  print(f"full / cut      {full['seconds'] / recut['seconds']:.2f}x (time in prepare)")
  print(f"same store      {_same(recut, full)}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--rows", type=int, default=8_000_000)
  parser.add_argument("--days", type=int, default=8)
  parser.add_argument("--data", default="", help="raw files' folder (generated when empty)")
  parser.add_argument("--keep", default="", help="stores' folder (a temporary one by default)")
  parser.add_argument(
    "--late",
    type=float,
    default=0.02,
    help="then each day after the first with this share of the day before's rows as late"
    " results, as RIPE's dumps have them, and the window rolled by network_since (0: not run)",
  )
  parser.add_argument("--split", choices=("probe", "time"), default="probe")
  parser.add_argument("--test-fraction", type=float, default=0.1)
  parser.add_argument(
    "--recut", type=float, default=None, help="with --split time: a new test fraction (below)"
  )
  args = parser.parse_args()
  if args.recut is not None and args.split != "time":
    parser.error("--recut takes --split time: a probe split of another share is built in full")
  split = [f"network_split={args.split}", f"network_test_fraction={args.test_fraction}"]
  from maxtext_netdata.data.synthetic.generate import generate  # noqa: PLC0415

  work = args.keep or tempfile.mkdtemp(prefix="bench_append_")
  data = args.data or os.path.join(work, "raw")
  marker = os.path.join(data, ".complete")
  if os.path.exists(marker):
    files = sorted(os.path.join(data, f) for f in os.listdir(data) if f.endswith(".parquet"))
  else:
    files = generate(data, rows=args.rows, shards=args.days, seed=0, progress=True)
  try:
    base, _ = _prepare(files[:-1], os.path.join(work, "inc"), *split)
    rolled, rolled_s = _prepare(files[1:], os.path.join(work, "inc"), *split)
    appended, append_s = _prepare(files, os.path.join(work, "inc"), *split)
    full, full_s = _prepare(files, os.path.join(work, "full"), *split)
    full_rolled, full_rolled_s = _prepare(files[1:], os.path.join(work, "full_rolled"), *split)
    copy_dir = os.path.join(work, "copy")
    start = time.perf_counter()
    shutil.copytree(base["path"], copy_dir)
    copy_s = time.perf_counter() - start
    info = appended["appended"]
    store_mb = _store_bytes(appended["path"]) / 1e6
    base_mb = _store_bytes(base["path"]) / 1e6
    mib = 2**20
    print(
      f"rows            {full['rows']:,} in {len(files)} files, the last {info['new_rows_read']:,}"
    )
    print(
      f"full build      {full_s:.2f} s ({full['seconds']:.2f} s in prepare),"
      f" peak RSS {full['peak_rss_bytes'] / mib:,.0f} MiB"
    )
    print(
      f"append          {append_s:.2f} s ({appended['seconds']:.2f} s in prepare: the new day"
      f" {appended['seconds'] - info['merge_seconds']:.2f} s, the merge"
      f" {info['merge_seconds']:.2f} s), peak RSS {appended['peak_rss_bytes'] / mib:,.0f} MiB"
    )
    merge_s = max(info["merge_seconds"], 1e-9)
    print(
      f"merge           {full['rows'] / merge_s:,.0f} rows/s, {store_mb / merge_s:,.0f} MB/s"
      f" of a {store_mb:,.0f} MB store"
    )
    copy_rate = base_mb / max(copy_s, 1e-9)
    print(f"copy of base    {copy_rate:,.0f} MB/s ({base_mb:,.0f} MB in {copy_s:.2f} s)")
    print(f"full / append   {full['seconds'] / appended['seconds']:.2f}x (time in prepare)")
    print(f"same store      {_same(appended, full)}")
    removed = rolled["removed"]
    print(
      f"window rolled   {rolled_s:.2f} s ({rolled['seconds']:.2f} s in prepare: the new day"
      f" {rolled['seconds'] - removed['merge_seconds']:.2f} s, the merge with the first day's"
      f" {removed['rows']:,} rows left out {removed['merge_seconds']:.2f} s),"
      f" peak RSS {rolled['peak_rss_bytes'] / mib:,.0f} MiB"
    )
    print(
      f"its full build  {full_rolled_s:.2f} s ({full_rolled['seconds']:.2f} s in prepare),"
      f" peak RSS {full_rolled['peak_rss_bytes'] / mib:,.0f} MiB"
    )
    ratio = full_rolled["seconds"] / rolled["seconds"]
    print(f"full / rolled   {ratio:.2f}x (time in prepare)")
    print(f"same store      {_same(rolled, full_rolled)}")
    if args.late > 0:
      _late_window(files, work, args.late, split)
    if args.recut is not None:
      _recut(files, work, args.recut)
  finally:
    if not args.keep:
      shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
  main()
