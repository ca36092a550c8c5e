"""The merge's own searches (`data.prepare.time_merge`): the time split's cutoff over split folders,
each within a window of time, found without reading their rows whole (docs/prepare.md, "New
files: append")."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from maxtext_netdata.data.prepare import merge, prepare, time_merge
from maxtext_netdata.data.store import store
from tests.data.prepare.test_prepare import make_config

START = 1_751_328_000


def write_rows(path, seconds, probes) -> str:
  n = len(seconds)
  pq.write_table(
    pa.table(
      {
        "msm_id": pa.array(np.arange(n), pa.int64()),
        "event_time": pa.array(seconds, pa.timestamp("s")),
        "src_addr": [f"192.0.2.{p}" for p in probes],
        "dst_addr": ["8.8.8.8"] * n,
        "ip_version": pa.array([4] * n, pa.int8()),
        "rtt": pa.array(np.linspace(1, 100, n)),
      }
    ),
    path,
  )
  return str(path)


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
  """Two train split folders (time split, no test share) whose probes' times interleave:
  every row's second distinct, so a cutoff one row off is another second."""
  folder = tmp_path_factory.mktemp("merge")
  rng = np.random.default_rng(7)
  seconds = START + rng.choice(40 * 86_400, 5_000, replace=False)
  probes = rng.integers(0, 37, len(seconds))
  out = []
  for k, rows in enumerate((slice(0, 700), slice(700, None))):
    path = write_rows(folder / f"{k}.parquet", seconds[rows], probes[rows])
    cfg = make_config(folder / "prep", [path], "network_split=time", "network_test_fraction=0")
    out.append(prepare.prepare(cfg, progress=False).summary["path"] + "/train")
  return out


def seconds_of(path, window) -> np.ndarray:
  seconds = np.array(store.PreparedStore(path).seconds, np.int64)
  low, high = window or (None, None)
  keep = np.ones(len(seconds), bool)
  if low is not None:
    keep &= seconds >= low
  if high is not None:
    keep &= seconds <= high
  return seconds[keep]


WINDOWS = {
  "whole": (None, None),
  "the first from day 3, the second whole": ((START + 3 * 86_400, None), None),
  "the first to day 20, the second from day 19": (
    (None, START + 20 * 86_400),
    (START + 19 * 86_400 + 1, None),
  ),
  "both within days 10 to 11": ((START + 10 * 86_400, START + 11 * 86_400),) * 2,
  "the first empty": ((START + 50 * 86_400, None), None),
}


@pytest.mark.parametrize("case", sorted(WINDOWS))
def test_cutoff_over_windows_is_numpys_higher_quantile(splits, case):
  windows = WINDOWS[case]
  sources = [merge.SplitSource(path, w) for path, w in zip(splits, windows, strict=True)]
  try:
    seconds = np.concatenate([seconds_of(p, w) for p, w in zip(splits, windows, strict=True)])
    assert sum(int(s.sizes.sum()) for s in sources) == len(seconds)
    assert len(np.unique(seconds)) == len(seconds) > 1
    for fraction in (1e-4, 0.01, 0.1, 0.25, 0.5, 0.9, 0.999):
      expected = np.quantile(seconds, 1 - fraction, method="higher")
      assert time_merge.time_cutoff(sources, fraction) == expected, fraction
  finally:
    for source in sources:
      source.close()


def test_cutoff_of_no_rows_is_zero(splits):
  sources = [merge.SplitSource(p, (START + 50 * 86_400, None)) for p in splits]
  assert time_merge.time_cutoff(sources, 0.1) == 0
  for source in sources:
    source.close()
