"""Updating a prepared store: which store to update, new raw files appended (only they are
read and sorted), files no longer listed taken out (none read); the merge itself is
`data.prepare.merge`.

RIPE's dumps arrive a day at a time, and a month of them is ~35 billion rows: preparing the
whole month again for each new day would read every earlier day again. When a complete
store in the same folder was prepared from some of the current input files (each the same
URI, size and modification time) with the same content keys (`content_key`: the eval files,
the split, the test fraction, bad-row handling, hashed order, the format), `prepare` takes it
as the base: the new files are prepared on their own into a delta store in the build folder
(validated, partitioned and sorted as any build), and base and delta are merged split by
split (`merge.merge_split`). The eval split, prepared from the eval files, which are the same, is
linked from the base.

The result is the store a full build of all the files gives, byte for byte: a store's content
depends only on the set of its rows (docs/prepare.md, "The store"), and the merge puts them
in the same order: probes by (hash, version, address), a probe's rows by time, ties by
content; a probe's rows of the two stores copied as runs where their times do not
interleave, and only the rows whose times do sorted again by `bucket_sort.order_bucket`
(`merge._Parts`).
Memory is bounded as in a build: the union of probes is cut into batches of at most a
bucket's rows (plus one probe), each read from the two stores with plain reads (no memory
map: mapped pages would count in this process's memory) and written through a memory map
of the new split's files (`assemble.SplitWriter`).

A store whose files are not all listed any more (the oldest day of a rolling window), or
that was prepared within other time bounds (`network_since`, `network_until`), is a base too
when the rows to leave can be told from the rows to keep by time alone (`update_window`, from
each file's first and last second in the summary): the merge then reads only the base's rows
within a window of time, each probe's one run (`merge.SplitSource`'s window), which are exactly
the rows of the kept files within the new bounds.

With `network_split: time` and a test share, the cutoff moves with every new row: the new
files are prepared with no test share, and the base's two splits and the new rows are cut
again at the cutoff of them all (`time_merge.merge_time_split`), found by binary searches in each
probe's rows, none read whole; the base's test rows before the new cutoff join the train
split as runs after each probe's train rows. The same merge cuts a time split of another
test share again at the new one (`stores`' `recut`), with or without new files: changing
`network_test_fraction` reads no raw file.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil

import numpy as np

from maxtext_netdata.data import remote
from maxtext_netdata.data.prepare import local_runner
from maxtext_netdata.data.store import store

NO_BOUNDS = (None, None)  # time bounds (since, until) of a store prepared without any


@dataclasses.dataclass
class Base:
  """A complete store that holds some of the current train files: `new_files` are to be
  added to it; `removed` (entries) are its files no longer listed, whose rows are exactly
  those outside `window`, the first and last second of the rows it keeps."""

  root: str
  summary: dict
  new_files: list[remote.FileEntry]
  removed: list[list] = dataclasses.field(default_factory=list)
  window: tuple[int, int] | None = None

  @property
  def test_fraction(self) -> float:
    """The base's `network_test_fraction` (a time split's may differ from the new store's)."""
    return self.summary["network_test_fraction"]


def entries(files: list[remote.FileEntry]) -> list[list]:
  """The files as JSON-able [uri, size, mtime_ns] lists, as a store's summary keeps them."""
  return [list(dataclasses.astuple(f)) for f in files]


def _summaries(prepared_dir: str):
  """(root, summary) of each store in `prepared_dir` whose summary can be read."""
  for meta_path in sorted(glob.glob(os.path.join(glob.escape(prepared_dir), "*", store.META_FILE))):
    try:
      with open(meta_path, encoding="utf-8") as f:
        summary = json.load(f)
    except (OSError, json.JSONDecodeError):
      continue
    if isinstance(summary, dict):
      yield os.path.dirname(meta_path), summary


def stores(prepared_dir: str, content_key: str, version: int = store.FORMAT_VERSION, recut=None):
  """(root, its train files as a set of entries, summary) of each complete store in
  `prepared_dir` of `content_key` and store format `version`, and, with `recut` (for a time
  split: the content key at another test fraction, `naming.recut_key`), each time split of
  another test share that is otherwise the same (its rows cut again in the merge). Stores
  written before summaries kept their files' sizes and times are left out."""
  for root, summary in _summaries(prepared_dir):
    if summary.get("format_version") != version or "train_file_entries" not in summary:
      continue
    if summary.get("content_key") != content_key and not _recuttable(summary, recut):
      continue
    yield root, {tuple(e) for e in summary["train_file_entries"]}, summary


def _recuttable(summary: dict, recut) -> bool:
  """Whether a time split of the summary's content key at the summary's test fraction is
  the store's (`stores`'s `recut`)."""
  fraction = summary.get("network_test_fraction")
  return (
    recut is not None
    and summary.get("network_split") == "time"
    and isinstance(fraction, int | float)
    and summary.get("content_key") == recut(fraction)
  )


def former_formats(prepared_dir: str) -> list[tuple[str, object, int]]:
  """(root, format version, bytes its deletion frees) of each complete store in
  `prepared_dir` of a format this code does not read: never a base, never pruned (an older
  version of this code may still read it)."""
  return [
    (root, summary.get("format_version"), _folder_bytes(root))
    for root, summary in _summaries(prepared_dir)
    if summary.get("format_version") != store.FORMAT_VERSION
  ]


def _folder_bytes(root: str) -> int:
  """The bytes that deleting folder `root` frees: files hard-linked elsewhere (a split linked
  into a newer store, a store converted to this format) are not counted."""
  size = 0
  for folder, _, names in os.walk(root):
    for name in names:
      stat = os.stat(os.path.join(folder, name))
      size += stat.st_size if stat.st_nlink == 1 else 0
  return size


def find_base(
  prepared_dir: str,
  content_key: str,
  train_files: list[remote.FileEntry],
  bounds=NO_BOUNDS,
  version: int = store.FORMAT_VERSION,
  recut=None,
) -> Base | None:
  """The complete store in `prepared_dir` of `content_key` (and store format `version`; a
  time split of another test share with `recut`, as `stores` takes it) with the most of
  `train_files` (the fewest files to remove on a tie, then one of the same test share) that
  can be updated into the store of these files within `bounds` (`update_window`), or None."""
  current = {tuple(e) for e in entries(train_files)}
  best, best_rank = None, None
  for root, held, summary in stores(prepared_dir, content_key, version, recut):
    kept, removed = held & current, held - current
    same = summary["content_key"] == content_key
    if not kept or (same and held == current and bounds_of(summary) == tuple(bounds)):
      continue
    usable, window, _ = update_window(summary, current, bounds)
    rank = (len(kept), -len(removed), same)
    if usable and (best is None or rank > best_rank):
      best_rank = rank
      new = [f for f in train_files if tuple(dataclasses.astuple(f)) not in held]
      gone = [list(e) for e in summary["train_file_entries"] if tuple(e) in removed]
      best = Base(root=root, summary=summary, new_files=new, removed=gone, window=window)
  return best


def no_base_reason(
  prepared_dir: str,
  content_key: str,
  train_files: list[remote.FileEntry],
  bounds=NO_BOUNDS,
  recut=None,
) -> str:
  """Why no store of `content_key` (or `recut`, as `stores` takes it) holding some of
  `train_files` can be updated (when `find_base` found none): about the one holding the most
  of them; "" when there is none."""
  current = {tuple(e) for e in entries(train_files)}
  best = None
  for root, held, summary in stores(prepared_dir, content_key, recut=recut):
    kept = held & current
    _, _, reason = update_window(summary, current, bounds)
    if kept and reason and (best is None or len(kept) > best[0]):
      best = (len(kept), f"store {root} {reason}")
  return best[1] if best else ""


def bounds_of(summary: dict) -> tuple:
  """The time bounds (since, until) a store's summary records (none before stores kept them)."""
  return tuple(summary.get("time_bounds") or NO_BOUNDS)


def update_window(summary: dict, current: set, bounds) -> tuple[bool, tuple | None, str]:
  """Whether the store of `summary` can be updated into the store of the `current` files
  (entries) within `bounds` (since, until: Unix seconds, None for none), reading none of its
  files: (True, window, "") where it can, window being the first and last second of the rows
  it keeps (None: all of them); (False, None, why) where it cannot ("" when it holds nothing
  of use).

  From each file's first and last second (`reader.FileReport`, kept in the summary since
  stores kept them): the store's rows within the window must be exactly the rows of the files
  it keeps that the new bounds take, so each kept file's rows within the new bounds must lie
  within the store's own bounds, and every row of the files leaving must lie outside the
  window, before or after it. Daily dumps leaving a rolling window are the case this serves;
  files whose times interleave with the rest (a day from the middle, or, without bounds, a
  day of late results) are built in full.
  """
  held = {tuple(e) for e in summary["train_file_entries"]}
  removed, old = held - current, bounds_of(summary)
  if not removed and old == tuple(bounds):
    return True, None, ""  # new files appended to every row it has
  reports = summary.get("train_file_reports")
  if reports is None:
    return (
      False,
      None,
      f"was prepared before stores kept their files' times, so its {len(removed)} file(s) no"
      " longer listed cannot be taken out, nor its time bounds changed",
    )
  low, high = _inclusive(bounds)
  old_low, old_high = _inclusive(old)
  kept, gone = [], []
  for entry, report in zip(summary["train_file_entries"], reports, strict=True):
    first, last = report[2], report[3]
    if first is None:
      continue
    if tuple(entry) in removed:
      gone.append((first, last, entry[0]))
      continue
    kept.append((first, last))
    start, stop = max(first, low), min(last, high)
    if start <= stop and (start < old_low or stop > old_high):
      return (
        False,
        None,
        f"was prepared within {local_runner.span_text(old)}, which leaves out rows within"
        f" {local_runner.span_text(bounds)} of {entry[0]}, a file it keeps",
      )
  if not kept:
    return False, None, ""
  low = max(low, old_low, min(f for f, _ in kept))
  high = min(high, old_high, max(t for _, t in kept))
  if low > high:
    return False, None, ""  # none of its rows stays
  between = [uri for first, last, uri in gone if not (last < low or first > high)]
  if between:
    more = ", ..." if len(between) > 1 else ""
    return (
      False,
      None,
      f"holds {len(between)} file(s) no longer listed ({sorted(between)[0]}{more}) whose rows"
      f" are not all before, or all after, those it keeps",
    )
  return True, (low, high), ""


def _inclusive(bounds) -> tuple[float, float]:
  """(since, until) as the first and last second they take (infinite where unbounded)."""
  since, until = bounds
  return (
    -np.inf if since is None else since,
    np.inf if until is None else until - 1,
  )


def superseded(
  prepared_dir: str,
  content_key: str,
  train_files: list[remote.FileEntry],
  base: str = "",
  bounds=NO_BOUNDS,
  recut=None,
) -> list:
  """The complete stores in `prepared_dir` that the store of `train_files` within `bounds`
  supersedes: of the same content key and bounds, each holding a part of these files and no
  other file, and `base`, the store it was made from (which may hold files no longer listed,
  other bounds, or, with `recut` as `stores` takes it, another test share)."""
  current = {tuple(e) for e in entries(train_files)}
  return [
    root
    for root, held, summary in stores(prepared_dir, content_key, recut=recut)
    if (
      summary["content_key"] == content_key
      and held < current
      and bounds_of(summary) == tuple(bounds)
    )
    or (base and os.path.abspath(root) == os.path.abspath(base))
  ]


def remove_store(root: str) -> int:
  """Remove the store folder `root`; the bytes freed (files hard-linked elsewhere, such as an
  eval split linked into the store that supersedes it, are not). Renamed first to a temporary
  name, so no process takes it for a complete store while its files go."""
  size = _folder_bytes(root)
  parent, name = os.path.split(root)
  doomed = os.path.join(parent, f".tmp-{name}-pruned")
  os.rename(root, doomed)
  shutil.rmtree(doomed, ignore_errors=True)
  return size
