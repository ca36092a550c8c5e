"""Per-batch transformations applied after a host batch is built."""

from __future__ import annotations

import grain
import numpy as np

from maxtext_netdata.format import tokens as tk
from maxtext_netdata.input_pipeline import batch_kernel, buffers


def _shift_left(x: np.ndarray, fill: int) -> np.ndarray:
  out = np.empty_like(x)
  out[:, :-1] = x[:, 1:]
  out[:, -1] = fill
  return out


INPUT_KEYS = ("inputs", "inputs_segmentation", "inputs_position")
TARGET_KEYS = ("targets", "targets_segmentation", "targets_position")


def _kernel_shapes(batch: dict[str, np.ndarray]) -> bool:
  """Whether the inputs arrays are what the kernel takes: int32, 2-D, one shape, C order."""
  arrays = [batch[key] for key in INPUT_KEYS]
  shape = arrays[0].shape
  return all(
    a.dtype == np.int32 and a.ndim == 2 and a.shape == shape and a.flags.c_contiguous
    for a in arrays
  )


def shift_data(
  batch: dict[str, np.ndarray], pool: buffers.OutputPool | None = None
) -> dict[str, np.ndarray]:
  """MaxText's ShiftData (docs/spec.md §4) on a host batch of [rows, seq_len] arrays.

  `targets` shifted left by one with PAD last; `targets_segmentation` shifted left with 0
  last, then 0 wherever the new target is PAD, so the loss mask `targets_segmentation != 0`
  covers every real next token (MEASUREMENT_START included) and no padding. `inputs*` and
  `targets_position` are unchanged. A batch of only the three `inputs*` arrays (as
  `BatchBuilder.build` makes them) gets its targets from them first: targets = inputs.
  Returns a new dict of the six arrays; the input arrays are not modified. The kernel's
  targets arrays come from `pool` when given (reused once released), else fresh.
  """
  if "targets" not in batch and _kernel_shapes(batch):
    # The usual case (workers send the inputs arrays): one compiled pass, not five.
    out = {key: batch[key] for key in INPUT_KEYS}
    shape = batch["inputs"].shape
    if pool is None:
      targets = [batch_kernel.empty_output(shape) for _ in TARGET_KEYS]
    else:
      targets = pool.take(shape, len(TARGET_KEYS))
    out.update(zip(TARGET_KEYS, targets, strict=True))
    batch_kernel.shift(*(out[key] for key in (*INPUT_KEYS, *TARGET_KEYS)))
    return out
  targets = _shift_left(batch.get("targets", batch["inputs"]), tk.PAD)
  segmentation = _shift_left(batch.get("targets_segmentation", batch["inputs_segmentation"]), 0)
  np.copyto(segmentation, 0, where=targets == tk.PAD)
  position = batch.get("targets_position")
  return {
    "inputs": batch["inputs"],
    "inputs_segmentation": batch["inputs_segmentation"],
    "inputs_position": batch["inputs_position"],
    "targets": targets,
    "targets_segmentation": segmentation,
    "targets_position": batch["inputs_position"].copy() if position is None else position,
  }


class ShiftData(grain.transforms.Map):
  """`shift_data` as a Grain map transformation, in reused buffers, after `mp_prefetch`.

  Worker processes hand each batch over in /dev/shm blocks (Grain's `SharedMemoryArray`),
  which Grain unlinks when their array is garbage, on a thread of its own. The inputs are
  copied into our buffers here (0.02-0.03 ms for 32-64 x 1024), so a batch's blocks are released as
  it arrives: a batch the consumer still held when the process exited would otherwise leave
  its blocks to Python's resource tracker ("leaked shared_memory objects" at exit).
  """

  def __init__(self):
    self._buffers = buffers.OutputPool()
    self._inputs = buffers.OutputPool()

  def map(self, element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if _kernel_shapes(element):
      owned = dict(zip(INPUT_KEYS, self._inputs.take(element["inputs"].shape, 3), strict=True))
      for key in INPUT_KEYS:
        np.copyto(owned[key], element[key])
    else:
      owned = {key: np.array(value) for key, value in element.items()}
    del element  # the last reference to its /dev/shm blocks: Grain unlinks them now
    return shift_data(owned, self._buffers)
