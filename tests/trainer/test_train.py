"""The trainer: loss falls, resume is exact, impossible configs fail before compiling."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from train_helpers import IndexedBatches

from maxtext_netdata import config
from maxtext_netdata.config import ConfigError
from maxtext_netdata.distributed.mesh import make_mesh
from maxtext_netdata.errors import DataError
from maxtext_netdata.input_pipeline import create_data_iterator
from maxtext_netdata.trainer import train

TINY_MODEL = [
  "base_num_decoder_layers=2",
  "base_emb_dim=64",
  "base_num_query_heads=4",
  "base_num_kv_heads=4",
  "head_dim=16",
  "base_mlp_dim=128",
  "dtype=float32",
  "max_target_length=64",
  "per_device_batch_size=4",
  "learning_rate=1e-2",
  "log_period=5",
]


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(tmp_path_factory):
  """Runs of one model share compiled steps, as separate processes would through the cache."""
  jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("jax_cache")))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  yield
  jax.config.update("jax_compilation_cache_dir", None)


def _config(tmp_path, *overrides):
  return config.load(
    "configs/smoke.yml",
    [f"base_output_directory={tmp_path}", "dataset_type=synthetic", *TINY_MODEL, *overrides],
  )


class Digesting:
  """Passes batches through, recording a sha256 of each (all six arrays, in key order)."""

  def __init__(self, iterator, digests):
    self._iterator = iterator
    self._digests = digests

  def __iter__(self):
    return self

  def __next__(self):
    batch = next(self._iterator)
    h = hashlib.sha256()
    for key in sorted(batch):
      h.update(np.asarray(jax.device_get(batch[key])).tobytes())
    self._digests.append(h.hexdigest())
    return batch

  def get_state(self):
    return self._iterator.get_state()

  def set_state(self, state):
    self._iterator.set_state(state)

  def close(self):
    if hasattr(self._iterator, "close"):
      self._iterator.close()


def _run(cfg, digests=None):
  mesh = make_mesh(cfg)
  batches = IndexedBatches(cfg, mesh)
  if digests is not None:
    batches = Digesting(batches, digests)
  return train.train(cfg, (batches, IndexedBatches(cfg, mesh, seed=1)))


def _losses(summary):
  with open(summary["metrics_path"]) as f:
    return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


def test_loss_falls_and_outputs_are_written(tmp_path):
  cfg = _config(tmp_path, "steps=30", "eval_interval=15", "eval_steps=2", "checkpoint_period=15")
  summary = _run(cfg)
  losses = _losses(summary)
  assert sorted(losses) == list(range(30))
  assert np.mean([losses[s] for s in range(27, 30)]) < 0.6 * losses[0]
  assert summary["steps"] == 30 and summary["final_loss"] == losses[29]
  assert summary["eval_loss"] < summary["first_loss"]
  assert 0 < summary["data_wait_share"] < 1 and summary["real_tokens_per_s"] > 0
  assert os.listdir(summary["tensorboard_dir"])
  assert sorted(os.listdir(tmp_path / "smoke" / "checkpoints")) == ["15", "30"]
  assert json.loads((tmp_path / "smoke" / "summary.json").read_text()) == summary


def test_smoke_model_learns_from_the_sample_data(tmp_path, sample_dir):
  cfg = config.load(
    "configs/smoke.yml",
    [
      f"base_output_directory={tmp_path}",
      f"grain_train_files={sample_dir}/*.parquet",
      "grain_worker_count=0",
      "steps=40",
      "eval_interval=40",
      "eval_steps=2",
      "enable_checkpointing=false",
      "enable_tensorboard=false",
    ],
  )
  summary = train.train(cfg)
  losses = _losses(summary)
  assert np.mean([losses[s] for s in range(35, 40)]) < 0.5 * losses[0]
  assert summary["eval_loss"] < 0.5 * losses[0]
  assert summary["eval_rtt_loss"] < losses[0]  # RTT bytes: learnt, if not yet past the unigram


def test_resumed_run_sees_the_same_batches_and_losses(tmp_path):
  common = ["learning_rate_schedule_steps=8", "checkpoint_period=4", "enable_tensorboard=false"]
  whole_digests, resumed_digests = [], []
  whole = _run(_config(tmp_path, "run_name=whole", "steps=8", *common), whole_digests)
  _run(_config(tmp_path, "run_name=resumed", "steps=4", *common), resumed_digests)
  assert len(resumed_digests) == 4
  resumed = _run(_config(tmp_path, "run_name=resumed", "steps=8", *common), resumed_digests)

  assert resumed["steps"] == 4  # only steps 4..7 ran after the restart
  assert resumed_digests == whole_digests
  assert len(set(whole_digests)) == 8
  assert _losses(resumed) == _losses(whole)  # bit-identical on CPU, every step


@pytest.mark.slow
def test_resume_with_the_network_grain_pipeline(tmp_path, sample_dir):
  common = [
    "dataset_type=network_grain",
    f"grain_train_files={sample_dir}/*.parquet",
    f"network_prepared_dir={tmp_path}/prepared",
    "grain_worker_count=1",
    "learning_rate_schedule_steps=6",
    "checkpoint_period=3",
    "enable_tensorboard=false",
  ]

  def run(run_name, steps, digests):
    cfg = _config(tmp_path, f"run_name={run_name}", f"steps={steps}", *common)
    train_iter, eval_iter = create_data_iterator(cfg, make_mesh(cfg))
    return train.train(cfg, (Digesting(train_iter, digests), eval_iter))

  whole_digests, resumed_digests = [], []
  whole = run("whole", 6, whole_digests)
  run("resumed", 3, resumed_digests)
  resumed = run("resumed", 6, resumed_digests)
  assert resumed_digests == whole_digests and len(set(whole_digests)) == 6
  assert _losses(resumed) == _losses(whole)


def test_short_sequences_and_missing_files_fail_before_compiling(tmp_path):
  compiles = []
  jax.monitoring.register_event_duration_secs_listener(
    lambda event, *args, **kwargs: compiles.append(event) if "compile" in event else None
  )
  with pytest.raises(ConfigError, match="max_target_length=40 .* 47 tokens"):
    train.train(_config(tmp_path, "max_target_length=40", "dataset_type=network_grain"))
  with pytest.raises(DataError, match=r"none/\*\.parquet: no file matches"):
    train.train(
      _config(
        tmp_path, "dataset_type=network_grain", f"grain_train_files={tmp_path}/none/*.parquet"
      )
    )
  assert compiles == []


def test_batch_not_divisible_over_devices_fails_before_compiling(tmp_path):
  script = textwrap.dedent(
    f"""
    import jax
    from maxtext_netdata import config
    from maxtext_netdata.trainer import train
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, *a, **k: compiles.append(event) if "compile" in event else None)
    cfg = config.load("configs/smoke.yml", ["base_output_directory={tmp_path}",
                      "dataset_type=synthetic", "global_batch_size_to_load=3"])
    try:
      train.train(cfg)
    except config.ConfigError as e:
      print("ConfigError:", e, "compiles:", len(compiles))
    """
  )
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
  out = subprocess.run(
    [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=True
  ).stdout
  assert "ConfigError: global batch of 3 sequences does not divide over the 2 devices" in out
  assert out.strip().endswith("compiles: 0")
