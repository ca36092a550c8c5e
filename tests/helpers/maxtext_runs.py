"""MaxText training runs forked from a server that imported MaxText's trainer once.

`python -m maxtext_netdata.maxtext.train` spends ~10 s of a 2-core VM importing MaxText's
trainer before it reads its config, more than a tiny model's whole run. The plugin tests that
look at what runs train, not at how the command starts, start each run as `bench --maxtext`
starts its own (`maxtext_netdata.bench.maxtext_preload`): forked from this pytest process's
multiprocessing fork server, which imported the trainer on its first use, each run executes
what the command executes (`cli.main(["maxtext-train", ...])`) in its own session and
environment, its output to a log file. The tests of the command itself (its signals, the
processes and /dev/shm entries it leaves) start it as a program.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

# Not pytest at module level: the runs import this module, and MaxText leaves `jax.distributed`
# alone in a process that has imported pytest.


def start(args: list[str], environment: dict[str, str], log: Path | str):
  """`maxtext-netdata maxtext-train ARGS` in `environment`, its output to `log`, forked from
  the fork server (started, importing MaxText's trainer, on the first call): the started
  `multiprocessing.Process`."""
  context = multiprocessing.get_context("forkserver")
  context.set_forkserver_preload(["maxtext_netdata.bench.maxtext_preload"])
  process = context.Process(target=_maxtext_train, args=(list(args), str(log), dict(environment)))
  process.start()
  return process


def finish(process, timeout: float, log: Path | str) -> int:
  """The exit status of a run `start` started. A run still going after `timeout` seconds
  fails the test with its threads' stacks (SIGABRT: faulthandler prints them, as
  tests/conftest.py turns it on in every child), and every process of its session is killed."""
  import pytest  # noqa: PLC0415

  process.join(timeout)
  if process.exitcode is None:
    with contextlib.suppress(ProcessLookupError):
      os.kill(process.pid, signal.SIGABRT)
    process.join(15)
    kill(process)
    stacks = Path(log).read_text(encoding="utf-8", errors="replace")[-6000:]
    pytest.fail(f"run still going {timeout} s; where it was:\n{stacks}")
  return process.exitcode


def kill(process) -> None:
  """Every process of the run's session, if any is left."""
  with contextlib.suppress(ProcessLookupError):
    os.killpg(process.pid, signal.SIGKILL)
  deadline = time.monotonic() + 30
  while process.exitcode is None and time.monotonic() < deadline:
    process.join(0.1)


def _maxtext_train(args: list[str], log: str, environment: dict[str, str]) -> None:
  """What `python -m maxtext_netdata.maxtext.train ARGS > LOG 2>&1` runs, in a session of
  its own (its Grain workers with it, for `kill`)."""
  os.setsid()
  from maxtext_netdata.bench import maxtext_run

  code = 1
  with maxtext_run.logged(log, environment):
    from maxtext_netdata import cli

    code = cli.main(["maxtext-train", *args])
  sys.exit(code)
