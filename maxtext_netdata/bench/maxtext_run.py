"""One MaxText training run for `bench --maxtext`, in a process of its own.

`python -m maxtext_netdata.bench.maxtext_run [--hook MODULE:FUNCTION] MAXTEXT_YAML key=value...`
runs MaxText's own trainer (`maxtext-train`, so `network_grain` works) with one addition: every
training step's metrics (`metrics_file`, TensorBoard) gain `perf/data_wait_seconds`, the time
MaxText's `DataLoader.load_next_batch` took for the step's batch, for every dataset type (for
`network_grain` the plugin's own figure is kept). `--hook` calls `FUNCTION()` of `MODULE` first:
changes to MaxText's loop or input pipeline that bench should measure as they will run.

A process per run: MaxText keeps global state (its config, JAX's compilation cache options,
the profiler), and its Grain workers and shared memory go away with the process. bench forks
each from a server that has imported MaxText already (`maxtext_preload`) and runs `run_logged`
there, as the command line would run `main`.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import importlib
import importlib.util
import os
import sys
import time

from maxtext_netdata.errors import UserError

_LAST_WAIT: list[float] = []


def check_hook(spec: str | None) -> tuple[str, str] | None:
  """(module, function) of a `MODULE:FUNCTION` spec (None: no hook), the module found but not
  imported: a hook may patch MaxText, so it is imported once MaxText is, and a spec that
  cannot work fails before MaxText's import (seconds) rather than after.

  Raises:
    UserError: the spec is malformed or its module is nowhere to be found.
  """
  if not spec:
    return None
  module_name, _, function_name = spec.partition(":")
  if not module_name or not function_name:
    raise UserError(f"--loop-hook={spec!r} must be MODULE:FUNCTION")
  try:
    found = importlib.util.find_spec(module_name) is not None
  except (ImportError, ValueError) as e:  # a parent package that is missing or broken
    raise UserError(f"--loop-hook={spec!r}: {e}") from None
  if not found:
    raise UserError(f"--loop-hook={spec!r}: No module named {module_name!r}")
  return module_name, function_name


def call_hook(spec: str | None) -> None:
  """Imports `MODULE` and calls `FUNCTION()` for a `MODULE:FUNCTION` spec (None: nothing).

  Raises:
    UserError: the spec is malformed or names nothing importable.
  """
  checked = check_hook(spec)
  if checked is None:
    return
  module_name, function_name = checked
  try:
    function = getattr(importlib.import_module(module_name), function_name)
  except (ImportError, AttributeError) as e:
    raise UserError(f"--loop-hook={spec!r}: {e}") from None
  function()


def time_data_loading() -> None:
  """Adds `perf/data_wait_seconds` (seconds in `DataLoader.load_next_batch`) to MaxText's
  per-step training metrics, unless the plugin already set it."""
  from maxtext.common import data_loader, metric_logger

  loader = data_loader.DataLoader
  if getattr(loader.load_next_batch, "_bench_timed", False):
    return
  original_load = loader.load_next_batch

  @functools.wraps(original_load)
  def load_next_batch(self, *args, **kwargs):
    start = time.perf_counter()
    try:
      return original_load(self, *args, **kwargs)
    finally:
      _LAST_WAIT[:] = [time.perf_counter() - start]

  load_next_batch._bench_timed = True
  loader.load_next_batch = load_next_batch

  logger = metric_logger.MetricLogger
  original_write = logger.buffer_and_write_metrics

  @functools.wraps(original_write)
  def buffer_and_write_metrics(self, metrics, step, step_time_delta=None, is_training=True):
    if is_training and metrics and _LAST_WAIT:
      metrics["scalar"].setdefault("perf/data_wait_seconds", _LAST_WAIT[0])
    return original_write(self, metrics, step, step_time_delta, is_training)

  logger.buffer_and_write_metrics = buffer_and_write_metrics


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="maxtext_run", description=__doc__.splitlines()[0])
  parser.add_argument("--hook", metavar="MODULE:FUNCTION")
  parser.add_argument("config")
  parser.add_argument("overrides", nargs="*")
  args = parser.parse_args(argv)
  from maxtext_netdata.maxtext import plugin
  from maxtext_netdata.maxtext import train as maxtext_train

  try:
    plugin.install()
    time_data_loading()
    call_hook(args.hook)
    return maxtext_train.run(args)
  except UserError as e:
    print(f"maxtext_run: error: {e}", file=sys.stderr)
    return 2


@contextlib.contextmanager
def logged(log: str, environment: dict[str, str]):
  """Within: this forked process as a program started in `environment` with its output
  (file descriptors 1 and 2, so C code's writes too) to `log`; at the end the exit handlers
  run, as an interpreter's exit would run them (a forked process skips them)."""
  os.environ.clear()
  os.environ.update(environment)
  fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
  os.dup2(fd, 1)
  os.dup2(fd, 2)
  os.close(fd)
  try:
    yield
  finally:
    atexit._run_exitfuncs()  # noqa: SLF001 - what the interpreter's exit would have run
    sys.stdout.flush()
    sys.stderr.flush()


def run_logged(argv: list[str], log: str, environment: dict[str, str]) -> None:
  """`main(argv)` in a process forked from bench's fork server, as `python -m
  maxtext_netdata.bench.maxtext_run ARGV > LOG 2>&1` would run it in bench's `environment`
  (`logged`): its exit status main's. SIGTERM and Ctrl-C unwind the run as they do
  `maxtext-train`, closing its Grain workers."""
  code = 1
  with logged(log, environment):
    from maxtext_netdata import signals
    from maxtext_netdata.maxtext import plugin

    try:
      signals.on_forced_exit(plugin.close_iterators)
      with signals.as_exceptions():
        code = main(argv)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM as signals.Terminated
      code = signals.ended("maxtext_run", e)
  sys.exit(code)


if __name__ == "__main__":
  sys.exit(main())
