"""`bench.attention_kernels.compare`: what the accelerator check's `attention` row reports."""

import numpy as np
import pytest

from maxtext_netdata import config
from maxtext_netdata.bench import attention_kernels
from maxtext_netdata.trainer import attention

SMALL = [
  "base_num_query_heads=4",
  "base_num_kv_heads=2",
  "head_dim=16",
  "max_target_length=64",
  "dtype=float32",
]


def _segmentation() -> np.ndarray:
  """Two rows: three contexts then padding, and one context filling the row."""
  rows = np.zeros((2, 64), np.int32)
  rows[0, :20], rows[0, 20:45], rows[0, 45:60] = 1, 2, 3
  rows[1] = 1
  return rows


def test_kernels_are_timed_and_measured_against_the_float32_reference(monkeypatch):
  """XLA's kernel and Pallas's (interpreted here) are within float32's error of the
  reference; the same kernel given the wrong mask (the rows' segments ignored) is reported
  with a large error, so an exact figure for a kernel on the GPU means it computes the
  segment mask's function."""
  cfg = config.load(None, SMALL)
  segmentation = _segmentation()
  np.testing.assert_array_equal(attention_kernels.runs_per_row(segmentation), [4, 1])
  right = attention_kernels.compare(cfg, segmentation, repeats=2)
  assert right["runs_per_row"] == {"max": 4, "mean": 2.5}
  assert right["shape"] == [2, 64, 4, 2, 16] and right["speedup_over"] == "xla"
  for name in ("xla", "pallas"):
    timed = right["kernels"][name]
    assert timed["seconds"] > 0 and 0 < max(timed["max_abs_error"].values()) < 1e-4
  assert all("error" in right["kernels"][name] for name in ("cudnn", "cudnn_packed"))

  kernel_mask = attention.kernel_mask

  def ignoring_segments(segmentation, kernel, *args):
    return (
      kernel_mask(segmentation * 0 + 1, kernel, *args)
      if kernel in ("xla", "pallas")
      else kernel_mask(segmentation, kernel, *args)
    )

  monkeypatch.setattr(attention, "kernel_mask", ignoring_segments)
  wrong = attention_kernels.compare(cfg, segmentation, repeats=1)
  for name in ("xla", "pallas"):
    assert min(wrong["kernels"][name]["max_abs_error"].values()) > 0.1


def test_a_chosen_few_kernels_run_and_an_unknown_name_is_refused():
  cfg = config.load(None, SMALL)
  chosen = attention_kernels.compare(cfg, _segmentation(), repeats=1, kernels=("xla",))
  assert list(chosen["kernels"]) == ["xla"] and chosen["speedup"] == {"xla": 1.0}
  with pytest.raises(ValueError, match="attention kernels xla, flash: known are cudnn, "):
    attention_kernels.compare(cfg, _segmentation(), kernels=("xla", "flash"))


@pytest.mark.parametrize("row,runs", [([1, 1, 1, 1], 1), ([1, 1, 2, 0], 3), ([1, 2, 2, 3], 3)])
def test_runs_per_row_counts_the_padding_as_a_run(row, runs):
  assert attention_kernels.runs_per_row(np.asarray([row])).tolist() == [runs]
