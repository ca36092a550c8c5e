"""The metric logger writes step n-1 while step n runs, and never waits for step n."""

import json

import jax
import jax.numpy as jnp
import pytest

from maxtext_netdata import config
from maxtext_netdata.trainer.metric_logger import MetricLogger


def _config(tmp_path, *overrides):
  return config.load(
    None,
    [
      f"base_output_directory={tmp_path}",
      "run_name=log",
      "per_device_batch_size=4",
      "max_target_length=64",
      "log_period=2",
      *overrides,
    ],
  )


@jax.jit
def _slow_step(x):
  """Seconds of dependent matmuls: ample time to see whether the host waits for it."""

  def body(_, y):
    return jnp.tanh(y @ y) * 0.5

  y = jax.lax.fori_loop(0, 60, body, x)
  return {
    "loss": jnp.mean(y),
    "learning_rate": jnp.float32(1e-3),
    "grad_norm": jnp.sum(y[0]),
    "real_tokens": jnp.int32(200),
  }


def _metrics(x, data_wait=0.01):
  return {**_slow_step(x), "data_wait_s": data_wait}


def test_call_returns_before_the_dispatched_step_finishes_and_writes_one_step_late(tmp_path):
  logger = MetricLogger(_config(tmp_path, "enable_tensorboard=false"), num_devices=1)
  x = jax.random.normal(jax.random.key(0), (768, 768)) / 24  # ~0.6 s a step on two cores
  jax.block_until_ready(_slow_step(x))  # compile outside the timed part

  first = _metrics(x)
  jax.block_until_ready(first["loss"])
  logger.buffer_and_write_train_metrics(first, 0, 1.0)
  assert logger.history == []  # step 0 is only buffered

  second = _metrics(x + 1)
  logger.buffer_and_write_train_metrics(second, 1, 2.0)
  # The call wrote step 0 and returned while step 1 still runs: it never waited for it.
  assert not second["loss"].is_ready()
  assert [r["step"] for r in logger.history] == [0]
  assert logger.history[0]["loss"] == pytest.approx(float(first["loss"]))

  logger.close()
  records = [json.loads(line) for line in logger.metrics_path.read_text().splitlines()]
  assert [r["step"] for r in records] == [0, 1]
  assert records[1]["loss"] == pytest.approx(float(second["loss"]))
  assert records[1]["grad_norm"] == pytest.approx(float(second["grad_norm"]))


def test_jsonl_records_hold_the_derived_metrics(tmp_path, capsys):
  cfg = _config(tmp_path, "peak_tflops_per_device=2.0")
  logger = MetricLogger(cfg, num_devices=2)
  for step, real in enumerate([256, 384, 512]):
    metrics = {
      "loss": jnp.float32(3.0 - step),
      "learning_rate": jnp.float32(0.1 * step),
      "grad_norm": jnp.float32(1.5),
      "real_tokens": jnp.int32(real),
      "data_wait_s": 0.05,
    }
    logger.buffer_and_write_train_metrics(metrics, step, 0.5)
  logger.record_eval({"eval_loss": 1.25}, 2)
  logger.close()

  records = [json.loads(line) for line in (tmp_path / "log" / "metrics.jsonl").open()]
  assert [r["step"] for r in records] == [0, 1, 2]
  tokens_per_step = 8 * 64  # 4 sequences per device x 2 devices x 64 tokens
  for record, real in zip(records, [256, 384, 512], strict=True):
    assert record["real_tokens"] == real
    assert record["tokens_per_s"] == pytest.approx(real / 0.5)
    assert record["padding_share"] == pytest.approx(1 - real / tokens_per_step)
    assert record["step_time_s"] == 0.5
    assert record["data_wait_s"] == 0.05
    assert record["mfu"] == pytest.approx(record["tflops_per_device"] / 2.0)
  assert records[2]["loss"] == pytest.approx(1.0)
  assert records[2]["eval_loss"] == 1.25
  assert records[1]["tflops_per_device"] == pytest.approx(1.5 * records[0]["tflops_per_device"])
  lines = capsys.readouterr().out.splitlines()
  assert [line.split(" | ")[0] for line in lines] == ["step 0", "step 2"]  # log_period=2
  assert any(
    f.name.startswith("events.out.tfevents") for f in (tmp_path / "log" / "tensorboard").iterdir()
  )


def test_resumed_run_keeps_earlier_records_and_replaces_later_ones(tmp_path):
  cfg = _config(tmp_path, "enable_tensorboard=false")
  metrics = {
    "loss": jnp.float32(1.0),
    "learning_rate": jnp.float32(0.0),
    "grad_norm": jnp.float32(0.0),
    "real_tokens": jnp.int32(10),
    "data_wait_s": 0.0,
  }
  logger = MetricLogger(cfg, num_devices=1)
  for step in range(5):
    logger.buffer_and_write_train_metrics(metrics, step, 1.0)
  logger.close()

  resumed = MetricLogger(cfg, num_devices=1, start_step=3)
  resumed.buffer_and_write_train_metrics({**metrics, "loss": jnp.float32(2.0)}, 3, 1.0)
  resumed.close()
  records = [json.loads(line) for line in resumed.metrics_path.open()]
  assert [(r["step"], r["loss"]) for r in records] == [(0, 1.0), (1, 1.0), (2, 1.0), (3, 2.0)]
