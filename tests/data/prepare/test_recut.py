"""A time split's store cut again at another test share, with or without new files, instead of
built in full: the store a full build gives, byte for byte (docs/prepare.md, "Another test
share, cut again")."""

import os

import pytest

from maxtext_netdata.data.prepare import prepare, summary_text
from tests.data.prepare.test_append import SMALL, assert_same_store
from tests.data.prepare.test_prepare import make_config

RECUTS = {
  # the base's files and test fraction, then the current files and test fraction
  "a smaller test share": (([0, 1, 2], 0.2), ([0, 1, 2], 0.1)),
  "a larger test share, a new day": (([0, 1, 2], 0.2), ([0, 1, 2, 3], 0.35)),
  "no test share, the oldest day leaves": (([0, 1, 2], 0.2), ([1, 2], 0.0)),
  "a test share where there was none": (([0, 1, 2], 0.0), ([0, 1, 2], 0.2)),
}


@pytest.mark.parametrize("case", sorted(RECUTS))
def test_a_time_split_of_another_test_share_is_cut_again_into_the_store_a_full_build_gives(
  tmp_path, days, case, capsys
):
  (old, old_share), (new, new_share) = RECUTS[case]
  before, after = [days[i] for i in old], [days[i] for i in new]
  split = ["network_split=time", SMALL]
  base = prepare.prepare(
    make_config(tmp_path / "inc", before, *split, f"network_test_fraction={old_share}"),
    progress=False,
  )
  current = make_config(tmp_path / "inc", after, *split, f"network_test_fraction={new_share}")
  recut = prepare.prepare(current, progress=True, prune=True)
  full = prepare.prepare(
    make_config(tmp_path / "full", after, *split, f"network_test_fraction={new_share}"),
    progress=False,
  )
  assert_same_store(recut, full)
  assert recut.summary["recut"]["base"] == base.summary["path"]
  assert recut.summary["recut"]["test_fraction"] == old_share
  assert ("appended" in recut.summary) == bool(set(after) - set(before))
  assert f"test fraction {new_share:g} (was {old_share:g})" in capsys.readouterr().err
  text = summary_text.format_summary(recut.summary)
  assert f"test fraction {old_share:g} -> {new_share:g}" in text
  assert ("no file read" in text) == (set(after) <= set(before))
  assert ("bytes per raw row" in text) == ("appended" in recut.summary)
  assert recut.summary["pruned"]["stores"] == [base.summary["path"]]  # the base, and no other
  assert not os.path.exists(base.summary["path"])


def test_a_probe_split_of_another_test_share_is_built_in_full(tmp_path, days):
  """A probe's split is its hash's, against the fraction: a new fraction moves whole probes
  between the splits, which no merge of the old splits by time gives."""
  prepare.prepare(make_config(tmp_path, days[:2], "network_test_fraction=0.2"), progress=False)
  again = prepare.prepare(
    make_config(tmp_path, days[:2], "network_test_fraction=0.1"), progress=False
  )
  assert not {"recut", "appended", "removed"} & set(again.summary)
