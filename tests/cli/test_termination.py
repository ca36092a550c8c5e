"""SIGTERM to the main process of a command that runs Grain workers ends it as Ctrl-C does.

Slurm, Kubernetes and preemptible VMs stop a job with SIGTERM to its main process alone. The
command must close its workers and exit 143, leaving no process of its session and no
/dev/shm entry behind (`train`, which saves first, has its own tests in tests/trainer).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil
import pytest

from tests.helpers import processes

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory) -> str:
  return str(tmp_path_factory.mktemp("jax_cache"))


def _workers(proc) -> int:
  count = 0
  for process in processes.session(proc.pid):
    try:
      command = " ".join(process.cmdline())
    except psutil.Error:
      continue
    count += process.pid != proc.pid and "resource_tracker" not in command
  return count


@pytest.mark.parametrize(
  "command",
  [
    ["batches", "configs/smoke.yml", "--steps", "1000000"],
    ["bench", "configs/smoke.yml", "--steps", "0", "--target-step-time", "0.1"],
  ],
  ids=["batches", "bench"],
)
def test_sigterm_to_the_main_process_closes_its_workers(command, tmp_path, sample_dir, jax_cache):
  overrides = [
    f"grain_train_files={sample_dir}/*.parquet",
    f"network_prepared_dir={tmp_path}/prepared",
    f"base_output_directory={tmp_path}/runs",
    "grain_worker_count=2",
  ]
  if command[0] == "bench":
    overrides.append("--batches=1000000")
  shm = set(os.listdir("/dev/shm"))
  proc = processes.start([sys.executable, "-m", "maxtext_netdata", *command, *overrides], jax_cache)
  deadline = time.monotonic() + 180
  while _workers(proc) < 2 or not proc.shm_watch.seen:
    if proc.poll() is not None or time.monotonic() > deadline:
      proc.kill()
      pytest.fail(f"no workers at work: {proc.communicate()[1][-2000:]}")
    time.sleep(0.1)
  time.sleep(1)  # batches in flight between the workers and the main process
  os.kill(proc.pid, signal.SIGTERM)
  code, _, err = processes.finish(proc, shm, timeout=60)
  assert code == 128 + signal.SIGTERM, err[-2000:]
  assert f"maxtext-netdata {command[0]}: terminated (SIGTERM)" in err
