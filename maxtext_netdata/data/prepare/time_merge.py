"""The time split's update (`data.prepare.append`): a base store's train and test splits and
the new rows (prepared with no test share) cut again at the cutoff of them all, each output
split a `merge.merge_split` of the three sources on its side of the cutoff.
"""

from __future__ import annotations

import os

from maxtext_netdata.data.prepare import assemble, merge


def merge_time_split(
  base: str, delta: str, out: str, meta: dict, *, fraction: float, window, batch_rows: int, bar=None
) -> tuple[dict, int]:
  """The train and test split folders under `out` of a time split holding `fraction` of the
  rows as its test split: the rows of store `base`'s two splits (those within `window`) and of
  `delta`'s train split (new files prepared with no test share), cut at the cutoff of them
  all (`time_cutoff`): their counts by split name, and the probes of both (distinct).

  Each output split is a merge of the three sources, each within its window and on its side
  of the cutoff: a new day moves the cutoff by about a day, so the train split is the base's
  train split and the base's test rows before the new cutoff (copied as runs: they come after
  each probe's train rows), and the test split the rest of the base's test rows and the new
  rows (sorted again only where a probe's new rows fall between its old ones).
  """
  paths = [os.path.join(base, "train"), os.path.join(base, "test"), os.path.join(delta, "train")]
  inputs = [(p, w) for p, w in zip(paths, (window, window, None), strict=True) if os.path.isdir(p)]
  sources = [merge.SplitSource(path, w) for path, w in inputs]
  try:
    cutoff = time_cutoff(sources, fraction)
    probes = len(merge.ProbeUnion(sources).version)  # a probe may be in both splits: counted once
  finally:
    for source in sources:
      source.close()
  sides = {"train": (None, cutoff - 1), "test": (cutoff, None)}
  counts = {}
  for name, side in sides.items():
    windows = [(path, _within(w, side)) for path, w in inputs]
    counts[name] = merge.merge_split(
      windows, os.path.join(out, name), {**meta, "split": name}, batch_rows=batch_rows, bar=bar
    )
  return counts, probes


def _within(window, side) -> tuple:
  """The window of seconds (first, last; None: no bound) within both `window` and `side`."""
  if window is None:
    return side
  lows = [x for x in (window[0], side[0]) if x is not None]
  highs = [x for x in (window[1], side[1]) if x is not None]
  return (max(lows) if lows else None, min(highs) if highs else None)


def time_cutoff(sources: list[merge.SplitSource], fraction: float) -> int:
  """`assemble.time_cutoff` of the sources' rows (each within its window): the second of row
  `assemble.quantile_index` in time order, found by a binary search on the second itself.

  Each step counts the rows at or before a second by a binary search in each probe's rows
  (`assemble.search_ranges`), within the rows the steps before left between the bounds: the
  whole search reads ~log2(rows) + log2(seconds) rows a probe, a few pages, where counting
  by hour as a build does would read every row's second of a store that may hold a month.
  """
  n = sum(int(s.sizes.sum()) for s in sources)
  if not n:
    return 0  # no rows: no cutoff to find
  wanted = assemble.quantile_index(n, fraction) + 1  # rows at or before the cutoff's second
  low = min(int(s.first.min()) for s in sources if len(s.first))
  high = max(int(s.last.max()) for s in sources if len(s.last))
  if not fraction:
    return high + 1  # no test share: every row trains, as a build's time split puts them
  below = [s.starts.copy() for s in sources]  # each probe's first row at or after `low`
  above = [s.starts + s.sizes for s in sources]  # and its first row after `high`
  while low < high:
    mid = (low + high) // 2
    at = [
      assemble.search_ranges(s.seconds, lo, hi, mid, right=True)
      for s, lo, hi in zip(sources, below, above, strict=True)
    ]
    if sum(int((a - s.starts).sum()) for s, a in zip(sources, at, strict=True)) >= wanted:
      high, above = mid, at
    else:
      low, below = mid + 1, at
  return low
