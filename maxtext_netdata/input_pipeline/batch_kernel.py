"""The batch kernel: one compiled pass that writes a whole host batch from the store.

For each row of the batch it takes the row's contexts (plan contexts, then with packing the
fillers), and per context draws the mode, reads the candidate measurements from the store in
time order only while they fit, decides their timestamps, orders them, and writes their tokens,
segment ids and positions straight into the output arrays; with `shifted` it also writes the
targets of MaxText's ShiftData (docs/spec.md §4) from the finished row while it is in cache. Nothing
is gathered that does not fit, no intermediate array spans the batch, and padding is written
once, at the end of each row.

The semantics (docs/spec.md §3, every draw from `rng.py`'s counters) are those of the plain numpy
reference in tests/input_pipeline/reference_batches.py, which the tests compare it with; the
batches are bit-identical to those of the numpy builder this kernel replaced.

Compiled by numba with `cache=True`: the machine code is stored beside this file (or in
NUMBA_CACHE_DIR) on the first call ever, so later runs and spawned Grain workers load it
instead of compiling. Loading still sets up numba's compiler state in each new process (~0.5 s,
most of it numba's BLAS probe importing scipy.linalg); `load_in_background` starts that on a
thread so it overlaps the rest of start-up (store checks, JAX, the model's compile) instead of
delaying the first batch.
"""

from __future__ import annotations

import threading

import numba
import numpy as np

from maxtext_netdata.format import tokens as tk
from maxtext_netdata.format.tokenizer import PERMUTATIONS
from maxtext_netdata.input_pipeline import rng
from maxtext_netdata.kernels import kernel_cache

kernel_cache.install()  # the cache keyed on the token format's and rng's text too

FULL, PARTIAL, NONE = 0, 1, 2
FIELD_ORDERS = {"random": 0, "fixed": 1, "hashed": 2}

_TS_LENGTH = np.array(tk.TS_BLOCK_LENGTH, dtype=np.int64)
_FIELD_MASK = (1 << rng.FIELD_BITS) - 1
_FIELD_SCALE = 2.0**-rng.FIELD_BITS
_ORDER_SHIFT = 2 * rng.FIELD_BITS  # the random field order uses the bits above fields 0, 1
_B = tk.BYTE_OFFSET
_PAD = tk.PAD
_SHORTEST_V4 = tk.SHORTEST_MEASUREMENT[4]
_SHORTEST_V6 = tk.SHORTEST_MEASUREMENT[6]
_ADDRESS_V4 = tk.ADDRESS_BLOCK_LENGTH[4]
_ADDRESS_V6 = tk.ADDRESS_BLOCK_LENGTH[6]
_RESULT_OK = tk.RESULT_BLOCK_LENGTH[False]
_RESULT_FAILED = tk.RESULT_BLOCK_LENGTH[True]


@numba.njit(inline="always")
def _mix(key, counter):
  """rng.random_bits of one counter word (splitmix64; uint64 arithmetic wraps)."""
  z = (counter ^ key) + np.uint64(rng.GOLDEN)
  z = (z ^ (z >> np.uint64(30))) * np.uint64(rng.M1)
  z = (z ^ (z >> np.uint64(27))) * np.uint64(rng.M2)
  return z ^ (z >> np.uint64(31))


@numba.njit(inline="always")
def _counter(plan_row, context, index):
  if context >= rng.COUNTER_LIMIT or index >= rng.COUNTER_LIMIT:
    raise ValueError("batch kernel: a counter past its limit would repeat random draws")
  return (
    (np.uint64(plan_row) << np.uint64(2 * rng.COUNTER_BITS))
    | (np.uint64(context) << np.uint64(rng.COUNTER_BITS))
    | np.uint64(index)
  )


@numba.njit(inline="always")
def _fraction(bits, field):
  return np.float64((bits >> np.uint64(rng.FIELD_BITS * field)) & np.uint64(_FIELD_MASK)) * (
    _FIELD_SCALE
  )


@numba.njit(inline="always")
def _write_bytes(out, at, value, width):
  """`width` big-endian bytes of int64 `value` (two's complement) as byte tokens."""
  for b in range(width):
    out[at + b] = ((value >> (8 * (width - 1 - b))) & 0xFF) + _B
  return at + width


@numba.njit(cache=True, nogil=True)
def fill_batch(
  plan_rows,
  context_offsets,
  context_probe,
  context_start,
  context_end,
  probe_offsets,
  probe_version,
  probe_src,
  dst,
  seconds,
  rtt_bytes,
  failed,
  hashed_order,
  keys,
  mode_cdf,
  field_order,
  fillers,
  filler_rows,
  permutations,
  inputs,
  segmentation,
  position,
  targets,
  targets_segmentation,
  targets_position,
  shifted,
):
  """Writes the batch whose row r is plan row `plan_rows[r]` into the [rows, seq_len] outputs.

  keys: uint64 [3] stream keys of CONTEXT, MEASUREMENT and FILLER draws. mode_cdf: cumulative
  weights of full and partial. field_order: FIELD_ORDERS value. fillers, filler_rows: filler
  contexts per row (0 without packing) and their measurements. `hashed_order` is read only
  for the hashed field order (pass any uint8 [N, 2] store array otherwise). The three targets
  arrays are written only when `shifted` (pass the inputs arrays otherwise: never touched).
  """
  rows, seq_len = inputs.shape
  num_store_rows = seconds.shape[0]
  capacity = seq_len // _SHORTEST_V4 + 1  # measurements of one context, segments of a row
  lengths = np.empty(capacity, np.int64)
  kinds = np.empty(capacity, np.int64)
  values = np.empty(capacity, np.int64)
  draws = np.empty(capacity, np.uint64)
  stamped = np.empty(capacity, np.bool_)
  sort_keys = np.empty(capacity, np.float64)
  order = np.empty(capacity, np.int64)
  segment_start = np.empty(capacity, np.int64)
  segment_used = np.empty(capacity, np.int64)
  key_context, key_measurement, key_filler = keys[0], keys[1], keys[2]
  for r in range(rows):
    plan_row = plan_rows[r]
    row_inputs = inputs[r]
    first_context = context_offsets[plan_row]
    planned = context_offsets[plan_row + 1] - first_context
    room = seq_len
    segments = 0
    for k in range(planned + fillers):
      if k < planned:
        probe = context_probe[first_context + k]
        start = context_start[first_context + k]
        end = context_end[first_context + k]
        version = probe_version[probe]
        cap = seq_len // (_SHORTEST_V4 if version == 4 else _SHORTEST_V6)
      else:
        start = np.int64(_mix(key_filler, _counter(plan_row, k, 0)) % np.uint64(num_store_rows))
        probe = np.searchsorted(probe_offsets, start, side="right") - 1
        end = probe_offsets[probe + 1]
        version = probe_version[probe]
        cap = filler_rows
      address = _ADDRESS_V4 if version == 4 else _ADDRESS_V6
      if room < (_SHORTEST_V4 if version == 4 else _SHORTEST_V6):
        continue  # nothing of this context fits: it would take no measurement
      count = max(min(end - start, cap), 1)
      bits = _mix(key_context, _counter(plan_row, k, 0))
      f = _fraction(bits, 0)
      mode = (1 if f >= mode_cdf[0] else 0) + (1 if f >= mode_cdf[1] else 0)
      drop = 0.1 + 0.8 * _fraction(bits, 1)
      used = 0
      taken = 0
      dropped = 0
      have_clock = False
      clock = np.int64(0)
      for j in range(count):
        row = start + j
        bits = _mix(key_measurement, _counter(plan_row, k, j))
        if mode == FULL:
          has_ts = True
        elif mode == PARTIAL:
          has_ts = _fraction(bits, 0) >= drop
        else:
          has_ts = False
        kind = tk.TS_NONE
        value = np.int64(0)
        if has_ts:
          now = seconds[row]
          if not have_clock:
            kind = tk.TS_ABS
            value = now
          else:
            delta = max(now - clock, 0)
            kind = tk.TS_DELTA1 if delta <= 255 else tk.TS_DELTA4
            value = min(delta, tk.DELTA4_MAX)
          clock = now
          have_clock = True
        result = _RESULT_FAILED if failed[row] else _RESULT_OK
        length = 1 + 2 * address + result + _TS_LENGTH[kind]
        if used + length > room:
          break
        lengths[j] = length
        kinds[j] = kind
        values[j] = value
        draws[j] = bits
        stamped[j] = has_ts
        used += length
        taken += 1
        if not has_ts:
          dropped += 1
      if taken == 0:
        continue
      if mode == PARTIAL and dropped == 0:
        # Partial with no dropped timestamp: the last taken one loses its own (no other
        # measurement's timestamp changes; it only frees space).
        last = taken - 1
        used -= _TS_LENGTH[kinds[last]]
        lengths[last] -= _TS_LENGTH[kinds[last]]
        kinds[last] = tk.TS_NONE
        values[last] = 0
        stamped[last] = False
      # Sequence order: time order, except shuffled measurements (all of `none`, the
      # untimestamped ones of `partial`) at a drawn key; stable insertion sort.
      for j in range(taken):
        order[j] = j
        if mode == NONE or (mode == PARTIAL and not stamped[j]):
          sort_keys[j] = _fraction(draws[j], 1) * taken
        else:
          sort_keys[j] = j
      if mode != FULL:
        for j in range(1, taken):
          moving = order[j]
          moving_key = sort_keys[moving]
          i = j - 1
          while i >= 0 and sort_keys[order[i]] > moving_key:
            order[i + 1] = order[i]
            i -= 1
          order[i + 1] = moving
      offset = seq_len - room
      at = offset
      for i in range(taken):
        j = order[i]
        row = start + j
        if field_order == 0:
          permutation = np.int64(draws[j] >> np.uint64(_ORDER_SHIFT)) % 24
        elif field_order == 1:
          permutation = 0
        else:
          permutation = hashed_order[row, 1 if stamped[j] else 0]
          if permutation >= 24:  # read from disk: never index past the table
            raise ValueError("batch kernel: a hashed field order in the store is past 23")
        row_inputs[at] = tk.MEASUREMENT_START
        at += 1
        for block_index in range(4):
          block = permutations[permutation, block_index]
          if block == tk.BLOCK_SRC:
            row_inputs[at] = tk.SRC_IPV4 if version == 4 else tk.SRC_IPV6
            for b in range(address - 1):
              row_inputs[at + 1 + b] = probe_src[probe, b] + _B
            at += address
          elif block == tk.BLOCK_DST:
            row_inputs[at] = tk.DST_IPV4 if version == 4 else tk.DST_IPV6
            for b in range(address - 1):
              row_inputs[at + 1 + b] = dst[row, b] + _B
            at += address
          elif block == tk.BLOCK_RESULT:
            if failed[row]:
              row_inputs[at] = tk.FAILED
              at += 1
            else:
              row_inputs[at] = tk.RTT_START
              row_inputs[at + 1] = rtt_bytes[row, 0] + _B
              row_inputs[at + 2] = rtt_bytes[row, 1] + _B
              at += 3
          else:
            kind = kinds[j]
            if kind == tk.TS_ABS:
              row_inputs[at] = tk.TIMESTAMP_ABS
              at = _write_bytes(row_inputs, at + 1, values[j], 8)
            elif kind == tk.TS_DELTA1:
              row_inputs[at] = tk.TIMESTAMP_DELTA1
              at = _write_bytes(row_inputs, at + 1, values[j], 1)
            elif kind == tk.TS_DELTA4:
              row_inputs[at] = tk.TIMESTAMP_DELTA4
              at = _write_bytes(row_inputs, at + 1, values[j], 4)
      segment_start[segments] = offset
      segment_used[segments] = used
      segments += 1
      room -= used
    _finish_row(
      row_inputs,
      segmentation[r],
      position[r],
      targets[r],
      targets_segmentation[r],
      targets_position[r],
      segment_start,
      segment_used,
      segments,
      seq_len - room,
      shifted,
    )


@numba.njit(inline="always")
def _finish_row(
  inputs, segmentation, position, targets, targets_segmentation, targets_position,
  segment_start, segment_used, segments, filled, shifted,
):  # fmt: skip
  """Padding after `filled`, segment ids 1..k and positions; the shifted targets if asked."""
  seq_len = inputs.shape[0]
  for s in range(segments):
    start = segment_start[s]
    for t in range(segment_used[s]):
      segmentation[start + t] = s + 1
      position[start + t] = t
  for t in range(filled, seq_len):
    inputs[t] = _PAD
    segmentation[t] = 0
    position[t] = 0
  if shifted:
    _shift_row(inputs, segmentation, position, targets, targets_segmentation, targets_position)


@numba.njit(inline="always")
def _shift_row(inputs, segmentation, position, targets, targets_segmentation, targets_position):
  """ShiftData of one row: targets[t] = inputs[t + 1] (PAD last), their segment id (0 where
  the target is PAD), positions unchanged."""
  seq_len = inputs.shape[0]
  for t in range(seq_len - 1):
    token = inputs[t + 1]
    targets[t] = token
    targets_segmentation[t] = 0 if token == _PAD else segmentation[t + 1]
    targets_position[t] = position[t]
  targets[seq_len - 1] = _PAD
  targets_segmentation[seq_len - 1] = 0
  targets_position[seq_len - 1] = position[seq_len - 1]


@numba.njit(cache=True, nogil=True)
def shift(inputs, segmentation, position, targets, targets_segmentation, targets_position):
  """ShiftData of a [rows, seq_len] batch whose targets equal its inputs, in one pass that
  writes the three targets arrays."""
  for r in range(inputs.shape[0]):
    _shift_row(
      inputs[r], segmentation[r], position[r], targets[r], targets_segmentation[r],
      targets_position[r],
    )  # fmt: skip


# XLA's CPU client aliases a host array instead of copying it only at this alignment; numpy's
# allocator gives 16 bytes (measured: to_global of a 256 x 1024 batch 1.8 ms against 2.4 ms).
OUTPUT_ALIGNMENT = 64


def empty_output(shape: tuple[int, int]) -> np.ndarray:
  """An uninitialized int32 array of `shape` whose data starts on OUTPUT_ALIGNMENT bytes."""
  size = shape[0] * shape[1] * 4
  raw = np.empty(size + OUTPUT_ALIGNMENT, dtype=np.uint8)
  start = -raw.ctypes.data % OUTPUT_ALIGNMENT
  return raw[start : start + size].view(np.int32).reshape(shape)


@numba.njit(cache=True, nogil=True)
def _loaded():
  return 0


_loading: list[threading.Thread] = []
_loading_lock = threading.Lock()


def load_in_background() -> None:
  """Starts (once per process) loading a cached kernel on a daemon thread: numba sets up its
  compiler state, which every kernel's first call needs; a kernel called meanwhile waits for
  it under numba's compiler lock."""
  with _loading_lock:
    if not _loading:
      _loading.append(threading.Thread(target=_loaded, name="batch-kernel-load", daemon=True))
      _loading[0].start()


def permutations() -> np.ndarray:
  """The field-order table the kernel reads (tokenizer.PERMUTATIONS, int64)."""
  return PERMUTATIONS.astype(np.int64)
