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
most of it numba's BLAS probe importing scipy.linalg); `batch_kernel_loading` starts that
on a thread so it overlaps the rest of start-up (store checks, JAX, the model's compile) instead of
delaying the first batch; there a builder also calls the kernel on a batch of no rows with its
own argument types, so that a machine's first run compiles it (~6 s, more on a busy machine)
behind that start-up too. Until that thread is done, builders take the kernel's own Python
code: the same batches, ~200-300x slower, but at once, so no first batch waits for the
compile (`maxtext-netdata batches` on a new machine: first batch 8.2 s before, 1.5 s after).
Which of the two runs, and the load thread, are `batch_kernel_loading`'s.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from maxtext_netdata.format import tokens as tk
from maxtext_netdata.format.tokenizer import PERMUTATIONS
from maxtext_netdata.input_pipeline import rng
from maxtext_netdata.input_pipeline.kernel_args import Outputs, Plan, Settings, StoreColumns
from maxtext_netdata.input_pipeline.plan_order import row_at
from maxtext_netdata.kernels import kernel_cache

kernel_cache.install()  # the cache keyed on the token format's and rng's text too

FULL, PARTIAL, NONE = 0, 1, 2
FIELD_ORDERS = {"random": 0, "fixed": 1, "hashed": 2}

_TS_LENGTH = np.array(tk.TS_BLOCK_LENGTH, dtype=np.int64)
_FIELD_MASK = (1 << rng.FIELD_BITS) - 1
_FIELD_SCALE = 2.0**-rng.FIELD_BITS
_ORDER_SHIFT = 2 * rng.FIELD_BITS  # the random field order uses the bits above fields 0, 1
_B = np.int64(tk.BYTE_OFFSET)  # int64: a uint8 store byte plus it never wraps, compiled or not
_PAD = tk.PAD
_SHORTEST_V4 = tk.SHORTEST_MEASUREMENT[4]
_SHORTEST_V6 = tk.SHORTEST_MEASUREMENT[6]
_ADDRESS_V4 = tk.ADDRESS_BLOCK_LENGTH[4]
_ADDRESS_V6 = tk.ADDRESS_BLOCK_LENGTH[6]
_RESULT_OK = tk.RESULT_BLOCK_LENGTH[False]
_RESULT_FAILED = tk.RESULT_BLOCK_LENGTH[True]

# The four scalar helpers below (`_mix`, `_counter`, `_fraction`, `_write_bytes`) are plain
# calls, which LLVM inlines; the helpers that read the named tuples stay `inline="always"`.
# numba inlines its IR at each of the 14 call sites of the scalar ones, re-running its
# front end per site: that was over half of a first compile (inline pass 8.1 of 14.3 s on a
# busy 2-core machine, 4.5 of 11.1 s without it), for no measured gain in the pass
# (64 x 1024 shifted, ~0.9-1.2 ms a batch either way). Un-inlining the tuple helpers too
# saved another ~1 s of compile but made the pass ~2x slower (their tuples are passed whole).


@numba.njit
def _mix(key, counter):
  """rng.random_bits of one counter word (splitmix64; uint64 arithmetic wraps)."""
  z = (counter ^ key) + np.uint64(rng.GOLDEN)
  z = (z ^ (z >> np.uint64(30))) * np.uint64(rng.M1)
  z = (z ^ (z >> np.uint64(27))) * np.uint64(rng.M2)
  return z ^ (z >> np.uint64(31))


@numba.njit
def _counter(plan_row, context, index):
  if context >= rng.COUNTER_LIMIT or index >= rng.COUNTER_LIMIT:
    raise ValueError("batch kernel: a counter past its limit would repeat random draws")
  return (
    (np.uint64(plan_row) << np.uint64(2 * rng.COUNTER_BITS))
    | (np.uint64(context) << np.uint64(rng.COUNTER_BITS))
    | np.uint64(index)
  )


@numba.njit
def _fraction(bits, field):
  return np.float64((bits >> np.uint64(rng.FIELD_BITS * field)) & np.uint64(_FIELD_MASK)) * (
    _FIELD_SCALE
  )


@numba.njit
def _write_bytes(out, at, value, width):
  """`width` big-endian bytes of int64 `value` (two's complement) as byte tokens."""
  for b in range(width):
    out[at + b] = ((value >> (8 * (width - 1 - b))) & 0xFF) + _B
  return at + width


class _Taken(NamedTuple):
  """One context's measurements while its row is written, by index in the context: token
  length, timestamp kind and value, random bits, whether stamped; then the write order."""

  lengths: np.ndarray  # int64
  kinds: np.ndarray  # int64: TS_* kind
  values: np.ndarray  # int64: the timestamp block's value
  draws: np.ndarray  # uint64: the measurement's random bits
  stamped: np.ndarray  # bool
  sort_keys: np.ndarray  # float64
  order: np.ndarray  # int64: index of the measurement written i-th


@numba.njit(cache=True, nogil=True)
def fill_batch(positions, plan, store, settings, out, shifted):
  """Writes the batch whose row r is the plan row at stream position `positions[r]` of the
  epoch (`plan_order.row_at`) into `out` (`Outputs`' fields).

  plan, store, settings, out: the fields of `Plan`, `StoreColumns`, `Settings` and
  `Outputs` as plain tuples (`tuple(named)`), named again here. numba types a plain tuple's
  arguments in its C dispatcher and a named tuple's in Python: the named ones cost ~10 µs a
  call, as much as the pass over a small batch. The three targets arrays of `out` are
  written only when `shifted` (pass the inputs arrays there otherwise: never touched).
  """
  plan, store = Plan(*plan), StoreColumns(*store)
  settings, out = Settings(*settings), Outputs(*out)
  seq_len = out.inputs.shape[1]
  capacity = seq_len // _SHORTEST_V4 + 1  # measurements of one context, segments of a row
  taken = _Taken(
    np.empty(capacity, np.int64),
    np.empty(capacity, np.int64),
    np.empty(capacity, np.int64),
    np.empty(capacity, np.uint64),
    np.empty(capacity, np.bool_),
    np.empty(capacity, np.float64),
    np.empty(capacity, np.int64),
  )
  segment_start = np.empty(capacity, np.int64)
  segment_used = np.empty(capacity, np.int64)
  _fill_rows(positions, plan, store, settings, out, shifted, taken, segment_start, segment_used)


@numba.njit(_nrt=False)
def _fill_rows(positions, plan, store, settings, out, shifted, taken, segment_start, segment_used):
  """`fill_batch`'s pass over the rows, with its scratch arrays.

  Compiled without numba's reference counting, as it allocates nothing: with it, every read of
  an array from one of the named tuples counted a reference to it with two atomic calls, which
  made the pass 3.5x slower than passing each array on its own (measured at 8 x 1024).
  """
  for r in range(positions.shape[0]):
    plan_row = row_at(*plan[7:], positions[r])  # the order's fields
    filled, segments = _fill_row(
      out.inputs[r], plan_row, plan, store, settings, taken, segment_start, segment_used
    )
    _finish_row(out, r, segment_start, segment_used, segments, filled, shifted)


@numba.njit(inline="always")
def _fill_row(row_inputs, plan_row, plan, store, settings, taken, segment_start, segment_used):
  """Writes plan row `plan_row`'s contexts, then the fillers, into `row_inputs`, each as one
  segment while it fits: (tokens written, segments), each segment's start and length in
  `segment_start`, `segment_used`."""
  seq_len = row_inputs.shape[0]
  if plan_row < plan.num_long:  # one context, from its piece's start to the probe's end
    long_probe = np.searchsorted(plan.long_first, plan_row, side="right") - 1
    long_start = plan.long_start[long_probe]
    long_start += (plan_row - plan.long_first[long_probe]) * plan.stride[long_probe]
    first_context, planned = 0, 1
  else:
    long_probe, long_start = -1, -1
    first_context = plan.short_offsets[plan_row - plan.num_long]
    planned = plan.short_offsets[plan_row - plan.num_long + 1] - first_context
  room = seq_len
  segments = 0
  for k in range(planned + settings.fillers):
    if k < planned:
      if long_probe >= 0:
        probe, start, end = long_probe, long_start, store.probe_offsets[long_probe + 1]
      else:
        probe = plan.short_probe[first_context + k]
        start = plan.short_start[first_context + k]
        end = plan.short_end[first_context + k]
      version = store.probe_version[probe]
      cap = seq_len // (_SHORTEST_V4 if version == 4 else _SHORTEST_V6)
    else:
      probe, start, end = _filler(store, settings.keys[2], plan_row, k)
      version = store.probe_version[probe]
      cap = settings.filler_rows
    if room < (_SHORTEST_V4 if version == 4 else _SHORTEST_V6):
      continue  # nothing of this context fits: it would take no measurement
    offset = seq_len - room
    used = _write_context(
      row_inputs, offset, room, plan_row, k, probe, start, end, version, cap, store, settings, taken
    )
    if used == 0:
      continue
    segment_start[segments] = offset
    segment_used[segments] = used
    segments += 1
    room -= used
  return seq_len - room, segments


@numba.njit(inline="always")
def _filler(store, key_filler, plan_row, k):
  """(probe, start, end) of filler context `k`: the store rows from a random one to the end
  of its probe."""
  num_store_rows = store.seconds.shape[0]
  start = np.int64(_mix(key_filler, _counter(plan_row, k, 0)) % np.uint64(num_store_rows))
  probe = np.searchsorted(store.probe_offsets, start, side="right") - 1
  return probe, start, store.probe_offsets[probe + 1]


@numba.njit(inline="always")
def _write_context(
  row_inputs, offset, room, plan_row, k, probe, start, end, version, cap, store, settings, taken
):
  """Writes context `k` of the row (store rows from `start`, before `end`, at most `cap`) at
  `offset`, in at most `room` tokens: its mode, the measurements that fit, their timestamps,
  order and field orders. Returns the tokens written (0: no measurement fits).

  Inlined like the other helpers: as a call it made the pass ~5% slower at 64x1024 (0.32
  against 0.30 ms a batch, three alternations), for a first compile ~1 s shorter.
  """
  count = max(min(end - start, cap), 1)
  bits = _mix(settings.keys[0], _counter(plan_row, k, 0))
  f = _fraction(bits, 0)
  mode = (1 if f >= settings.mode_cdf[0] else 0) + (1 if f >= settings.mode_cdf[1] else 0)
  drop = 0.1 + 0.8 * _fraction(bits, 1)
  address = _ADDRESS_V4 if version == 4 else _ADDRESS_V6
  count, used, dropped = _take(
    plan_row, k, start, count, mode, drop, address, room, store, settings.keys[1], taken
  )
  if count == 0:
    return 0
  if mode == PARTIAL and dropped == 0:
    # Partial with no dropped timestamp: the last taken one loses its own (no other
    # measurement's timestamp changes; it only frees space).
    last = count - 1
    used -= _TS_LENGTH[taken.kinds[last]]
    taken.lengths[last] -= _TS_LENGTH[taken.kinds[last]]
    taken.kinds[last] = tk.TS_NONE
    taken.values[last] = 0
    taken.stamped[last] = False
  _order(mode, count, taken)
  at = offset
  for i in range(count):
    j = taken.order[i]
    row = start + j
    if settings.field_order == 0:
      permutation = np.int64(taken.draws[j] >> np.uint64(_ORDER_SHIFT)) % 24
    elif settings.field_order == 1:
      permutation = 0
    else:
      permutation = store.hashed_order[row, 1 if taken.stamped[j] else 0]
      if permutation >= 24:  # read from disk: never index past the table
        raise ValueError("batch kernel: a hashed field order in the store is past 23")
    row_inputs[at] = tk.MEASUREMENT_START
    at += 1
    for block_index in range(4):
      block = settings.permutations[permutation, block_index]
      at = _write_block(row_inputs, at, block, version, address, probe, row, j, store, taken)
  return used


@numba.njit(inline="always")
def _take(plan_row, k, start, count, mode, drop, address, room, store, key_measurement, taken):
  """Decides, in time order, each of the first `count` measurements' timestamp (by `mode`:
  all, those not dropped with probability `drop`, none) and length, and takes them while they
  fit in `room`. Returns (measurements taken, their tokens, how many have no timestamp)."""
  used = 0
  count_taken = 0
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
      now = np.int64(store.seconds[row])  # uint32 in the store
      if not have_clock:
        kind = tk.TS_ABS
        value = now
      else:
        delta = max(now - clock, 0)
        kind = tk.TS_DELTA1 if delta <= 255 else tk.TS_DELTA4
        value = min(delta, tk.DELTA4_MAX)
      clock = now
      have_clock = True
    result = _RESULT_FAILED if _failed(store, row) else _RESULT_OK
    length = 1 + 2 * address + result + _TS_LENGTH[kind]
    if used + length > room:
      break
    taken.lengths[j] = length
    taken.kinds[j] = kind
    taken.values[j] = value
    taken.draws[j] = bits
    taken.stamped[j] = has_ts
    used += length
    count_taken += 1
    if not has_ts:
      dropped += 1
  return count_taken, used, dropped


@numba.njit(inline="always")
def _failed(store, row):
  """Whether store row `row` is a failed ping: its RTT payload is 0, 0 (`store.failed_of`)."""
  return store.rtt_bytes[row, 0] == 0 and store.rtt_bytes[row, 1] == 0


@numba.njit(inline="always")
def _order(mode, count, taken):
  """`taken.order`: time order, except shuffled measurements (all of `none`, the
  untimestamped ones of `partial`) at a drawn key; a stable insertion sort."""
  for j in range(count):
    taken.order[j] = j
    if mode == NONE or (mode == PARTIAL and not taken.stamped[j]):
      taken.sort_keys[j] = _fraction(taken.draws[j], 1) * count
    else:
      taken.sort_keys[j] = j
  if mode != FULL:
    for j in range(1, count):
      moving = taken.order[j]
      moving_key = taken.sort_keys[moving]
      i = j - 1
      while i >= 0 and taken.sort_keys[taken.order[i]] > moving_key:
        taken.order[i + 1] = taken.order[i]
        i -= 1
      taken.order[i + 1] = moving


@numba.njit(inline="always")
def _write_block(row_inputs, at, block, version, address, probe, row, j, store, taken):
  """Writes field block `block` (tk.BLOCK_*) of store row `row`, the context's measurement
  `j`, at `at`: returns the position after it."""
  if block == tk.BLOCK_SRC:
    row_inputs[at] = tk.SRC_IPV4 if version == 4 else tk.SRC_IPV6
    for b in range(address - 1):
      row_inputs[at + 1 + b] = store.probe_src[probe, b] + _B
    return at + address
  if block == tk.BLOCK_DST:
    row_inputs[at] = tk.DST_IPV4 if version == 4 else tk.DST_IPV6
    destination = store.dst_index[row]
    if destination >= store.dst_table.shape[0]:  # read from disk: never index past the table
      raise ValueError("batch kernel: a destination index in the store is past its table")
    for b in range(address - 1):
      row_inputs[at + 1 + b] = store.dst_table[destination, b] + _B
    return at + address
  if block == tk.BLOCK_RESULT:
    if _failed(store, row):
      row_inputs[at] = tk.FAILED
      return at + 1
    row_inputs[at] = tk.RTT_START
    row_inputs[at + 1] = store.rtt_bytes[row, 0] + _B
    row_inputs[at + 2] = store.rtt_bytes[row, 1] + _B
    return at + 3
  kind = taken.kinds[j]
  if kind == tk.TS_ABS:
    row_inputs[at] = tk.TIMESTAMP_ABS
    return _write_bytes(row_inputs, at + 1, taken.values[j], 8)
  if kind == tk.TS_DELTA1:
    row_inputs[at] = tk.TIMESTAMP_DELTA1
    return _write_bytes(row_inputs, at + 1, taken.values[j], 1)
  if kind == tk.TS_DELTA4:
    row_inputs[at] = tk.TIMESTAMP_DELTA4
    return _write_bytes(row_inputs, at + 1, taken.values[j], 4)
  return at


@numba.njit(inline="always")
def _finish_row(out, r, segment_start, segment_used, segments, filled, shifted):
  """Row `r` of `out`: padding after `filled`, segment ids 1..k and positions; the shifted
  targets if asked."""
  inputs, segmentation, position = out.inputs[r], out.segmentation[r], out.position[r]
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
    _shift_row(
      inputs, segmentation, position, out.targets[r], out.targets_segmentation[r],
      out.targets_position[r],
    )  # fmt: skip


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
def loaded():
  """A kernel of nothing: its first call loads numba's compiler state, which every kernel's
  first call needs (`batch_kernel_loading.load_in_background` makes it on a thread)."""
  return 0


def permutations() -> np.ndarray:
  """The field-order table the kernel reads (tokenizer.PERMUTATIONS, int64)."""
  return PERMUTATIONS.astype(np.int64)
