"""The MaxText-style trainer: `maxtext-netdata train CONFIG [key=value ...]`.

One process drives every local device: a `data` mesh over all devices, parameters and
optimizer state replicated, the batch split over `data_sharding`. Each step the host takes
the next global batch from the input pipeline (timed as data wait), dispatches the jitted
train step and hands its metrics, still on device, to the metric logger, which writes the
previous step's. Checkpoints (Orbax) hold the train state and the iterator position; a
restart in the same run directory resumes from the latest one and sees the batches an
uninterrupted run would have seen.

Configs that cannot work (a global batch not divisible over the devices, sequences shorter
than one measurement, no training files) fail before any data is read or code compiled.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils

from maxtext_netdata.config import Config, ConfigError, compile_options, initialize, load
from maxtext_netdata.distributed import multihost
from maxtext_netdata.distributed.mesh import batch_sharding, make_mesh, replicated
from maxtext_netdata.errors import WritesTo
from maxtext_netdata.format import tokens as tk
from maxtext_netdata.input_pipeline.interface import global_batch_size
from maxtext_netdata.trainer import attention, checkpointing, evaluation, model, report
from maxtext_netdata.trainer.arguments import add_arguments
from maxtext_netdata.trainer.metric_logger import MetricLogger
from maxtext_netdata.trainer.profiler import Profiler

# Records left out of the summary's timings: the first step compiles, the second one's
# interval still includes waiting for the first.
_WARMUP_RECORDS = 2


def check_config(config: Config, mesh: jax.sharding.Mesh) -> int:
  """Raises ConfigError for a config that cannot train on `mesh`; returns the global batch."""
  try:
    model.check_model_config(config)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  if config.attention in ("cudnn", "cudnn_packed") and not attention.cudnn_may_run(config.dtype):
    raise ConfigError(
      f"attention={config.attention} needs an NVIDIA GPU and dtype bfloat16 or float16"
      f" (cuDNN's fused kernel); here: {jax.default_backend()}, dtype={config.dtype}."
      " attention=dot_product runs anywhere"
    )
  if config.attention == "pallas" and jax.default_backend() != "gpu":
    raise ConfigError(
      f"attention=pallas needs a GPU (Pallas's flash-attention kernel lowers through Triton;"
      f" elsewhere it runs interpreted, far too slow to train); here: {jax.default_backend()}."
      " attention=dot_product runs anywhere"
    )
  if config.max_target_length < tk.LONGEST_MEASUREMENT:
    raise ConfigError(
      f"max_target_length={config.max_target_length} cannot hold one measurement: an IPv6"
      f" measurement with an absolute timestamp takes {tk.LONGEST_MEASUREMENT} tokens"
    )
  return global_batch_size(config, mesh)


def make_optimizer(config: Config) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """AdamW with linear warmup and cosine decay over `learning_rate_schedule_steps`."""
  schedule_steps = config.learning_rate_schedule_steps
  if schedule_steps <= 0:
    schedule_steps = config.steps
  warmup = int(config.warmup_steps_fraction * schedule_steps)
  schedule = optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=config.learning_rate,
    warmup_steps=warmup,
    decay_steps=max(schedule_steps, warmup + 1),
    end_value=config.learning_rate * config.cosine_learning_rate_final_fraction,
  )
  adamw = optax.adamw(
    schedule,
    b1=config.adam_b1,
    b2=config.adam_b2,
    eps=config.adam_eps,
    weight_decay=config.adam_weight_decay,
  )
  if config.gradient_clipping_threshold > 0:
    adamw = optax.chain(optax.clip_by_global_norm(config.gradient_clipping_threshold), adamw)
  if config.optimizer_flatten:
    # The state is replicated (`Trainer.state_sharding`), so one flat vector loses no sharding.
    adamw = optax.flatten(adamw)
  return adamw, schedule


def masked_loss(logits: jax.Array, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
  """Mean cross-entropy over real targets (`targets_segmentation != 0`), and their count."""
  losses = evaluation.token_losses(logits, batch["targets"])
  learned = batch["targets_segmentation"] != 0
  real_tokens = jnp.sum(learned)
  return jnp.sum(losses * learned) / jnp.maximum(real_tokens, 1), real_tokens


def _compile_options(flags: str) -> dict[str, str | bool] | None:
  """`compile_xla_flags` as the steps' `compiler_options` (MaxText compiles its steps with
  them), tried on an empty program first: an option XLA does not know, or a value it cannot
  read, is a one-line ConfigError here rather than a traceback at the first step."""
  options = compile_options(flags)
  if not options:
    return None
  try:
    jax.jit(lambda: 0, compiler_options=options).lower().compile()
  except jax.errors.JaxRuntimeError as e:
    raise ConfigError(f"compile_xla_flags={flags!r}: {str(e).splitlines()[0]}") from None
  return options


class Trainer:
  """The jitted init / train / eval functions of one config on one mesh."""

  def __init__(self, config: Config, mesh: jax.sharding.Mesh):
    self.config = config
    self.model = model.Transformer(config)
    self.optimizer, self.schedule = make_optimizer(config)
    self.state_sharding = replicated(mesh)
    self.batch_sharding = batch_sharding(config, mesh)
    self.init_state = jax.jit(self._init_state, out_shardings=self.state_sharding)
    options = _compile_options(config.compile_xla_flags)
    self.train_step = jax.jit(
      self._train_step,
      in_shardings=(self.state_sharding, self.batch_sharding),
      out_shardings=(self.state_sharding, self.state_sharding),
      donate_argnums=0,
      compiler_options=options,
    )
    self.eval_step = jax.jit(
      evaluation.make_eval_step(self.model.apply, config.vocab_size),
      in_shardings=(self.state_sharding, self.batch_sharding),
      out_shardings=self.state_sharding,
      compiler_options=options,
    )

  def _init_state(self, rng: jax.Array) -> dict[str, Any]:
    params = model.init_params(self.config, rng)
    return {
      "step": jnp.zeros((), jnp.int32),
      "params": params,
      "opt_state": self.optimizer.init(params),
    }

  def abstract_state(self) -> Any:
    """Shapes, dtypes and shardings of the state, for restoring without initializing."""
    shapes = jax.eval_shape(self._init_state, jax.random.key(0))
    return jax.tree.map(
      lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=self.state_sharding), shapes
    )

  def _train_step(self, state: dict[str, Any], batch: dict[str, jax.Array]):
    def loss_fn(params):
      logits = self.model.apply(
        {"params": params},
        batch["inputs"],
        batch["inputs_position"],
        batch["inputs_segmentation"],
      )
      return masked_loss(logits, batch)

    (loss, real_tokens), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
    updates, opt_state = self.optimizer.update(grads, state["opt_state"], state["params"])
    new_state = {
      "step": state["step"] + 1,
      "params": optax.apply_updates(state["params"], updates),
      "opt_state": opt_state,
    }
    metrics = {
      "loss": loss,
      "real_tokens": real_tokens,
      "learning_rate": self.schedule(state["step"]),
      "grad_norm": optax.global_norm(grads),
    }
    return new_state, metrics


def _rtt_baseline(config: Config):
  """The unigram RTT baseline of the training split (network_grain only)."""
  if config.dataset_type != "network_grain":
    return None
  from maxtext_netdata.data.prepare import prepare  # only network_grain has a prepared store

  splits = prepare.ensure_prepared(config, progress=False)  # cached: the pipeline made it
  return evaluation.rtt_unigram_log_probs(splits.train, config.vocab_size)


def _summary(config: Config, logger: MetricLogger, trainer_params: int) -> dict[str, Any]:
  train_records = [r for r in logger.history if "loss" in r]
  timed = train_records[_WARMUP_RECORDS:] or train_records
  step_time = sum(r["step_time_s"] for r in timed)
  evals = [r for r in logger.history if "eval_loss" in r]
  summary = {
    "run_dir": str(config.run_dir),
    "dataset_type": config.dataset_type,
    "num_params": trainer_params,
    "steps": len(train_records),
    "last_step": train_records[-1]["step"] if train_records else None,
    "mean_step_time_s": step_time / len(timed) if timed else None,
    "median_step_time_s": float(np.median([r["step_time_s"] for r in timed])) if timed else None,
    "median_step_time_se_s": report.median_standard_error([r["step_time_s"] for r in timed]),
    "data_wait_share": sum(r["data_wait_s"] for r in timed) / step_time if timed else None,
    "real_tokens_per_s": sum(r["real_tokens"] for r in timed) / step_time if timed else None,
    "padding_share": float(np.mean([r["padding_share"] for r in timed])) if timed else None,
    "mfu": float(np.mean([r["mfu"] for r in timed])) if timed else None,
    "first_loss": train_records[0]["loss"] if train_records else None,
    "final_loss": train_records[-1]["loss"] if train_records else None,
    "logger_write_s_per_step": logger.write_seconds / max(len(logger.history), 1),
    "metrics_path": str(logger.metrics_path),
    "tensorboard_dir": str(logger.tensorboard_dir) if logger.tensorboard_dir else None,
  }
  if evals:
    summary.update({k: v for k, v in evals[-1].items() if k.startswith("eval_")})
  return summary


class _StopRequest:
  """SIGTERM (how Slurm, Kubernetes and preemptible VMs stop a job) as a request to stop.

  The loop then saves a checkpoint at a step boundary and returns, closing the Grain workers on
  the way out. One process: a SIGTERM handler records the request and the next step boundary
  is the one (only the main thread can own a handler; elsewhere SIGTERM keeps its previous
  disposition). With `jax.distributed` running, the hosts of a job get their notices at
  different moments, and a host that stopped alone would leave the others waiting in the next
  step's collectives and itself in the checkpoint's barrier (a SIGTERM to one of two processes
  hung both). There JAX's preemption service (on by default) takes SIGTERM on every process,
  and `reached_preemption_sync_point`, asked after every step, turns true on all of them at
  the same step.
  """

  def __init__(self):
    self.requested: str | None = None
    self._previous = None
    self._synced = False

  def install(self) -> None:
    if jax.distributed.is_initialized():
      return  # JAX's preemption notifier owns SIGTERM; `begin` checks that it runs
    self._install_handler()

  def begin(self, step: int) -> None:
    """Called once before the first step, `step` being the step training starts from."""
    if not jax.distributed.is_initialized():
      return
    try:
      self._synced = True
      self.poll(step)
    except RuntimeError:  # jax_enable_preemption_service off: each process on its own
      self._synced = False
      self._install_handler()

  def poll(self, completed: int) -> None:
    """After each step: with the preemption service, whether all processes stop here."""
    if self._synced and not self.requested:
      if multihost_utils.reached_preemption_sync_point(completed):
        self.requested = "SIGTERM"

  def _install_handler(self) -> None:
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame) -> None:
    self.requested = signal.Signals(signum).name

  def uninstall(self) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None


def train(
  config: Config,
  data_iterators: tuple[Iterator, Iterator | None] | None = None,
) -> dict[str, Any]:
  """Trains `config.steps` steps (resuming from the latest checkpoint) and returns a summary.

  `data_iterators` replaces `create_data_iterator(config, mesh)`: a (train, eval or None)
  pair yielding global batches sharded like the pipeline's and offering
  `get_state()`/`set_state()`. The summary (which process 0 also writes to
  `<run_dir>/summary.json`) holds steps, mean_step_time_s (first steps excluded),
  data_wait_share, real_tokens_per_s, first/final loss, the last eval_* values,
  logger_write_s_per_step, the output paths and `stopped_by` ("SIGTERM" when a SIGTERM
  stopped the run early, after saving a checkpoint at the next step boundary; else None).
  """
  multihost.initialize_distributed(config)
  mesh = make_mesh(config)
  global_batch = check_config(config, mesh)
  train_iter = eval_iter = checkpoints = logger = profiler = None
  stop = _StopRequest()
  failing = False
  try:
    stop.install()
    # No worker process runs yet: the iterators start them at start_prefetch / first batch,
    # so a manager that fails, or a restore, happens before any worker or prefetched batch.
    if data_iterators is None:
      from maxtext_netdata.input_pipeline import create_data_iterator

      data_iterators = create_data_iterator(config, mesh)
    train_iter, eval_iter = data_iterators
    checkpoints = checkpointing.Checkpoints(config) if config.enable_checkpointing else None
    trainer = Trainer(config, mesh)
    print(
      f"train: {model.num_params(config) / 1e6:.1f}M parameters, {mesh.size} devices,"
      f" global batch {global_batch} x {config.max_target_length} tokens,"
      f" dataset_type={config.dataset_type}",
      flush=True,
    )
    start_step = 0
    restored = checkpoints.restore_latest(trainer.abstract_state()) if checkpoints else None
    if restored is not None:
      start_step, state, iterator_state = restored
      train_iter.set_state(iterator_state)
      print(f"train: resumed from {checkpointing.checkpoint_dir(config)}/{start_step}")
    else:
      state = trainer.init_state(jax.random.key(0))
      if config.load_parameters_path:
        abstract = trainer.abstract_state()
        state["params"] = checkpointing.load_params(config.load_parameters_path, abstract)
        print(f"train: parameters from {config.load_parameters_path}")
    stop.begin(start_step)
    if hasattr(train_iter, "start_prefetch"):
      train_iter.start_prefetch()  # workers fill their buffers while the step compiles
    if start_step >= config.steps:
      print(f"train: {config.run_dir} already holds all {config.steps} steps; nothing to do")
    if config.eval_interval > 0 and eval_iter is None:
      print(f"train: dataset_type={config.dataset_type} has no eval data; no eval runs")
    eval_start = eval_iter.get_state() if eval_iter is not None else None
    rtt_log_probs = _rtt_baseline(config) if eval_iter is not None else None
    logger = MetricLogger(config, mesh.size, start_step)
    profiler = Profiler(config, start_step)

    last = time.perf_counter()
    for step in range(start_step, config.steps):
      wait_start = time.perf_counter()
      try:
        batch = next(train_iter)
      except StopIteration:
        print(f"train: the data ended after {step} steps (num_epoch={config.num_epoch})")
        break
      data_wait = time.perf_counter() - wait_start
      profiler.before_step(step, state)
      state, metrics = trainer.train_step(state, batch)
      profiler.after_step(step, state)
      metrics["data_wait_s"] = data_wait
      now = time.perf_counter()
      logger.buffer_and_write_train_metrics(metrics, step, now - last)
      last = now
      completed = step + 1
      stop.poll(completed)
      eval_due = config.eval_interval > 0 and (
        completed % config.eval_interval == 0 or completed == config.steps
      )
      if eval_due and eval_iter is not None and not stop.requested:
        eval_iter.set_state(eval_start)  # every eval sees the same batches
        logger.record_eval(
          evaluation.evaluate(
            trainer.eval_step, state["params"], eval_iter, config.eval_steps, rtt_log_probs
          ),
          step,
        )
        last = time.perf_counter()  # eval time is no step time
      last_step = completed == config.steps
      due = completed % config.checkpoint_period == 0 or last_step or stop.requested
      if checkpoints is not None and due:
        checkpoints.save(completed, state, train_iter.get_state())
      elif checkpoints is not None:
        checkpoints.check()  # a failed save stops the run at the step it is seen
      if stop.requested and not last_step:
        print(
          f"train: {stop.requested} received; stopped after step {completed}"
          + (f", checkpoint {checkpoints.directory}/{completed}" if checkpoints else ""),
          flush=True,
        )
        break
    logger.flush()
  except BaseException:
    failing = True
    raise
  finally:
    closers = [stop.uninstall]
    closers += [profiler.close] if profiler is not None else []
    closers += [logger.close] if logger is not None else []
    closers += [checkpoints.close] if checkpoints is not None else []
    closers += [i.close for i in (train_iter, eval_iter) if i is not None and hasattr(i, "close")]
    _close_all(closers, failing)
  summary = _summary(config, logger, model.num_params(config))
  summary["stopped_by"] = stop.requested
  if jax.process_index() == 0:  # one writer per shared run directory, as for the metrics
    summary_path = config.run_dir / "summary.json"
    with WritesTo(summary_path):
      summary_path.write_text(json.dumps(summary, indent=2) + "\n")
  return summary


def _close_all(closers: list[Callable[[], None]], failing: bool) -> None:
  """Calls every closer, whatever fails; raises the first failure unless `failing` already.

  A full disk fails a save, then the metrics' flush and the next save: the first is the news,
  and the data iterators must be closed all the same (their workers, their /dev/shm blocks).
  """
  first = None
  for close in closers:
    try:
      close()
    except Exception as e:
      first = first or e
  if first is not None and not failing:
    raise first


def run(args: argparse.Namespace) -> int:
  summary = train(load(args.config, args.overrides))
  print("train summary: " + json.dumps(summary, indent=2))
  return 128 + signal.SIGTERM if summary["stopped_by"] else 0


def main(argv: list[str] | None = None) -> dict[str, Any]:
  """MaxText's entry: `main(["prog", CONFIG, "key=value", ...])` → the run's summary.

  `-h`/`--help` prints `maxtext-netdata train`'s help and exits 0.
  """
  argv = list(sys.argv if argv is None else argv)
  if any(arg in ("-h", "--help") for arg in argv[1:]):
    parser = argparse.ArgumentParser(
      prog="maxtext-netdata train", description="train a model (MaxText-style trainer)"
    )
    add_arguments(parser)
    parser.parse_args(["--help"])  # prints the help and exits 0
  summary = train(initialize(argv))
  print("train summary: " + json.dumps(summary, indent=2))
  return summary


if __name__ == "__main__":
  main()
