"""The `synthetic` dataset (MaxText's semantics): one fixed random batch, forever.

It measures a train step with no data-loading cost: the batch is made once, already on the
devices, and every `next` returns the same arrays.
"""

from __future__ import annotations

import jax
import numpy as np

from maxtext_netdata.format import tokens as tk
from maxtext_netdata.input_pipeline.transforms import shift_data


class SyntheticIterator:
  """Returns the same global batch forever; the state is the number of batches returned."""

  def __init__(self, batch: dict[str, jax.Array]):
    self._batch = batch
    self._count = 0
    self.local_iterator = None

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, jax.Array]:
    self._count += 1
    return self._batch

  def get_state(self) -> dict:
    return {"count": self._count}

  def set_state(self, state: dict) -> None:
    self._count = int(state["count"])

  def close(self) -> None:
    pass


def host_batch(rows: int, seq_len: int, seed: int) -> dict[str, np.ndarray]:
  """Random tokens in one full segment per row, ShiftData applied (int32 [rows, seq_len])."""
  rng = np.random.default_rng(seed)
  return shift_data(
    {
      "inputs": rng.integers(0, tk.PAD, size=(rows, seq_len), dtype=np.int32),
      "inputs_segmentation": np.ones((rows, seq_len), dtype=np.int32),
      "inputs_position": np.tile(np.arange(seq_len, dtype=np.int32), (rows, 1)),
    }
  )
