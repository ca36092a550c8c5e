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
"""

from __future__ import annotations

import contextlib
import random
import signal
import threading

_RETRY_S = 0.01


class Terminated(KeyboardInterrupt):
  """SIGTERM, raised in the main thread where Ctrl-C raises KeyboardInterrupt.

  Slurm, Kubernetes and preemptible VMs stop a job with SIGTERM to its main process; its
  default action ends that process at once, leaving its Grain workers and their /dev/shm blocks
  behind. Raised like Ctrl-C's exception, it unwinds through the same `finally` clauses (a
  subclass of KeyboardInterrupt, so no `except Exception` on the way swallows it). `train`
  installs its own handler while it runs, which saves a checkpoint first.
  """


def _in_finalizer(frame) -> bool:
  """Whether the interrupted code runs inside a `__del__` or a `weakref.finalize` callback."""
  while frame is not None:
    code = frame.f_code
    if code.co_name == "__del__" or (
      code.co_name == "__call__" and code.co_filename.endswith("weakref.py")
    ):
      return True
    frame = frame.f_back
  return False


def _raise(signum: int, frame) -> None:
  if _in_finalizer(frame):
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
  raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def as_exceptions():
  """Within: SIGINT raises KeyboardInterrupt and SIGTERM `Terminated` in the main thread.

  The previous handlers come back on exit. Nothing is installed off the main thread, and
  SIGINT stays ignored where it was (a background job started from a shell).
  """
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
