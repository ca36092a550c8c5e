"""The metrics patch: each MaxText training step's scalars gain our data figures.

`MetricLogger.buffer_and_write_metrics` adds `perf/data_wait_seconds` (time the step waited
for its batch) and `learning/padding_fraction` (share of this host's target slots that are
padding) to every training step's scalars, so they reach TensorBoard and `metrics_file`. The
network_grain train iterator (`patch_data`) records both into `TRAIN_FEED` as it hands MaxText
each batch.
"""

from __future__ import annotations

import functools

import numpy as np

# What install() patches: (module, attribute).
REQUIRED = (("maxtext.common.metric_logger", "MetricLogger"),)


class Feed:
  """The latest batch a network_grain train iterator handed to MaxText, for its metrics."""

  data_wait_s: float | None = None
  padding_fraction: float | None = None

  def record(self, data_wait_s: float, targets_segmentation: np.ndarray) -> None:
    """One batch: seconds `next` took, and this host's target rows (0 is padding)."""
    self.data_wait_s = data_wait_s
    padding = np.count_nonzero(targets_segmentation == 0)
    self.padding_fraction = float(padding / targets_segmentation.size)


TRAIN_FEED = Feed()


def _make_buffer_and_write_metrics(original):
  @functools.wraps(original)
  def buffer_and_write_metrics(self, metrics, step, step_time_delta=None, is_training=True):
    if is_training and metrics and TRAIN_FEED.data_wait_s is not None:
      metrics["scalar"]["perf/data_wait_seconds"] = TRAIN_FEED.data_wait_s
      metrics["scalar"]["learning/padding_fraction"] = TRAIN_FEED.padding_fraction
    return original(self, metrics, step, step_time_delta, is_training)

  return buffer_and_write_metrics


def install(metric_logger) -> None:
  """Adds the `TRAIN_FEED` scalars to `metric_logger.MetricLogger`'s training metrics."""
  logger = metric_logger.MetricLogger
  logger.buffer_and_write_metrics = _make_buffer_and_write_metrics(logger.buffer_and_write_metrics)
