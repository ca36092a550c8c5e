"""Compiling kernels on a background thread, so that a command's first run on a machine (an
empty numba cache) does useful work while they compile instead of waiting for them.

`start(name, steps)` runs each step (a function that calls one kernel on a tiny input: it
compiles the kernel, or loads it from numba's cache) in order on one daemon thread; `pending`
says whether a step is compiling: started, not finished, and a compile begun on its thread (in
it, or in a step before it). A caller that has an exact uncompiled way to do the same work
(numpy, Python, DuckDB) takes it while `pending` is true and the kernel afterwards, so nothing
waits for a compile; a caller without one calls the kernel, which then waits for the compile
under numba's compiler lock as it would have compiled it itself.

A step that only loads its kernel from numba's cache is waited for instead (`pending` returns
once it is done): the load takes ~0.5 s alone, but the uncompiled stand-in needs the GIL as
the load does, and beside it the batch kernel's load of 0.5 s took 12-15 s (113-142 batches of
32 x 1024 built by its Python code meanwhile, against none after 0.5 s of waiting).

numba compiles one kernel at a time per process (its global compiler lock): a kernel the main
thread needs while the thread compiles another one waits for that one too. The steps are
hence ordered by need, the kernels every path needs first, and a kernel whose only use is a
faster path (the ingest scanner) last.

A step that compiled (numba's "numba:compile" event on its thread: a cache miss, not a load)
and took longer than `notice_after_s` says so on stderr in one line, with its time: what a
cold compile costs is printed where it is paid, and a slow load on a busy machine is not
called a compile. Our own code because numba has no background compile.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

from numba.core import event as numba_event

NOTICE_AFTER_S = 2.0
# The longest `pending` waits for a step that loads (no compile begun): a load that takes
# longer than this, or a step that never ends, then counts as pending.
LOAD_WAIT_S = 60.0

_lock = threading.Lock()
_started: dict[str, threading.Event] = {}  # step name -> set when the step has finished
# step name -> set when the step has finished or a compile has begun in it or a step before it
_decided: dict[str, threading.Event] = {}
_seconds: dict[str, float] = {}  # step name -> seconds it took (compiled or loaded)
_threads: list[threading.Thread] = []


# On a warm-up thread: `warming` set; `compiled`, whether its step compiled; `steps`, the names
# of its step and those after it.
_local = threading.local()


class _Compiles(numba_event.Listener):
  """Marks the warm-up thread's step as compiled: numba fires "numba:compile" on the thread
  that compiles, and only on a cache miss (a load from its cache fires none). The step and
  those after it are pending from then on: they wait for this compile."""

  def on_start(self, event) -> None:
    if getattr(_local, "warming", False):
      _local.compiled = True
      compiling()

  def on_end(self, event) -> None:
    pass


numba_event.register("numba:compile", _Compiles())


def _forget_in_child() -> None:
  """A forked child has none of the parent's threads: steps still running there would stay
  pending in it forever (and `wait` would hang). It starts its own when it needs them."""
  global _lock
  _lock = threading.Lock()
  _started.clear()
  _decided.clear()
  _seconds.clear()
  _threads.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def compiling() -> None:
  """Called on a warm-up thread: its step and the steps after it are pending from now on.
  numba's compile event says so by itself; a step that waits for something else before its
  compile (another thread's steps) says it first, or `pending` would wait with it."""
  for name in getattr(_local, "steps", ()):
    _decided[name].set()


def pending(name: str) -> bool:
  """Whether step `name` is compiling: started on a thread, not finished, and a compile begun
  there (in it or a step before it). While it only loads from numba's cache, waits for it
  (up to LOAD_WAIT_S): then False. False on that thread itself, whose calls are the ones that
  compile the kernels."""
  done = _started.get(name)
  if done is None or done.is_set() or getattr(_local, "warming", False):
    return False
  _decided[name].wait(LOAD_WAIT_S)
  return not done.is_set()


def started(name: str) -> bool:
  return name in _started


def seconds(name: str) -> float | None:
  """Seconds step `name` took on its thread (None until it finished)."""
  return _seconds.get(name)


def wait(name: str, timeout: float | None = None) -> bool:
  """Waits for step `name` (if started); whether it has finished."""
  done = _started.get(name)
  return done is None or done.wait(timeout)


def join(timeout: float | None = None) -> None:
  """Waits for every warm-up thread started so far to end (each up to `timeout` seconds)."""
  for thread in list(_threads):
    thread.join(timeout)


def finish(name: str, said: str, skipped: str) -> None:
  """At a command's end: when step `name` is still pending (a machine's first run), prints
  `said` on stderr and waits for it, so that its kernel is cached and later runs load it.
  Ctrl-C or SIGTERM (signals.Terminated is a KeyboardInterrupt) ends the wait at once with
  `skipped`, one line rather than a traceback; a later run compiles again."""
  if not pending(name):
    return
  try:
    print(said, file=sys.stderr, flush=True)
    wait(name)
  except KeyboardInterrupt:
    print(skipped, file=sys.stderr, flush=True)


def cached(kernel) -> bool:
  """Whether numba's on-disk cache holds machine code of `kernel` (a `cache=True` dispatcher)
  for its source as it is: then calling it loads (~0.1-0.5 s) instead of compiling. A guess
  from the cache's index (any signature, this source stamp); False when it cannot tell."""
  try:
    return bool(kernel._cache._cache_file._load_index())
  except Exception:  # numba's private API: the guess is only about time, never results
    return False


def start(
  steps: list[tuple[str, Callable[[], object], str | None]],
  notice_after_s: float = NOTICE_AFTER_S,
  thread_name: str = "kernel-warmup",
) -> threading.Thread | None:
  """Runs `steps` (name, warm, notice) in order on one daemon thread, those not started before.

  `notice`, when given, is printed on stderr as `f"{notice} in {seconds:.1f} s"` when the step
  compiled a kernel and took more than `notice_after_s`. A step that raises is ended (its
  error printed on stderr by the thread) and the next runs; a caller's own call to the kernel
  then raises it again.
  """
  with _lock:
    todo = [step for step in steps if step[0] not in _started]
    for name, _, _ in todo:
      _started[name] = threading.Event()
      _decided[name] = threading.Event()
  if not todo:
    return None

  def run() -> None:
    _local.warming = True
    for at, (name, warm, notice) in enumerate(todo):
      _local.compiled = False
      _local.steps = [step[0] for step in todo[at:]]
      began = time.perf_counter()
      try:
        warm()
      except Exception as e:  # the kernel raises again where it is called
        print(f"{name}: compile failed on the warm-up thread: {e!r}", file=sys.stderr, flush=True)
      finally:
        took = time.perf_counter() - began
        _seconds[name] = took
        # Said before the step counts as finished: a caller done waiting has its notice.
        if notice and _local.compiled and took > notice_after_s:
          print(f"{notice} in {took:.1f} s", file=sys.stderr, flush=True)
        _started[name].set()
        _decided[name].set()

  thread = threading.Thread(target=run, name=thread_name, daemon=True)
  _threads.append(thread)
  thread.start()
  return thread


def noted(kernel, what: str, notice_after_s: float = NOTICE_AFTER_S):
  """`kernel` (a numba dispatcher), saying on stderr when a call compiled it for longer than
  `notice_after_s` (a machine's first run: numba's cache had no machine code for those types):
  `f"{what} in {seconds:.1f} s (...)"`. A call that compiles nothing costs two dict lengths."""

  def call(*args):
    known = len(kernel.overloads)
    began = time.perf_counter()
    result = kernel(*args)
    if len(kernel.overloads) != known:
      took = time.perf_counter() - began
      if took > notice_after_s and sum(kernel.stats.cache_misses.values()):
        print(
          f"{what} in {took:.1f} s (its first use on this machine; cached for later runs)",
          file=sys.stderr,
          flush=True,
        )
    return result

  call.kernel = kernel
  return call
