"""`network_splits`: what the network_grain iterators load, for our pipeline and MaxText's.

One definition of the store both consumers prepare and of each split's batches: how many
steps, which rows make a global batch, which split loads in-process. `interface` places a
split's host batches into global arrays with our sharding; the MaxText plugin hands them to
MaxText's multi-host iterator. Only where the rows of each process come from differs.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

from maxtext_netdata.config import Config
from maxtext_netdata.errors import DataError
from maxtext_netdata.input_pipeline import network_grain, shared_store
from maxtext_netdata.input_pipeline.sequences import BatchBuilder


class SplitBatches(NamedTuple):
  """One split's global batches: `host_batches(lo, hi)` is one process's rows of them."""

  config: Config
  builder: BatchBuilder
  num_steps: int | None
  split: str

  def host_batches(self, lo: int, hi: int) -> network_grain.HostBatchIterator:
    """Rows [lo, hi) of each global batch, from step 0.

    Eval loads in-process: a few batches per eval, and every eval restarts the iterator,
    which would restart worker processes.
    """
    return network_grain.HostBatchIterator(
      self.config,
      self.builder,
      lo,
      hi,
      self.num_steps,
      split=self.split,
      in_process=self.split != "train",
    )


def network_splits(
  config: Config,
  *,
  train_rows: int,
  eval_rows: int | None,
  eval_steps: int,
  eval_required: bool,
) -> tuple[SplitBatches, SplitBatches | None]:
  """(train, eval or None) of the prepared store of `config`. A collective.

  Process 0 prepares the store first; every process then checks it holds process 0's
  (`shared_store`). Train is `config.num_epoch` epochs of global batches of `train_rows`
  sequences. Eval is one pass over the eval split in global batches of `eval_rows`, at most
  `eval_steps` of them (no cap when `eval_steps` <= 0); `eval_rows` None is no eval.

  Args:
    eval_required: an eval split that gives no batch is an error (MaxText asserts an eval
      iterator when it evaluates); without it there is no eval, with a note on stderr when
      the split has rows but fewer than one batch.

  Raises:
    DataError: the train split (or a required eval split) holds less than one global batch.
  """
  splits = shared_store.prepare_shared_store(config)
  builder = BatchBuilder.from_config(config, splits.train, train_rows)
  train = SplitBatches(config, builder, builder.num_steps, "train")
  if eval_rows is None or not (eval_required or splits.eval.num_rows):
    return train, None
  builder = BatchBuilder.from_config(config, splits.eval, eval_rows, num_epoch=1)
  try:
    steps = builder.steps_per_epoch
  except DataError as e:
    if eval_required:
      raise
    print(f"input pipeline: no eval batches: {e}", file=sys.stderr)
    return train, None
  if eval_steps > 0:
    steps = min(steps, eval_steps)
  return train, SplitBatches(config, builder, steps, "eval")
