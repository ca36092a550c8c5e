"""Changes to MaxText that the bench tests measure with `bench --maxtext --loop-hook`.

Imported by name in every bench process (the tests put this folder on PYTHONPATH).
"""

from __future__ import annotations

import functools
import time

import grain.python as grain

# Seconds of host work after each real-data step: below the test model's step (0.15 s on a quiet
# 2-core host), so without the forced read it would overlap the next step and cost nothing; with
# it, well above what a loaded host adds to a step (0.04 s here left the verdict to chance with
# the suite's other worker busy: real steps measured faster than a reference step taken at a
# busier moment).
LOG_S = 0.1
# Seconds a loader map sleeps per batch: far above the test model's step.
SLOW_MAP_S = 0.25


class _Sleep:
  """A Grain map that sleeps, then passes the batch on."""

  def __call__(self, batch):
    time.sleep(SLOW_MAP_S)
    return batch


def slow_loader() -> None:
  """MaxText's grain pipeline with a sleeping map before its workers."""
  from maxtext.input_pipeline import data_processing_utils

  original = data_processing_utils.apply_multiprocessing_and_prefetch

  @functools.wraps(original)
  def apply(dataset, *args, **kwargs):
    return original(dataset.map(_Sleep()), *args, **kwargs)

  data_processing_utils.apply_multiprocessing_and_prefetch = apply


class _SleepMap(grain.MapTransform):
  """`_Sleep` as the operation a `grain.DataLoader` takes."""

  def map(self, element):
    return _Sleep()(element)


def slow_hf_loader() -> None:
  """MaxText's hf pipeline (a `grain.DataLoader`) with a sleeping map after its batching."""
  original = grain.DataLoader.__init__
  if getattr(original, "_slow", False):
    return

  @functools.wraps(original)
  def init(self, *args, operations=(), **kwargs):
    original(self, *args, operations=[*operations, _SleepMap()], **kwargs)

  init._slow = True
  grain.DataLoader.__init__ = init


def sync_each_real_step() -> None:
  """MaxText's loop reading each real-data step's loss on the host at once (a forced
  synchronization), then logging for LOG_S while the device has nothing queued."""
  from maxtext.common import metric_logger

  logger = metric_logger.MetricLogger
  original = logger.buffer_and_write_metrics

  @functools.wraps(original)
  def buffer_and_write_metrics(self, metrics, step, step_time_delta=None, is_training=True):
    kind = str(getattr(self.config.dataset_type, "value", self.config.dataset_type))
    if is_training and metrics and kind != "synthetic":
      float(metrics["scalar"]["learning/loss"])
      time.sleep(LOG_S)
    return original(self, metrics, step, step_time_delta, is_training)

  logger.buffer_and_write_metrics = buffer_and_write_metrics
