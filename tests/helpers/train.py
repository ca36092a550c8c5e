"""A small deterministic batch source for trainer tests, independent of the data pipeline.

Batch i is a pure function of (seed, i): packed segments of arithmetic token sequences
(each next token is the previous plus a per-segment stride), so a model can learn them, and
the stride is only visible from context. Batches go through MaxText's ShiftData rules.
"""

from __future__ import annotations

import jax
import numpy as np

from maxtext_netdata.distributed.mesh import batch_sharding
from maxtext_netdata.format import tokens


def shift_data(inputs: np.ndarray, segmentation: np.ndarray, positions: np.ndarray) -> dict:
  targets = np.concatenate([inputs[:, 1:], np.full_like(inputs[:, :1], tokens.PAD)], axis=1)
  targets_segmentation = np.concatenate(
    [segmentation[:, 1:], np.zeros_like(segmentation[:, :1])], axis=1
  )
  targets_segmentation[targets == tokens.PAD] = 0
  return {
    "inputs": inputs,
    "inputs_segmentation": segmentation,
    "inputs_position": positions,
    "targets": targets,
    "targets_segmentation": targets_segmentation,
    "targets_position": positions,
  }


def make_host_batch(seed: int, index: int, batch: int, length: int) -> dict[str, np.ndarray]:
  rng = np.random.default_rng([seed, index])
  inputs = np.full((batch, length), tokens.PAD, np.int32)
  segmentation = np.zeros((batch, length), np.int32)
  positions = np.zeros((batch, length), np.int32)
  for row in range(batch):
    start, segment = 0, 1
    while start < length - 8:
      size = int(rng.integers(8, length // 2))
      size = min(size, length - start - int(rng.integers(0, 4)))
      stride = int(rng.integers(1, 6))
      first = int(rng.integers(0, 256))
      inputs[row, start : start + size] = (
        tokens.BYTE_OFFSET + (first + stride * np.arange(size)) % 256
      )
      segmentation[row, start : start + size] = segment
      positions[row, start : start + size] = np.arange(size)
      start += size
      segment += 1
  return shift_data(inputs, segmentation, positions)


class IndexedBatches:
  """Global batches on the mesh; `get_state()`/`set_state()` like the pipeline's iterator."""

  def __init__(self, config, mesh, seed: int = 0):
    self._seed = seed
    self._batch = config.global_batch_size(mesh.size)
    self._length = config.max_target_length
    self._sharding = batch_sharding(config, mesh)
    self._index = 0

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, jax.Array]:
    host = make_host_batch(self._seed, self._index, self._batch, self._length)
    self._index += 1
    return {name: jax.device_put(array, self._sharding) for name, array in host.items()}

  def get_state(self) -> dict:
    return {"index": self._index}

  def set_state(self, state: dict) -> None:
    self._index = state["index"]
