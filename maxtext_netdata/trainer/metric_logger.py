"""Training metrics written one step late, so the host never waits for the step it dispatched.

`buffer_and_write_train_metrics(metrics, n, dt)` keeps step n's metrics as they are (device
arrays still being computed) and writes step n-1's, which only then get transferred with
`jax.device_get`. While step n runs, the host fetches step n-1's finished values, writes
them, and goes on to load the next batch: nothing waits on step n. `flush()` writes the
last buffered step at the end of training.

Sinks: a stdout line every `log_period` steps; `<run_dir>/metrics.jsonl`, one JSON object
per step; TensorBoard event files under `<run_dir>/tensorboard` when `enable_tensorboard`.

Each record holds: step, loss, learning_rate, grad_norm, step_time_s (host time between two
step dispatches, which in steady state is the device step time), data_wait_s (host time
blocked on `next(iterator)`), real_tokens (targets with `targets_segmentation != 0`),
tokens_per_s (real tokens only), padding_share, tflops_per_device and mfu (FLOPs of real
tokens only, against `peak_tflops_per_device`), and eval_* values when an eval ran at
that step.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import jax

from maxtext_netdata.config import Config
from maxtext_netdata.errors import WritesTo
from maxtext_netdata.trainer import model


class MetricLogger:
  """Writes per-step training metrics one step late to stdout, JSONL and TensorBoard."""

  def __init__(self, config: Config, num_devices: int, start_step: int = 0):
    """`start_step > 0` continues a resumed run: records of steps >= start_step are dropped."""
    self._config = config
    self._num_devices = num_devices
    self._tokens_per_step = config.global_batch_size(num_devices) * config.max_target_length
    self._flops_per_token = model.training_flops_per_token(config)
    self._buffered: tuple[int, dict[str, Any], float] | None = None
    self._pending_eval: dict[int, dict[str, float]] = {}
    self.history: list[dict[str, Any]] = []
    self.write_seconds = 0.0  # host time spent formatting and writing, device waits excluded

    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    self.metrics_path = run_dir / "metrics.jsonl"
    # In a multi-process run every process computes the same values; process 0 alone writes
    # the files, which would otherwise have several writers in one shared run directory.
    writes_files = jax.process_index() == 0
    kept = _records_before(self.metrics_path, start_step) if start_step > 0 else []
    self._jsonl = open(self.metrics_path if writes_files else os.devnull, "w", encoding="utf-8")
    self._jsonl.writelines(kept)
    self.tensorboard_dir: Path | None = None
    self._tensorboard = None
    if config.enable_tensorboard and writes_files:
      self.tensorboard_dir = run_dir / "tensorboard"
      self._tensorboard = _EventFile(self.tensorboard_dir, start_step if start_step > 0 else None)

  def buffer_and_write_train_metrics(
    self, metrics: dict[str, Any], step: int, step_time_delta: float
  ) -> None:
    """Buffers step `step`'s metrics (not transferred) and writes the previous step's.

    `metrics` maps names to scalars (device arrays or host numbers) and must hold `loss`,
    `learning_rate`, `grad_norm`, `real_tokens` and `data_wait_s`; `step_time_delta` is
    the step's wall time in seconds.
    """
    previous, self._buffered = self._buffered, (step, metrics, step_time_delta)
    if previous is not None:
      self._write(*previous)

  def record_eval(self, metrics: dict[str, float], step: int) -> None:
    """Adds eval values (host floats, named `eval_*`) to the record of `step`."""
    self._pending_eval[step] = metrics
    if self._buffered is None or self._buffered[0] != step:
      self._write_eval_only(step)

  def flush(self) -> None:
    """Writes the buffered step and flushes every sink."""
    if self._buffered is not None:
      self._write(*self._buffered)
      self._buffered = None
    with WritesTo(self.metrics_path):
      self._jsonl.flush()
    if self._tensorboard is not None:
      self._tensorboard.flush()

  def close(self) -> None:
    try:
      self.flush()
    finally:
      with WritesTo(self.metrics_path):
        self._jsonl.close()
      if self._tensorboard is not None:
        self._tensorboard.close()

  def _write(self, step: int, metrics: dict[str, Any], step_time: float) -> None:
    values = jax.device_get(metrics)  # blocks on this (finished or finishing) step only
    start = time.perf_counter()
    real_tokens = int(values["real_tokens"])
    tflops = self._flops_per_token * real_tokens / step_time / self._num_devices / 1e12
    record = {
      "step": step,
      "loss": float(values["loss"]),
      "learning_rate": float(values["learning_rate"]),
      "grad_norm": float(values["grad_norm"]),
      "step_time_s": step_time,
      "data_wait_s": float(values["data_wait_s"]),
      "real_tokens": real_tokens,
      "tokens_per_s": real_tokens / step_time,
      "padding_share": 1.0 - real_tokens / self._tokens_per_step,
      "tflops_per_device": tflops,
      "mfu": tflops / self._config.peak_tflops_per_device,
    }
    record.update(self._pending_eval.pop(step, {}))
    self._emit(record)
    if step % self._config.log_period == 0 or "eval_loss" in record:
      print(_format_line(record), flush=True)
    self.write_seconds += time.perf_counter() - start

  def _write_eval_only(self, step: int) -> None:
    record = {"step": step, **self._pending_eval.pop(step)}
    self._emit(record)
    print(_format_line(record), flush=True)

  def _emit(self, record: dict[str, Any]) -> None:
    self.history.append(record)
    with WritesTo(self.metrics_path):
      self._jsonl.write(json.dumps(record) + "\n")
    if self._tensorboard is not None:
      step = record["step"]
      for name, value in record.items():
        if name != "step":
          self._tensorboard.add_scalar(_tensorboard_tag(name), value, step)


class _EventFile:
  """A TensorBoard event file of scalars, written in the calling thread.

  tensorboardX's `SummaryWriter` writes from a thread of its own, which a failed write (a
  full disk) ends with a traceback; the next events then wait forever for room in its queue,
  and training hangs. Written here with its `EventsWriter` (the same file), a failed write
  is an OSError in the training loop, naming the folder. `purge_step` (a resumed run) hides
  the events of earlier runs from that step on, as `SummaryWriter(purge_step=...)` does.
  """

  def __init__(self, directory: Path, purge_step: int | None):
    from tensorboardX.event_file_writer import EventsWriter  # heavy imports, only when used
    from tensorboardX.proto import event_pb2
    from tensorboardX.summary import scalar

    self._event_pb2, self._scalar = event_pb2, scalar
    self.directory = directory
    directory.mkdir(parents=True, exist_ok=True)
    with WritesTo(directory):
      self._events = EventsWriter(str(directory / "events"))
      if purge_step is not None:
        start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
        self._events.write_event(
          event_pb2.Event(wall_time=time.time(), step=purge_step, session_log=start)
        )

  def add_scalar(self, tag: str, value: float, step: int) -> None:
    event = self._event_pb2.Event(
      wall_time=time.time(), step=step, summary=self._scalar(tag, value)
    )
    with WritesTo(self.directory):
      self._events.write_event(event)

  def flush(self) -> None:
    with WritesTo(self.directory):
      self._events.flush()

  def close(self) -> None:
    with WritesTo(self.directory):
      self._events.close()


def _records_before(path: Path, start_step: int) -> list[str]:
  """Lines of an earlier run's metrics.jsonl whose step is below `start_step`."""
  if not path.exists():
    return []
  kept = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        if json.loads(line)["step"] < start_step:
          kept.append(line)
      except (ValueError, KeyError, TypeError):
        continue  # a line cut short by the interrupted run
  return kept


def _tensorboard_tag(name: str) -> str:
  if name.startswith("eval_"):
    return f"eval/{name[5:]}"
  if name in ("loss", "learning_rate", "grad_norm"):
    return f"learning/{name}"
  return f"perf/{name}"


def _format_line(record: dict[str, Any]) -> str:
  parts = [f"step {record['step']}"]
  if "loss" in record:
    wait_share = record["data_wait_s"] / record["step_time_s"]
    parts += [
      f"loss {record['loss']:.4f}",
      f"lr {record['learning_rate']:.2e}",
      f"step {record['step_time_s'] * 1e3:.1f} ms",
      f"data-wait {wait_share:.1%}",
      f"{record['tokens_per_s']:,.0f} real tok/s",
      f"padding {record['padding_share']:.1%}",
      f"{record['tflops_per_device']:.3f} TFLOP/s/device",
      f"MFU {record['mfu']:.2%}",
    ]
  parts += [f"{name} {value:.4f}" for name, value in record.items() if name.startswith("eval_")]
  return " | ".join(parts)
