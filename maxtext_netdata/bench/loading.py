"""What both benches share: loading alone timed, the worker sweep, host figures, progress.

`benchmark` (our pipeline) and `maxtext_bench` (MaxText's) each build their iterators and
hand them to `time_loading`, so the two loading figures of a report are measured the same way.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import jax
import numpy as np
import psutil
from tqdm import tqdm

from maxtext_netdata.bench import report as bench_report
from maxtext_netdata.errors import ConfigError


def time_loading(
  create_iterators: Callable[[], tuple],
  close: Callable[[object], None],
  *,
  batches: int,
  warmup: int,
  workers: int,
  tokens_key: str,
  ran_out_hint: str,
  ready: Callable[[], object] | None = None,
) -> dict:
  """`bench_report.loading_summary` of `batches` global batches after warm-up, no training.

  The first batch is timed from `create_iterators()` on (start-up included, reported as
  first-batch latency); then `warmup` untimed batches, as many as the buffers hold, so the
  timed ones are made while we wait rather than drained from a full buffer. Each timed batch is
  `next()` until its arrays are on the device; its real tokens are the non-zero entries of this
  host's shards of `tokens_key`. `close` ends each iterator (train and eval, when there is one).
  `ready`, when given, is called before the timed batches: it waits for what the loader still
  prepares on a thread (our batch kernel's load or compile, meanwhile replaced by its slower
  Python code), so that they time the loader as it runs from then on.

  Raises:
    ConfigError: the train iterator ran out; `ran_out_hint` follows "ran out after N batches".
  """
  start = time.perf_counter()
  train_iter, eval_iter = create_iterators()
  try:
    jax.block_until_ready(_next_batch(train_iter, 0, ran_out_hint))
    first_batch_s = time.perf_counter() - start
    for i in range(warmup):
      _next_batch(train_iter, i + 1, ran_out_hint)
    if ready is not None:
      ready()
    cpu_before = cpu_seconds()
    times, real_tokens, slot_tokens = [], 0, 0
    start = time.perf_counter()
    for i in tqdm(range(batches), desc="loading alone", unit="batch", leave=False, disable=None):
      t = time.perf_counter()
      batch = jax.block_until_ready(_next_batch(train_iter, warmup + 1 + i, ran_out_hint))
      times.append(time.perf_counter() - t)
      for shard in batch[tokens_key].addressable_shards:  # this host's rows
        real_tokens += int(np.count_nonzero(shard.data))
        slot_tokens += shard.data.size
    elapsed = time.perf_counter() - start
    cpu_used = cpu_seconds(cpu_before)
  finally:
    for iterator in (train_iter, eval_iter):
      if iterator is not None:
        close(iterator)
  return bench_report.loading_summary(
    times, first_batch_s, elapsed, real_tokens, slot_tokens, cpu_used, workers
  )


def sweep_workers(loading: dict, sweep: list[int], measure: Callable[[int], dict]) -> list[dict]:
  """Loading alone with each swept worker count: `measure(workers)` for each one, except the
  count `loading` (the configured run) already measured, which is reused rather than re-timed.

  Shared by both benches so the MaxText sweep reads the same as the project's own.
  """
  return [loading if workers == loading["workers"] else measure(workers) for workers in sweep]


def parse_sweep(text: str | None) -> list[int]:
  """`--sweep-workers` "0,2,1" as sorted distinct counts [0, 1, 2]; None or "" is none.

  Raises:
    ConfigError: not comma-separated integers >= 0.
  """
  if not text:
    return []
  try:
    values = sorted({int(v) for v in text.split(",") if v.strip()})
  except ValueError:
    raise ConfigError(f"--sweep-workers={text!r} must be comma-separated integers") from None
  if any(v < 0 for v in values):
    raise ConfigError(f"--sweep-workers={text!r}: worker counts must be >= 0")
  return values


def cpu_cores() -> int:
  """The cores this process may use (`network_grain.usable_cores`)."""
  from maxtext_netdata.input_pipeline.network_grain import usable_cores  # noqa: PLC0415

  return usable_cores()


def progress(message: str) -> None:
  """One `[bench]` line on stdout, at once."""
  print(f"[bench] {message}", flush=True)


def _next_batch(iterator, index: int, ran_out_hint: str):
  try:
    return next(iterator)
  except StopIteration:
    raise ConfigError(f"the training data ran out after {index} batches{ran_out_hint}") from None


def cpu_seconds(before: dict[int, float] | None = None) -> dict[int, float] | float:
  """CPU seconds per process of this one and its workers (`process_cpu_seconds`); with
  `before`, what they have used since, in all."""
  now = {}
  processes = [psutil.Process()]
  processes += processes[0].children(recursive=True)
  for p in processes:
    seconds = process_cpu_seconds(p)
    if seconds is not None:
      now[p.pid] = seconds
  if before is None:
    return now
  return sum(seconds - before.get(pid, 0.0) for pid, seconds in now.items())


# Linux's encoding of a process's CPU-time clock, as glibc's `clock_getcpuclockid` makes it:
# (~pid << 3) | CPUCLOCK_SCHED.
_CPUCLOCK_SCHED = 2


def process_cpu_seconds(process: psutil.Process) -> float | None:
  """The CPU seconds `process` has used (every thread's, ended threads' too), None once it
  has ended.

  On Linux read from the process's CPU-time clock (`clock_gettime` on the clock
  `clock_getcpuclockid` names: nanoseconds) rather than psutil's `cpu_times`, which the kernel
  counts in scheduler ticks (10 ms): bench times 100 batches of a loader that makes one in
  0.6 ms on an H200's host, a 60 ms window that ticks misstate by up to a third, and with it
  the tokens per core. Elsewhere psutil's figures.
  """
  if sys.platform == "linux":
    try:
      return time.clock_gettime((~process.pid << 3) | _CPUCLOCK_SCHED)
    except OSError:  # ended (EINVAL)
      return None
  try:
    times = process.cpu_times()
  except psutil.Error:
    return None
  return times.user + times.system
