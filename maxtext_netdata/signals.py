"""Ctrl-C and SIGTERM as exceptions in the main thread, never lost in a finalizer.

Python raises Ctrl-C's KeyboardInterrupt wherever the main thread happens to be, and an
exception raised inside a `__del__` method or a `weakref.finalize` callback is printed
("Exception ignored in ...") and dropped: the run goes on as if Ctrl-C had never come. A
training loop with Grain workers spends enough time in finalizers for this to matter (Grain
frees each shared-memory batch in `SharedMemoryArray.__del__`): about one Ctrl-C in eight to
a training run was lost that way. The handlers here raise only outside a finalizer; inside one
they send the signal again a moment later (to the main thread, at a random moment within
20 ms), to be raised at the next safe point. Our own code, not a library's: the standard
handlers have no such check and no kept library offers one.

`threading.Condition.notify` is no safe point either: interrupted between waking a waiter and
taking it off the waiting list, it leaves that waiter's lock on the list, the next notify
wakes nobody, and a thread waiting on the condition (a `multiprocessing.Queue`'s feeder,
which TensorBoard's event writer closes through) waits for ever. The signal is sent again
from there too.

Once a signal has been raised, the process has `CLEANUP_GRACE_S` to end. A clean-up that
hangs in a library (a MaxText run stopped by SIGTERM once waited for ever in its TensorBoard
writer's `close`) is ended then: the main thread's stack goes to stderr, the hooks given to
`on_forced_exit` run (the MaxText plugin's closes the Grain workers and their /dev/shm blocks)
and the process exits with 128 + the signal's number, as a signal's default action would.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import threading
import traceback
from collections.abc import Callable

_RETRY_S = 0.01
# Seconds the process has to end once a signal was raised in it.
CLEANUP_GRACE_S = 60.0
# Functions of `threading.py` inside which an exception leaves a lock in a wrong state.
_UNSAFE_THREADING = frozenset({"notify", "notify_all"})

_forced_exit_hooks: list[Callable[[], None]] = []
_grace: list[threading.Timer] = []


class Terminated(KeyboardInterrupt):
  """SIGTERM, raised in the main thread where Ctrl-C raises KeyboardInterrupt.

  Slurm, Kubernetes and preemptible VMs stop a job with SIGTERM to its main process; its
  default action ends that process at once, leaving its Grain workers and their /dev/shm blocks
  behind. Raised like Ctrl-C's exception, it unwinds through the same `finally` clauses (a
  subclass of KeyboardInterrupt, so no `except Exception` on the way swallows it). `train`
  installs its own handler while it runs, which saves a checkpoint first.
  """


def ended(program: str, error: KeyboardInterrupt) -> int:
  """A run that Ctrl-C or SIGTERM ended: says so on stderr in one line (`PROGRAM: interrupted`,
  `PROGRAM: terminated (SIGTERM)`) and returns the exit status a shell expects (130, 143)."""
  if isinstance(error, Terminated):
    print(f"{program}: terminated (SIGTERM)", file=sys.stderr)
    return 128 + signal.SIGTERM
  print(f"{program}: interrupted", file=sys.stderr)
  return 128 + signal.SIGINT


def on_forced_exit(hook: Callable[[], None]) -> None:
  """Registers `hook` to run (once, best effort) before a clean-up that outlived
  `CLEANUP_GRACE_S` ends the process."""
  if hook not in _forced_exit_hooks:
    _forced_exit_hooks.append(hook)


def _unsafe(frame) -> bool:
  """Whether an exception raised in the interrupted code would be dropped or leave a lock in
  a wrong state: inside a `__del__`, a `weakref.finalize` callback or `Condition.notify`."""
  while frame is not None:
    code = frame.f_code
    name, filename = code.co_name, code.co_filename
    if name == "__del__" or (name == "__call__" and filename.endswith("weakref.py")):
      return True
    if name in _UNSAFE_THREADING and filename.endswith("threading.py"):
      return True
    frame = frame.f_back
  return False


def _force_exit(signum: int) -> None:
  """The end of a clean-up that outlived its grace: the main thread's stack, the hooks, exit."""
  name = signal.Signals(signum).name
  stack = sys._current_frames().get(threading.main_thread().ident)
  where = "".join(traceback.format_stack(stack)) if stack is not None else "(gone)\n"
  sys.stderr.write(
    f"maxtext-netdata: still cleaning up {CLEANUP_GRACE_S:.0f} s after {name}; ending now."
    f" The main thread was in:\n{where}"
  )
  sys.stderr.flush()
  for hook in _forced_exit_hooks:
    try:
      hook()
    except Exception as e:  # noqa: BLE001 - every hook gets its turn
      sys.stderr.write(f"maxtext-netdata: {hook.__qualname__} failed on the way out: {e}\n")
  os._exit(128 + signum)


def _start_grace(signum: int) -> None:
  if not _grace:
    timer = threading.Timer(CLEANUP_GRACE_S, _force_exit, (signum,))
    timer.daemon = True
    timer.start()
    _grace.append(timer)


def _raise(signum: int, frame) -> None:
  if _unsafe(frame):
    # Sent to the main thread, the signal ends a sleep at once; at a random moment, so a loop
    # that spends most of its time in finalizers cannot keep meeting it in one in lock-step.
    retry = threading.Timer(
      random.uniform(0, 2 * _RETRY_S),
      signal.pthread_kill,
      (threading.main_thread().ident, signum),
    )
    retry.daemon = True
    retry.start()
    return
  _start_grace(signum)
  raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def as_exceptions():
  """Within: SIGINT raises KeyboardInterrupt and SIGTERM `Terminated` in the main thread.

  The previous handlers come back on exit. Nothing is installed off the main thread, and
  SIGINT stays ignored where it was (a background job started from a shell). The grace of a
  signal raised before is over: entering again, the process goes on working.
  """
  while _grace:
    _grace.pop().cancel()
  previous = {}
  if threading.current_thread() is threading.main_thread():
    for signum in (signal.SIGINT, signal.SIGTERM):
      if signal.getsignal(signum) is not signal.SIG_IGN:
        previous[signum] = signal.signal(signum, _raise)
  try:
    yield
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)
