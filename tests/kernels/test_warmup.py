"""`kernels.warmup`: steps on a thread, what `pending` says meanwhile (or waits for), and compile
notices."""

import os
import subprocess
import sys
import threading

import numba

from maxtext_netdata.kernels import warmup

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def test_steps_run_in_order_on_one_thread_and_are_pending_once_one_compiles(capsys):
  release, order, seen_on_thread = threading.Event(), [], []

  def first():
    seen_on_thread.append(warmup.pending("test-first"))  # the thread's own calls: not pending
    numba.njit(lambda x: x + 1)(1)  # a compile (no cache): its notice is printed
    release.wait(30)
    order.append("first")

  thread = warmup.start(
    [
      ("test-first", first, "first step"),
      ("test-second", lambda: order.append("second"), "compiled nothing"),
    ],
    notice_after_s=0,
  )
  # From the compile's start both are pending: the second step waits for it too.
  assert warmup.pending("test-first") and warmup.pending("test-second")
  assert not release.is_set() and order == []
  assert warmup.start([("test-first", first, None)]) is None  # once per process
  release.set()
  thread.join(30)
  assert order == ["first", "second"] and seen_on_thread == [False]
  assert not warmup.pending("test-first") and warmup.seconds("test-first") >= 0
  assert not warmup.pending("never-started") and warmup.wait("never-started")
  err = capsys.readouterr().err
  assert "first step in " in err and "compiled nothing" not in err, err


def test_a_step_that_compiles_nothing_is_waited_for_instead_of_pending():
  """A load from numba's cache (no compile) is short alone, and slowed by a stand-in that
  needs the GIL beside it: `pending` waits for it to end and says False."""
  release, ended = threading.Event(), []

  def load():
    release.wait(30)
    ended.append(True)

  thread = warmup.start([("test-load", load, None)])
  threading.Timer(0.2, release.set).start()
  assert not warmup.pending("test-load") and ended == [True]
  thread.join(30)


def test_a_step_that_waits_before_its_compile_says_so_and_is_pending_at_once():
  """The ingest scanner's step waits for the helpers' compiles before its own: unsaid, the
  blocks asking whether it is pending would wait with it (the first output of a machine's
  first ingest of 82 MB came after 42 s instead of 5)."""
  release = threading.Event()

  def waits_then_compiles():
    warmup.compiling()
    release.wait(30)

  thread = warmup.start([("test-waits", waits_then_compiles, None), ("test-after", int, None)])
  assert warmup.pending("test-waits") and warmup.pending("test-after")
  assert not release.is_set()
  release.set()
  thread.join(30)
  assert not warmup.pending("test-waits") and not warmup.pending("test-after")


_NOTED = """
import sys
import numpy as np
from maxtext_netdata.data.prepare import row_kernels
from maxtext_netdata.kernels import warmup
ties = warmup.noted(row_kernels._ties.kernel, "ties compiled", notice_after_s=0)
ties(np.zeros(2, np.int32), np.zeros(2, np.int64), np.arange(2), np.zeros(2, np.bool_))
ties(np.zeros(3, np.int32), np.zeros(3, np.int64), np.arange(3), np.zeros(3, np.bool_))
"""


def test_a_compile_is_noted_where_it_is_paid_and_a_cache_load_is_not(tmp_path):
  env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "PYTHONPATH": ROOT}

  def stderr() -> str:
    run = [sys.executable, "-c", _NOTED]
    return subprocess.run(run, env=env, capture_output=True, text=True, check=True).stderr

  first = stderr()
  assert first.count("ties compiled in ") == 1, first  # the second call compiled nothing
  assert "ties compiled" not in stderr()  # loaded from the cache


_FORK = """
import os, threading
import numba
from maxtext_netdata.kernels import warmup
release = threading.Event()
def step():
  numba.njit(lambda x: x + 1)(1)  # a compile: the step is pending from its start
  release.wait(30)
thread = warmup.start([("test-fork", step, None)])
assert warmup.pending("test-fork")
pid = os.fork()
if pid == 0:
  os._exit(0 if not warmup.pending("test-fork") and warmup.wait("test-fork", timeout=5) else 1)
_, status = os.waitpid(pid, 0)
release.set()
thread.join(30)
print(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_does_not_inherit_a_step_that_never_ends_there():
  """The parent's thread does not exist in a forked child: a step pending in the parent is
  not pending there, and `wait` returns at once instead of hanging. (In a fresh process
  without JAX, whose threads make a fork in the test process unsafe.)"""
  result = subprocess.run(
    [sys.executable, "-c", _FORK], cwd=ROOT, capture_output=True, text=True, timeout=120
  )
  assert result.returncode == 0 and result.stdout.strip() == "0", result.stderr[-2000:]
