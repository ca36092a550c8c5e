"""SIGTERM to one process of a two-process training job stops both at the same step.

A preemptible multi-host job gets its notices host by host. Each host stopping at its own next
step boundary hung both processes (one waiting in the next step's collectives, the other in
the checkpoint's barrier); with JAX's preemption service every process stops after the same
step, saves that step together and ends with status 143, leaving no process and no /dev/shm
entry behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import portpicker
import pytest

from tests.helpers import processes

pytestmark = pytest.mark.slow


def test_sigterm_to_one_process_stops_both_after_the_same_step(tmp_path, sample_dir):
  out = tmp_path / "runs"
  argv = processes.train_argv(
    processes.train_overrides(sample_dir, out, "preempted", 100000, workers=1)
  )
  port = portpicker.pick_unused_port()
  shm = set(os.listdir("/dev/shm"))
  procs = []
  for process_id in range(2):
    env = dict(
      os.environ,
      JAX_PLATFORMS="cpu",
      PYTHONPATH=str(processes.REPO),
      JAX_NUM_PROCESSES="2",
      JAX_PROCESS_ID=str(process_id),
      JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
    )
    proc = processes.popen(argv, env)
    proc.shm_watch = processes._ShmWatch(proc)
    procs.append(proc)
  try:
    metrics = out / "preempted" / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
      assert all(p.poll() is None for p in procs), "a process ended before step 3"
      assert time.monotonic() < deadline, "no step 3 within 180 s"
      time.sleep(0.2)
    os.kill(procs[1].pid, signal.SIGTERM)  # one host's notice only
    results = [processes.finish(proc, shm, timeout=90) for proc in procs]
  finally:
    for proc in procs:
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
  stopped = []
  for code, text, err in results:
    assert code == 128 + signal.SIGTERM, err[-3000:]
    stopped.append(int(re.search(r"SIGTERM received; stopped after step (\d+)", text)[1]))
  assert stopped[0] == stopped[1] >= 3
  saved = out / "preempted" / "checkpoints"
  assert sorted(p.name for p in saved.iterdir() if p.name.isdigit()) == [str(stopped[0])]
  for process_id in range(2):
    state = json.loads(
      (saved / str(stopped[0]) / "iter" / f"process_{process_id}-of-2.json").read_text()
    )
    assert state["step"] == stopped[0]
