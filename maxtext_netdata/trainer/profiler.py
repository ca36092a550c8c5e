"""MaxText's profiler window (`profiler: xplane`): a JAX profiler trace of `profiler_steps`
training steps that starts after the first `skip_first_n_steps_for_profiler`, into
`<run_dir>/profile` (docs/spec.md, "Config keys").

A trace of the whole run would hold the compile: with unrolled layers (`scan_layers: false`)
its Python tracing alone filled 5M trace events on an H200 and tripled the time `bench
--profile` took there. The window waits for the steps before it to finish, so that the trace
starts with an empty device queue, and for its own last step before it stops, so that every
kernel of its steps is in the trace: the only two host syncs, and only with the profiler on.
`jax.profiler` has the start and stop; this class only places them in the loop.
"""

from __future__ import annotations

from pathlib import Path

import jax

from maxtext_netdata.config import Config


def trace_dir(run_dir: str | Path) -> Path:
  """Where `profiler: xplane` writes a run's trace: `<run_dir>/profile`."""
  return Path(run_dir) / "profile"


class Profiler:
  """Starts the trace before step `start_step + skip_first_n_steps_for_profiler` and stops it
  after `profiler_steps` steps, or at `close` when the run ends first."""

  def __init__(self, config: Config, start_step: int):
    self.directory = trace_dir(config.run_dir)
    self.first = start_step + config.skip_first_n_steps_for_profiler if config.profiler else None
    self.last = None if self.first is None else self.first + config.profiler_steps - 1
    self.perfetto = config.profiler_perfetto
    self.active = False

  def before_step(self, step: int, state) -> None:
    """Starts the trace when `step` is the window's first, `state` (the steps before) done."""
    if step == self.first:
      jax.block_until_ready(state)
      jax.profiler.start_trace(str(self.directory), create_perfetto_trace=self.perfetto)
      self.active = True

  def after_step(self, step: int, state) -> None:
    """Stops the trace once `step`, the window's last, has run (`state` its output)."""
    if self.active and step == self.last:
      jax.block_until_ready(state)
      self.close()

  def close(self) -> None:
    """Stops a trace still running (the data or a signal ended the run inside the window)."""
    if self.active:
      self.active = False
      jax.profiler.stop_trace()
