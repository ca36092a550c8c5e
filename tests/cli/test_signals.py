"""Ctrl-C and SIGTERM become exceptions in the main thread, also when they land in a finalizer.

Python drops an exception raised inside `__del__` ("Exception ignored in ..."): a Ctrl-C that
arrives while a finalizer runs was lost, and the run went on (seen in a training run, where
Grain frees shared-memory batches in `__del__`). The script below spends four fifths of its
time in `__del__`; every signal must still end its round.
"""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading

from maxtext_netdata import signals
from tests.helpers.processes import REPO, with_sigint_default

_SCRIPT = """
import sys, time
from maxtext_netdata import signals

class Slow:
  def __del__(self):
    time.sleep(0.02)

for _ in range(int(sys.argv[1])):
  try:
    with signals.as_exceptions():
      print("ready", flush=True)
      while True:
        Slow()
        time.sleep(0.005)
  except signals.Terminated:
    print("terminated", flush=True)
  except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def _lines(proc: subprocess.Popen) -> queue.Queue:
  """The lines `proc` prints, as they come (a reader thread: a select on the pipe would miss a
  line already in the reader's buffer when two arrive together)."""
  lines = queue.Queue()
  threading.Thread(
    target=lambda: [lines.put(line.strip()) for line in proc.stdout], daemon=True
  ).start()
  return lines


def _line(lines: queue.Queue, timeout: float) -> str:
  try:
    return lines.get(timeout=timeout)
  except queue.Empty:
    return "(nothing)"


def test_each_signal_ends_its_round_though_most_land_in_a_finalizer():
  rounds = [signal.SIGINT, signal.SIGTERM] * 8
  proc = subprocess.Popen(
    with_sigint_default([sys.executable, "-c", _SCRIPT, str(len(rounds))]),
    cwd=REPO,
    stdout=subprocess.PIPE,
    text=True,
  )
  lines = _lines(proc)
  try:
    seen = []
    for signum in rounds:
      assert _line(lines, 30) == "ready"
      proc.send_signal(signum)
      seen.append(_line(lines, 5))
    assert seen == ["interrupted", "terminated"] * 8
    assert proc.wait(timeout=10) == 0
  finally:
    proc.kill()
    proc.wait()


_HANGING_CLEANUP = """
import sys, threading
from maxtext_netdata import signals

signals.CLEANUP_GRACE_S = 1.0
signals.on_forced_exit(lambda: print("hook ran", flush=True))

def stuck_cleanup():
  threading.Event().wait()  # a library's close that never returns

try:
  with signals.as_exceptions():
    print("ready", flush=True)
    threading.Event().wait()
finally:
  stuck_cleanup()
"""


def test_a_clean_up_that_hangs_after_sigterm_ends_after_the_grace_with_its_stack():
  proc = subprocess.Popen(
    [sys.executable, "-c", _HANGING_CLEANUP],
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  try:
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
  finally:
    proc.kill()
    proc.wait()
  assert proc.returncode == 128 + signal.SIGTERM, err
  assert "still cleaning up 1 s after SIGTERM; ending now" in err
  assert "in stuck_cleanup" in err  # where the main thread was
  assert out.strip() == "hook ran"


def _frame_seen_in(function_name: str, run) -> bool:
  """The result of `signals._unsafe` for the frame of `threading`'s `function_name` while it
  runs inside `run()`."""
  seen = []

  def profile(frame, event, arg):
    del arg
    code = frame.f_code
    if (
      event == "call"
      and code.co_name == function_name
      and code.co_filename.endswith("threading.py")
    ):
      seen.append(signals._unsafe(frame))

  sys.setprofile(profile)
  try:
    run()
  finally:
    sys.setprofile(None)
  assert seen, f"{function_name} never ran"
  return seen[0]


def test_notify_defers_the_signal_and_a_wait_takes_it():
  # Raised inside notify, between waking a waiter and taking it off the list, the exception
  # would leave that waiter's lock there and the next notify would wake nobody.
  condition = threading.Condition()

  def notify():
    with condition:
      condition.notify()

  def wait():
    with condition:
      condition.wait(timeout=0.01)

  assert _frame_seen_in("notify", notify) is True
  assert _frame_seen_in("notify_all", lambda: threading.Event().set()) is True
  # A wait stays interruptible: Ctrl-C must end a loop blocked on a queue or an event.
  assert _frame_seen_in("wait", wait) is False
