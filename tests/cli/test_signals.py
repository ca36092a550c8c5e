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

from tests.helpers.processes import REPO

_SCRIPT = """
import sys, time
from maxtext_netdata.cli import signals

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
    [sys.executable, "-c", _SCRIPT, str(len(rounds))],
    cwd=REPO,
    stdout=subprocess.PIPE,
    text=True,
    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
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
