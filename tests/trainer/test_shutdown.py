"""Every way a training run ends leaves no process and no /dev/shm entry behind.

Each run is `maxtext-netdata train` (or a script calling `train.train`) in its own session with
2 Grain worker processes (`tests.helpers.processes`); afterwards no process of that session may be
alive and no /dev/shm entry it used may remain.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import processes

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory) -> str:
  return str(tmp_path_factory.mktemp("jax_cache"))


def _overrides(sample_dir, out: Path, run_name: str, steps: int) -> list[str]:
  return processes.train_overrides(sample_dir, out, run_name, steps, workers=2)


_train_argv = processes.train_argv


def _wait_for_step(metrics: Path, step: int, proc: subprocess.Popen, timeout: float = 180):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      pytest.fail(f"run ended early:\n{proc.stderr.read()[-3000:]}")
    if metrics.exists() and sum(1 for _ in metrics.open()) >= step:
      return
    time.sleep(0.1)
  pytest.fail(f"no step {step} within {timeout} s")


def _losses(metrics: Path) -> dict[int, float]:
  records = [json.loads(line) for line in metrics.read_text().splitlines()]
  return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_sigterm_saves_at_the_next_step_and_the_resumed_run_continues_exactly(
  tmp_path, sample_dir, jax_cache
):
  out = tmp_path / "runs"
  shm = set(os.listdir("/dev/shm"))
  proc = processes.start(_train_argv(_overrides(sample_dir, out, "cut", 100000)), jax_cache)
  _wait_for_step(out / "cut" / "metrics.jsonl", 3, proc)
  os.kill(proc.pid, signal.SIGTERM)  # the main process only, as Slurm or Kubernetes do
  signalled = time.monotonic()
  code, out_text, err = processes.finish(proc, shm, timeout=60)
  assert time.monotonic() - signalled < 60
  assert code == 128 + signal.SIGTERM, err[-2000:]
  saved = [int(p.name) for p in (out / "cut" / "checkpoints").iterdir() if p.name.isdigit()]
  assert len(saved) == 1 and saved[0] >= 3, saved
  cut_at = saved[0]
  assert f"SIGTERM received; stopped after step {cut_at}" in out_text

  steps = cut_at + 3
  shm = set(os.listdir("/dev/shm"))
  code, _, err = processes.finish(
    processes.start(_train_argv(_overrides(sample_dir, out, "cut", steps)), jax_cache), shm
  )
  assert code == 0, err[-2000:]
  shm = set(os.listdir("/dev/shm"))
  code, _, err = processes.finish(
    processes.start(_train_argv(_overrides(sample_dir, out, "whole", steps)), jax_cache), shm
  )
  assert code == 0, err[-2000:]
  whole = _losses(out / "whole" / "metrics.jsonl")
  assert sorted(whole) == list(range(steps))
  assert _losses(out / "cut" / "metrics.jsonl") == whole


def _grain_workers(proc: subprocess.Popen) -> list[psutil.Process]:
  found = []
  for process in processes.session(proc.pid):
    try:
      if process.pid != proc.pid and "resource_tracker" not in " ".join(process.cmdline()):
        found.append(process)
    except psutil.Error:
      continue
  return found


def test_ctrl_c_to_the_process_group_leaves_nothing(tmp_path, sample_dir, jax_cache):
  """Ctrl-C reaches every process of the group, in no set order. The workers ignore it (one
  that ended on it could leave the /dev/shm block of a batch it was handing over, and the run
  would report a dead worker): a SIGINT to the workers alone changes nothing, and the main
  process's interrupt closes them."""
  out = tmp_path / "runs"
  metrics = out / "interrupted" / "metrics.jsonl"
  shm = set(os.listdir("/dev/shm"))
  proc = processes.start(_train_argv(_overrides(sample_dir, out, "interrupted", 100000)), jax_cache)
  _wait_for_step(metrics, 2, proc)
  workers = _grain_workers(proc)
  assert len(workers) == 2, workers
  for worker in workers:
    worker.send_signal(signal.SIGINT)
  _wait_for_step(metrics, sum(1 for _ in metrics.open()) + 3, proc)
  assert all(worker.is_running() for worker in workers)
  os.killpg(proc.pid, signal.SIGINT)
  code, _, err = processes.finish(proc, shm, timeout=60)
  assert code == 130, err[-2000:]


_RAISING = """
import json, sys
from absl import flags
from maxtext_netdata import config
from maxtext_netdata.distributed.mesh import make_mesh
from maxtext_netdata.input_pipeline import create_data_iterator
from maxtext_netdata.trainer import train

flags.FLAGS.mark_as_parsed()
cfg = config.load("configs/smoke.yml", json.loads(sys.argv[1]))
train_iter, eval_iter = create_data_iterator(cfg, make_mesh(cfg))


class FailingAtStep3:
  def __init__(self):
    self.count = 0

  def __iter__(self):
    return self

  def __next__(self):
    self.count += 1
    if self.count == 4:
      raise RuntimeError("step 3 fails")
    return next(train_iter)

  def get_state(self):
    return train_iter.get_state()

  def set_state(self, state):
    train_iter.set_state(state)

  def close(self):
    train_iter.close()


if __name__ == "__main__":
  train.train(cfg, (FailingAtStep3(), eval_iter))
"""


def test_an_exception_in_the_loop_and_a_normal_end_leave_nothing(tmp_path, sample_dir, jax_cache):
  out = tmp_path / "runs"
  script = tmp_path / "raising.py"
  script.write_text(_RAISING)
  overrides = json.dumps(_overrides(sample_dir, out, "raising", 10))
  shm = set(os.listdir("/dev/shm"))
  code, _, err = processes.finish(
    processes.start([sys.executable, str(script), overrides], jax_cache), shm
  )
  assert code == 1 and "RuntimeError: step 3 fails" in err, err[-2000:]

  shm = set(os.listdir("/dev/shm"))
  argv = _train_argv(_overrides(sample_dir, out, "normal", 5))
  code, _, err = processes.finish(processes.start(argv, jax_cache), shm)
  assert code == 0, err[-2000:]
