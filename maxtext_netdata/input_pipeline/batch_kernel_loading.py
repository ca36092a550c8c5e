"""When the batch kernel runs as machine code and when as its own Python code.

`load_in_background` loads (or on a machine's first run compiles) `batch_kernel.fill_batch`
on a daemon thread (`kernels.warmup`) while the rest of start-up runs; while that thread
compiles, `fill_batch_now` gives the kernel's Python code (`kernels.python_mode`), which
writes the same batches ~200-300x slower but at once, so no first batch waits for the
compile. A load from numba's cache (~0.5 s) is waited for instead (`warmup.pending`): beside
the Python code, which needs the GIL as the load does, it took 12-15 s.
`wait_ready` waits for the machine code (benchmarks time it, not the stand-in);
`finish_compile` lets a short command (`batches`) wait for a first compile at its end, so
that later runs load it.
"""

from __future__ import annotations

import sys
import time

from maxtext_netdata.input_pipeline.batch_kernel import fill_batch, loaded
from maxtext_netdata.kernels import python_mode, warmup


def load_in_background(warm=None) -> None:
  """Starts (once per process) loading a cached kernel on a daemon thread: numba sets up its
  compiler state, which every kernel's first call needs. `warm`, when given, is then called on
  that thread: a call of `fill_batch` with a builder's own argument types (a batch of no
  rows), so that the kernel its batches need is loaded, or on a machine's first run compiled
  (~6-20 s), while the rest of start-up runs; that compile says so on stderr with its time
  when it is long. While the thread compiles, `fill_batch_now` gives the kernel's Python
  code: the first batches never wait for a compile."""
  _began[0] = _began[0] or time.perf_counter()
  steps = [(_SET_UP, _set_up, None)]
  if warm is not None:
    steps.append((_WARM, lambda: _reporting(warm), _NOTICE))
  warmup.start(steps, thread_name="batch-kernel-load")


def _set_up() -> None:
  """numba's compiler state (`loaded`), on the load thread. A kernel not in numba's cache (a
  machine's first run) is a compile, pending from here, not from numba's first compile event
  ~0.3 s later (its set-up first), which a batch asked for meanwhile would wait for."""
  if not warmup.cached(fill_batch):
    warmup.compiling()
  loaded()


_SET_UP, _WARM = "batch kernel set-up", "batch kernel"
_NOTICE = (
  "batches: compiled the batch kernel on a thread (its first use on this machine; cached for"
  " later runs)"
)
_fill_batch_python = python_mode.python_function(fill_batch)
_python_batches = [0]  # batches `fill_batch_now` gave to the Python code in this process
_began = [0.0]  # when `load_in_background` was first called


def python_fill_batch(*args) -> None:
  """`fill_batch`'s own Python code (`kernels.python_mode`), counted: the same batch, ~200-300x
  slower, with no compile to wait for."""
  _python_batches[0] += 1
  _fill_batch_python(*args)


def _reporting(warm) -> None:
  """`warm()`, then a line on stderr when batches were built by the Python code meanwhile."""
  warm()
  if _python_batches[0]:
    compiled = sum(fill_batch.stats.cache_misses.values()) > 0
    print(
      f"batches: {_python_batches[0]} batches were built by the batch kernel's Python code"
      f" (the same batches, ~200-300x slower) in the {time.perf_counter() - _began[0]:.1f} s the"
      f" kernel took to {'compile' if compiled else 'load'}",
      file=sys.stderr,
      flush=True,
    )


def finish_compile() -> None:
  """At the end of a short command (`batches`): waits for the batch kernel's compile when it
  is still running, so that later runs load it (`warmup.finish`); a kernel that numba's
  cache holds is only being loaded: nothing to wait for."""
  if warmup.cached(fill_batch):
    return
  warmup.finish(
    _WARM,
    "batches: finishing the batch kernel's compile (its first use on this machine) so that"
    " later runs use it; Ctrl-C skips it",
    "batches: compile skipped; the next run compiles it",
  )


def wait_ready() -> None:
  """Waits until `load_in_background`'s thread has loaded or compiled the kernel (at once
  when it never started): from then on `fill_batch_now` is the machine code."""
  warmup.wait(_SET_UP)
  warmup.wait(_WARM)


def fill_batch_now():
  """`fill_batch`, or while `load_in_background`'s thread compiles it, the kernel's own
  Python code (`kernels.python_mode`): the same batch at once, ~200-300x slower (8 x 1024 in
  ~10 ms, 64 x 1024 in ~0.1 s), instead of a wait of up to the compile's time. While the
  thread loads it from numba's cache, waits for that (~0.5 s)."""
  if warmup.pending(_SET_UP) or warmup.pending(_WARM):
    return python_fill_batch
  return fill_batch
