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


def _worker_pids(proc) -> list[int]:
  """The processes of the run's session other than itself and Python's resource tracker."""
  pids = []
  for process in processes.session(proc.pid):
    try:
      command = " ".join(process.cmdline())
    except psutil.Error:
      continue
    if process.pid != proc.pid and "resource_tracker" not in command:
      pids.append(process.pid)
  return pids


def _workers(proc) -> int:
  return len(_worker_pids(proc))


def _wait_for_workers(proc, ready):
  """Waits until the run has its 2 Grain workers and `ready()` is true (3 minutes at most);
  returns what `ready()` returned then."""
  deadline = time.monotonic() + 180
  while _workers(proc) < 2 or not (seen := ready()):
    if proc.poll() is not None or time.monotonic() > deadline:
      proc.kill()
      pytest.fail(f"no workers at work: {proc.communicate()[1][-2000:]}")
    time.sleep(0.05)
  return seen


def _overrides(sample_dir, tmp_path) -> list[str]:
  """The smoke config on the sample data, with 2 Grain workers, writing under `tmp_path`."""
  return [
    f"grain_train_files={sample_dir}/*.parquet",
    f"network_prepared_dir={tmp_path}/prepared",
    f"base_output_directory={tmp_path}/runs",
    "grain_worker_count=2",
  ]


@pytest.mark.parametrize(
  "command",
  [
    ["batches", "configs/smoke.yml", "--steps", "1000000"],
    ["bench", "configs/smoke.yml", "--steps", "0", "--target-step-time", "0.1"],
  ],
  ids=["batches", "bench"],
)
def test_sigterm_to_the_main_process_closes_its_workers(command, tmp_path, sample_dir, jax_cache):
  overrides = _overrides(sample_dir, tmp_path)
  if command[0] == "bench":
    overrides.append("--batches=1000000")
  shm = set(os.listdir("/dev/shm"))
  proc = processes.start([sys.executable, "-m", "maxtext_netdata", *command, *overrides], jax_cache)
  _wait_for_workers(proc, lambda: proc.shm_watch.seen)
  time.sleep(1)  # batches in flight between the workers and the main process
  os.kill(proc.pid, signal.SIGTERM)
  code, _, err = processes.finish(proc, shm, timeout=60)
  assert code == 128 + signal.SIGTERM, err[-2000:]
  assert f"maxtext-netdata {command[0]}: terminated (SIGTERM)" in err


def test_sigterm_to_the_process_group_leaves_no_block_to_the_resource_tracker(
  tmp_path, sample_dir, jax_cache
):
  """SIGTERM to every process of the run at once, as Slurm stops a job: the workers die of
  it, and the batches the main process was receiving were held by the frames of its
  exception until the command returned, their blocks then left to Python's resource tracker
  ("There appear to be 6 leaked shared_memory objects", 4 runs in 4). The command now
  unlinks them before it exits (`cli._release_worker_blocks`)."""
  argv = [sys.executable, "-m", "maxtext_netdata", "batches", "configs/smoke.yml"]
  overrides = _overrides(sample_dir, tmp_path)
  for delay in (0.5, 1.5, 3.0):  # a race: from one run in five to four in four leaked, by load
    shm = set(os.listdir("/dev/shm"))
    proc = processes.start([*argv, "--steps", "1000000", *overrides], jax_cache)
    _wait_for_workers(proc, lambda proc=proc: proc.shm_watch.seen)
    time.sleep(delay)  # batches in flight between the workers and the main process
    os.killpg(proc.pid, signal.SIGTERM)
    code, _, err = processes.finish(proc, shm, timeout=60)
    assert code == 128 + signal.SIGTERM, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last == "maxtext-netdata batches: terminated (SIGTERM)", err[-2000:]
    assert "leaked" not in err, f"after {delay} s: {err[-2000:]}"


def test_a_reader_that_stops_ends_batches_quietly(tmp_path, sample_dir, jax_cache):
  """`maxtext-netdata batches ... | head -2`: the pipe closes under the command, which ends
  with a closed pipe's status (141) and nothing on stderr but the store's progress, its
  workers closed (it printed a BrokenPipeError traceback, twice)."""
  argv = [sys.executable, "-m", "maxtext_netdata", "batches", "configs/smoke.yml"]
  shm = set(os.listdir("/dev/shm"))
  proc = processes.start(
    [*argv, "--steps", "1000000", *_overrides(sample_dir, tmp_path)], jax_cache
  )
  assert [proc.stdout.readline().split()[0] for _ in range(2)] == ["step", "step"]
  proc.stdout.close()
  code, _, err = processes.finish(proc, shm, timeout=60)
  assert code == 128 + signal.SIGPIPE, err[-2000:]
  assert "Traceback" not in err and "Error" not in err, err[-2000:]


def _importing(pid: int) -> bool:
  """Whether a worker has numpy mapped and not yet jaxlib: in the imports of its start, which
  take seconds, before Grain's `worker_init_fn` runs."""
  try:
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
      maps = f.read()
  except OSError:
    return False
  return "_multiarray_umath" in maps and "jaxlib" not in maps


def test_ctrl_c_while_the_workers_start_ends_batches_at_once_and_quietly(
  tmp_path, sample_dir, jax_cache
):
  """Ctrl-C to the process group as soon as the Grain workers exist, while they import (for
  seconds): each once died of it with a traceback, and the thread spawning the other waited
  for ever on its pipe (the run hung until the 60 s grace). The workers now start with SIGINT
  blocked (`network_grain.first_next`): the command says it was interrupted, in one line."""
  argv = [sys.executable, "-m", "maxtext_netdata", "batches", "configs/smoke.yml"]
  shm = set(os.listdir("/dev/shm"))
  proc = processes.start(
    [*argv, "--steps", "1000000", *_overrides(sample_dir, tmp_path)], jax_cache
  )
  deadline = time.monotonic() + 180
  while not any(_importing(pid) for pid in _worker_pids(proc)):
    if proc.poll() is not None or time.monotonic() > deadline:
      proc.kill()
      pytest.fail(f"no worker started: {proc.communicate()[1][-2000:]}")
    time.sleep(0.01)
  os.killpg(proc.pid, signal.SIGINT)
  code, _, err = processes.finish(proc, shm, timeout=45)
  assert code == 128 + signal.SIGINT, err[-3000:]
  assert err.strip().splitlines()[-1] == "maxtext-netdata batches: interrupted", err[-3000:]
  assert "Traceback" not in err and "leaked" not in err, err[-3000:]


def test_a_killed_worker_ends_batches_with_one_line_and_leaves_no_block(
  tmp_path, sample_dir, jax_cache
):
  """A Grain worker of `batches` SIGKILLed while it fills its buffer: the command exits 2 (a
  user error) with one line naming the cause, and the /dev/shm blocks the worker never handed
  over (named with the iterator's prefix, `worker_blocks`) are gone."""
  overrides = _overrides(sample_dir, tmp_path)
  argv = [sys.executable, "-m", "maxtext_netdata", "batches", "configs/smoke.yml"]
  shm = set(os.listdir("/dev/shm"))
  proc = processes.start([*argv, "--steps", "1000000", *overrides], jax_cache)
  named = _wait_for_workers(proc, lambda: _worker_block_names(proc))
  prefix = named[0].rsplit("_", 1)[0]
  os.kill(min(_worker_pids(proc)), signal.SIGKILL)
  code, _, err = processes.finish(proc, shm, timeout=60)
  lines = [line for line in err.splitlines() if line.startswith("maxtext-netdata batches:")]
  assert code == 2, err[-2000:]
  assert len(lines) == 1 and "a Grain worker process ended (killed by SIGKILL)" in lines[0]
  assert [e for e in os.listdir("/dev/shm") if e.startswith(prefix)] == []


def _worker_block_names(proc) -> list[str]:
  """The iterator-named /dev/shm blocks (`psm_nd…_…`) the run's processes have open."""
  return sorted(name for name in proc.shm_watch.names() if name.startswith("psm_nd"))
