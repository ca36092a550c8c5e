"""The batch kernel's arguments (`batch_kernel.fill_batch`), each a named tuple that callers
pass as a plain one (`tuple(named)`: numba types a plain tuple in its C dispatcher) and the
kernel names again: the store's arrays, the epoch plan, the settings of an epoch's batches,
and the output arrays."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class StoreColumns(NamedTuple):
  """The prepared store's arrays the kernel reads (`data.store`), as plain ndarrays."""

  probe_offsets: np.ndarray  # int64 [P + 1]: probe p's rows are [offsets[p], offsets[p + 1])
  probe_version: np.ndarray  # uint8 [P]: 4 or 6
  probe_src: np.ndarray  # uint8 [P, 16]
  dst_table: np.ndarray  # uint8 [D, 16]
  dst_index: np.ndarray  # uint32 [N]: row r's destination is dst_table[dst_index[r]]
  seconds: np.ndarray  # uint32 [N]: Unix seconds
  rtt_bytes: np.ndarray  # uint8 [N, 2]; 0, 0: a failed ping
  hashed_order: np.ndarray  # uint8 [N, 2]; read only for the hashed field order (else any)


class Plan(NamedTuple):
  """An epoch plan (`epoch_plan.EpochPlan`, its `kernel_plan`): the long plan rows by probe,
  the short ones' contexts, and the order of the plan rows in the stream (`plan_order`)."""

  long_first: np.ndarray  # int64 [P + 1]: probe p's long plan rows [long_first[p], ...[p + 1])
  long_start: np.ndarray  # int64 [P]: store row of probe p's first long piece
  stride: np.ndarray  # int64 [P]
  short_offsets: np.ndarray  # int64 [S + 1]: short plan row j's contexts
  short_probe: np.ndarray  # int64 [C]
  short_start: np.ndarray  # int64 [C]
  short_end: np.ndarray  # int64 [C]
  order_keys: np.ndarray  # uint64: `plan_order.row_at`'s arguments
  short_position: np.ndarray  # int64
  short_by_position: np.ndarray  # int64
  num_long: int
  num_rows: int


class Settings(NamedTuple):
  """What a builder draws and writes with, the same for every batch of an epoch."""

  keys: np.ndarray  # uint64 [3]: stream keys of CONTEXT, MEASUREMENT and FILLER draws
  mode_cdf: np.ndarray  # float64 [2]: cumulative weights of full and partial
  field_order: int  # a `batch_kernel.FIELD_ORDERS` value
  fillers: int  # filler contexts each row tries after its own (0 without packing)
  filler_rows: int  # measurements of a filler context at most
  permutations: np.ndarray  # int64 [24, 4]: field orders (`batch_kernel.permutations()`)


class Outputs(NamedTuple):
  """The int32 [rows, seq_len] arrays of a batch (the six of sequences.KEYS, in order)."""

  inputs: np.ndarray
  segmentation: np.ndarray
  position: np.ndarray
  targets: np.ndarray
  targets_segmentation: np.ndarray
  targets_position: np.ndarray
