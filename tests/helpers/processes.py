"""Child runs in their own session, and what they leave behind: processes and /dev/shm entries.

`start(argv)` runs a command in a new session (`popen`, which the multi-process tests use too)
with SIGINT's default disposition (a process started from a background job inherits SIGINT
ignored, and Python then never raises KeyboardInterrupt) and samples the /dev/shm entries the
session's processes open or map while it runs: other processes on the machine create and remove
/dev/shm entries too, so a plain before/after count of the folder would blame them.
`finish(proc, shm_before)` waits for it and asserts that no process of the session and no
/dev/shm entry it used is left. `train_argv` is the tiny training run these tests start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

# A model small enough that a CPU step takes milliseconds.
TINY_TRAINER = [
  "base_num_decoder_layers=1",
  "base_emb_dim=32",
  "base_num_query_heads=2",
  "base_num_kv_heads=2",
  "head_dim=16",
  "base_mlp_dim=64",
  "max_target_length=128",
  "per_device_batch_size=4",
  "learning_rate_schedule_steps=100",
]

REPO = Path(__file__).resolve().parents[2]


def train_overrides(sample_dir, out: Path, run_name: str, steps: int, workers: int) -> list[str]:
  """`maxtext-netdata train configs/smoke.yml` overrides: the tiny model on the sample data,
  writing under `out` (the store beside it), no eval, no periodic checkpoint."""
  return [
    f"grain_train_files={sample_dir}/*.parquet",
    f"base_output_directory={out}",
    f"network_prepared_dir={out.parent}/prepared",
    f"run_name={run_name}",
    f"steps={steps}",
    f"grain_worker_count={workers}",
    "eval_interval=-1",
    "checkpoint_period=100000",
    "enable_tensorboard=false",
    *TINY_TRAINER,
  ]


def train_argv(overrides: list[str]) -> list[str]:
  return [sys.executable, "-m", "maxtext_netdata", "train", "configs/smoke.yml", *overrides]


def start(argv: list[str], jax_cache: str) -> subprocess.Popen:
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    PYTHONPATH=str(REPO),
    JAX_COMPILATION_CACHE_DIR=jax_cache,
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
  )
  proc = popen(argv, env)
  proc.shm_watch = _ShmWatch(proc)
  return proc


# Runs its arguments as a command (exec: the same pid) with SIGINT's default disposition, which
# an exec keeps. Where a `preexec_fn` would do it in the forked child, that child runs Python
# code while it holds a copy of every lock the test process's threads (JAX's) held at the fork:
# Python 3.12 warns of it ("os.fork() was called ... will likely lead to a deadlock").
_SIGINT_DEFAULT = (
  "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL);"
  " os.execvp(sys.argv[1], sys.argv[1:])"
)


def with_sigint_default(argv: list[str]) -> list[str]:
  """`argv` started with SIGINT's default disposition, though this process ignores it."""
  return [sys.executable, "-c", _SIGINT_DEFAULT, *argv]


def popen(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
  """`argv` from the repository root with `env`, output captured as text, in a session of its
  own (so `os.killpg(proc.pid, ...)` reaches every process it starts) with SIGINT's default
  disposition."""
  return subprocess.Popen(
    with_sigint_default(argv),
    cwd=REPO,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    start_new_session=True,
  )


def communicate_or_fail(
  proc: subprocess.Popen, timeout: float, log: Path | str | None = None, when: str = ""
) -> tuple[str | None, str | None]:
  """`proc.communicate(timeout=timeout)`; a run still going then fails the test with its
  threads' stacks (`stacks_and_kill`), from its stderr or from `log` where its stderr goes."""
  try:
    return proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    pytest.fail(f"run still going {timeout} s{when}; where it was:\n{stacks_and_kill(proc, log)}")


def stacks_and_kill(proc: subprocess.Popen, log: Path | str | None) -> str:
  """The end of what `proc` wrote to stderr after a SIGABRT, on which Python's faulthandler
  (on in every child: tests/conftest.py sets PYTHONFAULTHANDLER) prints each thread's stack;
  then every process of its session is killed."""
  err = None
  with contextlib.suppress(ProcessLookupError):
    os.kill(proc.pid, signal.SIGABRT)
  with contextlib.suppress(subprocess.TimeoutExpired):
    _, err = proc.communicate(timeout=15)
  with contextlib.suppress(ProcessLookupError):
    os.killpg(proc.pid, signal.SIGKILL)
  proc.communicate()
  if err is None and log is not None:
    err = Path(log).read_text(encoding="utf-8", errors="replace")
  return (err or "(no stderr)")[-6000:]


def session(sid: int) -> list[psutil.Process]:
  alive = []
  for process in psutil.process_iter():
    try:
      if os.getsid(process.pid) == sid:
        alive.append(process)
    except (ProcessLookupError, PermissionError):
      continue
  return alive


class _ShmWatch(threading.Thread):
  """Sampled until the session's leader ends: the /dev/shm entries its processes open or map
  (`seen`) and, per sample, how many child processes besides the resource tracker it has
  (`most_workers`). Read `seen` through `names()` while the watch runs: iterating the set
  itself races with the watch's updates ("Set changed size during iteration")."""

  def __init__(self, proc: subprocess.Popen):
    super().__init__(daemon=True)
    self.proc = proc
    self.seen: set[str] = set()
    self._lock = threading.Lock()
    self.most_workers: list[int] = []
    self.start()

  def run(self) -> None:
    while self.proc.poll() is None:
      workers = 0
      for process in session(self.proc.pid):
        found = _shm_of(process.pid)
        with self._lock:
          self.seen.update(found)
        try:
          command = " ".join(process.cmdline())
        except psutil.Error:
          continue
        workers += process.pid != self.proc.pid and "resource_tracker" not in command
      self.most_workers.append(workers)
      time.sleep(0.05)

  def names(self) -> set[str]:
    """A copy of `seen` as it is now."""
    with self._lock:
      return set(self.seen)


def _shm_of(pid: int) -> set[str]:
  names = set()
  try:
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
      names.update(line.split("/dev/shm/")[1].split()[0] for line in f if "/dev/shm/" in line)
    for fd in os.listdir(f"/proc/{pid}/fd"):
      target = os.readlink(f"/proc/{pid}/fd/{fd}")
      if target.startswith("/dev/shm/"):
        names.add(target.removeprefix("/dev/shm/").split()[0])
  except OSError:
    pass
  return names


def finish(
  proc: subprocess.Popen, shm_before: set[str], timeout: float = 120, log: Path | None = None
):
  """Waits for `proc`; asserts nothing of its session and no /dev/shm entry it used is left.

  A run still going after `timeout` fails the test with its threads' stacks
  (`communicate_or_fail`)."""
  watch = proc.shm_watch
  out, err = communicate_or_fail(proc, timeout, log, " after it was asked to end")
  deadline = time.monotonic() + 30
  while session(proc.pid) and time.monotonic() < deadline:
    time.sleep(0.2)
  left = [" ".join(p.cmdline()[:3]) for p in session(proc.pid)]
  for process in session(proc.pid):
    process.kill()
  assert left == [], f"processes left behind: {left}\n{err[-2000:]}"
  watch.join()
  leaked = (set(os.listdir("/dev/shm")) - shm_before) & watch.seen
  assert watch.seen, "the run used no /dev/shm entry: the watch saw nothing"
  assert leaked == set(), f"/dev/shm entries left behind: {sorted(leaked)[:5]}"
  return proc.returncode, out, err
