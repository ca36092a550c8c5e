"""The trainer: loss falls, resume is exact, impossible configs fail before compiling."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from absl import flags

from maxtext_netdata import config
from maxtext_netdata.config import ConfigError
from maxtext_netdata.distributed.mesh import make_mesh
from maxtext_netdata.errors import DataError
from maxtext_netdata.input_pipeline import create_data_iterator, interface
from maxtext_netdata.trainer import train
from tests.helpers.train import IndexedBatches

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
def absl_flags_parsed():
  """This module is an entry point: Grain's worker start reads absl flags."""
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


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
  # Its spread is computed (None would mean too few steps); its size is the machine's.
  assert summary["median_step_time_se_s"] >= 0 and summary["median_step_time_s"] > 0
  assert os.listdir(summary["tensorboard_dir"])
  assert sorted(os.listdir(tmp_path / "smoke" / "checkpoints")) == ["15", "30"]
  assert json.loads((tmp_path / "smoke" / "summary.json").read_text()) == summary


@pytest.mark.slow  # 30 steps of the smoke model; the resume tests train in the fast loop
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
  assert not os.path.exists(os.path.join(summary["run_dir"], "checkpoints"))  # none enabled


def _pipeline_run(tmp_path, sample_dir, run_name, steps, workers, digests, thread=None):
  """A run of the real network_grain pipeline; records the digest of every batch it trains on.
  `thread`: whether a placing thread places the batches (None: the backend's default)."""
  cfg = _config(
    tmp_path,
    "dataset_type=network_grain",
    f"grain_train_files={sample_dir}/*.parquet",
    f"network_prepared_dir={tmp_path}/prepared",
    f"grain_worker_count={workers}",
    "grain_num_threads=2",
    "learning_rate_schedule_steps=6",
    "checkpoint_period=3",
    "eval_interval=-1",
    "enable_tensorboard=false",
    f"run_name={run_name}",
    f"steps={steps}",
  )
  mesh = make_mesh(cfg)
  train_iter, eval_iter = create_data_iterator(cfg, mesh)
  if thread is not None:
    where = interface.host_slice(cfg, mesh)
    local = train_iter.local_iterator
    train_iter = interface.DataIterator(
      local, where.sharding, where.global_rows, cfg.device_prefetch, thread
    )
  return train.train(cfg, (Digesting(train_iter, digests), eval_iter))


def test_resumed_run_continues_the_pipeline_exactly(tmp_path, sample_dir):
  """Cut after 3 of 6 steps and resumed: the batches and losses of the uninterrupted run."""
  whole_digests, cut_digests = [], []
  whole = _pipeline_run(tmp_path, sample_dir, "whole", 6, 0, whole_digests)
  _pipeline_run(tmp_path, sample_dir, "cut", 3, 0, cut_digests)
  resumed = _pipeline_run(tmp_path, sample_dir, "cut", 6, 0, cut_digests)
  assert resumed["steps"] == 3  # only steps 3..5 ran after the restart
  assert cut_digests == whole_digests and len(set(whole_digests)) == 6
  assert _losses(resumed) == _losses(whole)  # bit-identical on CPU, every step
  saved = json.loads((tmp_path / "cut/checkpoints/3/iter/process_0-of-1.json").read_text())
  assert saved["format"] == "netdata-position-1" and saved["step"] == 3


def test_a_run_with_batches_placed_by_a_thread_trains_and_resumes_as_without(tmp_path, sample_dir):
  """The placing thread of an accelerator, here on the CPU: the same batches and losses as
  the batches placed in `next`, cut after 3 of 6 steps and resumed too, and no thread left."""
  plain_digests, whole_digests, cut_digests = [], [], []
  plain = _pipeline_run(tmp_path, sample_dir, "plain", 6, 0, plain_digests, thread=False)
  whole = _pipeline_run(tmp_path, sample_dir, "whole", 6, 0, whole_digests, thread=True)
  _pipeline_run(tmp_path, sample_dir, "cut", 3, 0, cut_digests, thread=True)
  resumed = _pipeline_run(tmp_path, sample_dir, "cut", 6, 0, cut_digests, thread=True)
  assert whole_digests == plain_digests == cut_digests and len(set(plain_digests)) == 6
  assert _losses(whole) == _losses(plain) and _losses(resumed) == _losses(plain)
  assert [t for t in threading.enumerate() if t.name == "device-prefetch"] == []


@pytest.mark.slow
def test_resume_matrix_over_worker_counts(tmp_path, sample_dir):
  """Saved with 0 or 2 workers, resumed with 0, 1 or 2: the batches and final loss of the
  uninterrupted run."""
  whole_digests = []
  whole = _pipeline_run(tmp_path, sample_dir, "whole", 6, 0, whole_digests)
  for saved_with in (0, 2):
    saved_digests = []
    _pipeline_run(tmp_path, sample_dir, f"saved{saved_with}", 3, saved_with, saved_digests)
    assert saved_digests == whole_digests[:3]
    for resumed_with in (0, 1, 2):
      run_name = f"saved{saved_with}_resumed{resumed_with}"
      shutil.copytree(tmp_path / f"saved{saved_with}", tmp_path / run_name)
      digests = []
      resumed = _pipeline_run(tmp_path, sample_dir, run_name, 6, resumed_with, digests)
      assert digests == whole_digests[3:], run_name
      assert resumed["final_loss"] == whole["final_loss"], run_name


def test_the_loop_never_waits_for_the_step_it_dispatched(tmp_path, monkeypatch):
  """Each step is made slow on the device (a long computation whose zero is added to the
  loss); when the loop dispatches step n+1, step n's loss must still be computing. A loop that
  reads step n's results before that (`float(loss)`, `jax.device_get`) finds them ready."""
  previous_ready = []  # per dispatch after the first: was the previous step's loss ready?
  original_init, original_step = train.Trainer.__init__, train.Trainer._train_step

  def slow_step(self, state, batch):
    new_state, metrics = original_step(self, state, batch)
    start = jnp.full((384, 384), 0.01) * (1 + 0 * metrics["loss"])
    busy = jax.lax.fori_loop(0, 150, lambda i, y: jnp.tanh(y @ y), start)
    metrics["loss"] = metrics["loss"] + 0 * jnp.sum(busy)
    return new_state, metrics

  def init(self, config, mesh):
    original_init(self, config, mesh)
    step, dispatched = self.train_step, []

    def recording_step(state, batch):
      if dispatched:
        previous_ready.append(dispatched[-1].is_ready())
      new_state, metrics = step(state, batch)
      dispatched.append(metrics["loss"])
      return new_state, metrics

    self.train_step = recording_step

  monkeypatch.setattr(train.Trainer, "_train_step", slow_step)
  monkeypatch.setattr(train.Trainer, "__init__", init)
  cfg = _config(tmp_path, "steps=5", "eval_interval=-1", "enable_checkpointing=false")
  summary = train.train(cfg, (IndexedBatches(cfg, make_mesh(cfg)), None))
  assert summary["steps"] == 5 and np.isfinite(summary["final_loss"])
  assert previous_ready == [False] * 4


def test_compile_xla_flags_compile_the_train_and_eval_steps(tmp_path):
  """`compile_xla_flags` (MaxText's key) reach the train and eval steps' compiles: XLA dumps
  both, with the option given beside the dump's, where the key asked. An option XLA does not
  know, or a value it cannot read, is a one-line ConfigError before any step."""
  dump = tmp_path / "dump"
  flags = f"--xla_dump_to={dump} --xla_gpu_cudnn_gemm_fusion_level=2"
  cfg = _config(
    tmp_path, "steps=2", "eval_interval=2", "eval_steps=1", f"compile_xla_flags={flags}"
  )
  assert _run(cfg)["steps"] == 2
  options = {path.name.split(".")[1]: path.read_text() for path in dump.glob("*.debug_options")}
  assert {"jit__train_step", "jit_eval_step"} <= set(options)
  assert all("xla_gpu_cudnn_gemm_fusion_level: 2" in options[n] for n in options)
  mesh = make_mesh(cfg)
  for flags, message in (
    ("--xla_no_such_option=1", "No such compile option: 'xla_no_such_option'"),
    ("--xla_gpu_enable_cublaslt=maybe", "xla_gpu_enable_cublaslt, 'maybe' is not a valid bool"),
  ):
    with pytest.raises(ConfigError, match=f"^compile_xla_flags='{flags}': .*{message}"):
      train.Trainer(_config(tmp_path, f"compile_xla_flags={flags}"), mesh)


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
  for kernel in ("cudnn", "cudnn_packed"):
    with pytest.raises(ConfigError, match=f"attention={kernel} needs an NVIDIA GPU and dtype"):
      train.train(_config(tmp_path, f"attention={kernel}"))  # float32, and a CPU here
  with pytest.raises(ConfigError, match="attention=pallas needs a GPU .* here: cpu"):
    train.train(_config(tmp_path, "attention=pallas", "dtype=bfloat16"))
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


@pytest.mark.slow  # two train steps to compile
def test_attention_kernels_give_the_same_losses_on_pipeline_batches(tmp_path, sample_dir):
  """Three train steps on real packed batches (network_grain, several contexts a row)
  with the einsum reference and with jax.nn.dot_product_attention: the same loss and gradient
  norm each step, to float32 rounding (the step's updates feed the next)."""
  cfg = _config(
    tmp_path,
    "dataset_type=network_grain",
    f"grain_train_files={sample_dir}/*.parquet",
    f"network_prepared_dir={tmp_path}/prepared",
    "grain_worker_count=0",
    "per_device_batch_size=8",
  )
  mesh = make_mesh(cfg)
  train_iter, _ = create_data_iterator(cfg, mesh)
  try:
    batches = [next(train_iter) for _ in range(3)]
  finally:
    train_iter.close()
  segments = np.concatenate([np.asarray(b["inputs_segmentation"]).max(axis=1) for b in batches])
  assert np.mean(segments >= 2) > 0.5, segments  # packed: most rows hold several contexts
  metrics = {}
  for kernel in ("einsum", "dot_product"):  # "xla" is dot_product's implementation on a CPU
    trainer = train.Trainer(cfg.replace(attention=kernel), mesh)
    state, metrics[kernel] = trainer.init_state(jax.random.key(0)), []
    for batch in batches:
      state, step_metrics = trainer.train_step(state, batch)
      metrics[kernel].append(jax.device_get((step_metrics["loss"], step_metrics["grad_norm"])))
  reference = np.array(metrics["einsum"])
  assert len(set(reference[:, 0].tolist())) == 3  # the steps learn: losses differ
  np.testing.assert_allclose(np.array(metrics["dot_product"]), reference, rtol=1e-5)


def test_a_checkpoint_saved_before_donated_steps_holds_its_own_step(tmp_path):
  """The train step donates the state, and the next step starts while Orbax writes the save
  of the previous one: the checkpoint after step 2 of a 4-step run (steps 3 and 4 reusing
  the buffers) equals that of a run stopped after step 2, leaf for leaf."""
  for run_name, steps in (("long", 4), ("short", 2)):
    cfg = _config(
      tmp_path,
      f"run_name={run_name}",
      f"steps={steps}",
      "checkpoint_period=1",
      "learning_rate_schedule_steps=4",  # one schedule for both
      "eval_interval=-1",
    )
    _run(cfg)
  restored = {
    run_name: ocp.StandardCheckpointer().restore(tmp_path / run_name / "checkpoints/2/items")
    for run_name in ("long", "short")
  }
  leaves = jax.tree.leaves(restored["long"])
  assert int(restored["long"]["step"]) == 2 and len(leaves) > 10
  for long_leaf, short_leaf in zip(leaves, jax.tree.leaves(restored["short"]), strict=True):
    np.testing.assert_array_equal(np.asarray(long_leaf), np.asarray(short_leaf))
  later = ocp.StandardCheckpointer().restore(tmp_path / "long/checkpoints/3/items")
  assert not np.array_equal(
    np.asarray(later["params"]["final_norm"]["scale"]),
    np.asarray(restored["long"]["params"]["final_norm"]["scale"]),
  )


def test_a_flat_optimizer_takes_the_same_steps_and_resumes_exactly(tmp_path):
  """`optimizer_flatten`: clipping and AdamW over one flat vector of every parameter. Its
  state is a few vectors instead of several arrays a parameter; after three steps the
  parameters are those of the per-parameter update to float32 rounding (the global norm
  sums in another order); a run cut after 2 of 4 steps and resumed has the uninterrupted
  run's losses, bit for bit."""
  cfg = _config(tmp_path, "eval_interval=-1", "gradient_clipping_threshold=0.5")
  mesh = make_mesh(cfg)
  source = IndexedBatches(cfg, mesh)
  batches = [next(source) for _ in range(3)]
  params, states = {}, {}
  for flat in (False, True):
    trainer = train.Trainer(cfg.replace(optimizer_flatten=flat), mesh)
    state = trainer.init_state(jax.random.key(0))
    first = jax.device_get(state["params"])
    for batch in batches:
      state, _ = trainer.train_step(state, batch)
    params[flat], states[flat] = jax.device_get(state["params"]), state["opt_state"]
  assert len(jax.tree.leaves(states[True])) < 8 < len(jax.tree.leaves(states[False]))
  moved = 0
  for per_parameter, flat, start in zip(
    *(jax.tree.leaves(p) for p in (params[False], params[True], first)), strict=True
  ):
    np.testing.assert_allclose(flat, per_parameter, rtol=2e-5, atol=1e-7)
    moved += int(not np.array_equal(flat, start))
  assert moved == len(jax.tree.leaves(first))  # every parameter took the steps
  losses = {}
  for run_name, stops in (("whole", (4,)), ("cut", (2, 4))):
    for steps in stops:
      summary = _run(
        _config(
          tmp_path,
          f"run_name={run_name}",
          f"steps={steps}",
          "checkpoint_period=2",
          "learning_rate_schedule_steps=4",
          "eval_interval=-1",
          "optimizer_flatten=true",
        )  # fmt: skip
      )
    losses[run_name] = _losses(summary)
  assert summary["steps"] == 2 and losses["cut"] == losses["whole"]  # the log goes on
  assert sorted(losses["whole"]) == [0, 1, 2, 3]


def test_a_new_run_starts_from_another_runs_parameters(tmp_path):
  """`load_parameters_path`: the second run's parameters are the first run's final ones. With
  learning rate 0 its steps leave them as they are, so its checkpoint holds them bit for bit,
  with its own step count; without the option it would hold the shared initial values. The
  path is relative, as a user types it."""
  common = ["steps=2", "checkpoint_period=2", "eval_interval=-1"]
  _run(_config(tmp_path, "run_name=first", *common))
  first = ocp.StandardCheckpointer().restore(tmp_path / "first/checkpoints/2/items")
  source = f"load_parameters_path={os.path.relpath(tmp_path / 'first/checkpoints/2')}"
  _run(_config(tmp_path, "run_name=second", *common, "learning_rate=0", source))
  loaded = ocp.StandardCheckpointer().restore(tmp_path / "second/checkpoints/2/items")
  assert int(loaded["step"]) == 2
  leaves = jax.tree.leaves(first["params"])
  assert len(leaves) > 5
  for a, b in zip(leaves, jax.tree.leaves(loaded["params"]), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(ConfigError, match=r"load_parameters_path=.*nowhere: no such checkpoint"):
    _run(
      _config(tmp_path, "run_name=fourth", "steps=1", f"load_parameters_path={tmp_path}/nowhere")
    )
  with pytest.raises(ConfigError, match=r"load_parameters_path=.*first: not a checkpoint"):
    _run(_config(tmp_path, "run_name=sixth", "steps=1", f"load_parameters_path={tmp_path}/first"))
  # The step's folder stands for its items folder: this one is found, and its shapes read.
  wider = _config(
    tmp_path, "run_name=fifth", "steps=1", "base_emb_dim=128",
    f"load_parameters_path={tmp_path}/first/checkpoints/2",
  )  # fmt: skip
  with pytest.raises(ConfigError, match=r"not the parameters of this model \(params/"):
    _run(wider)
  # The run itself resumed with another model, optimizer or layer layout: one line naming
  # its checkpoint and the first array that differs (Orbax's own error is a long traceback).
  for other in ("base_emb_dim=128", "scan_layers=true", "optimizer_flatten=true"):
    with pytest.raises(ConfigError, match=r"first/checkpoints/2: the train state of another"):
      _run(_config(tmp_path, "run_name=first", "steps=3", "eval_interval=-1", other))


def _profiled(run_dir, first_step: int) -> tuple[list[int], list[str]]:
  """The steps the analysis finds in the run's trace, and the Python functions it recorded."""
  from maxtext_netdata.bench import profile

  events = profile.read_events(profile.find_xplane(run_dir / "profile"))
  steps = profile.analyze_events(events, "train_step", first_step=first_step)["steps"]
  return [s["step"] for s in steps], [name for name, _, _ in events["python"]]


def test_the_profiler_records_its_window_of_steps_and_not_the_compile(tmp_path):
  """`profiler: xplane` traces `profiler_steps` steps after the skipped ones (MaxText's keys):
  the trace holds those steps' runs of the train step, and not the first step's tracing of
  the model (a million Python events for this tiny one, from step 0)."""
  window = ["profiler=xplane", "skip_first_n_steps_for_profiler=2", "profiler_steps=3"]
  cfg = _config(tmp_path, "steps=7", "enable_checkpointing=false", *window)
  _run(cfg)
  # Three runs in the trace: the analysis counts the runs whole between the first and the
  # last, so it reports the first two.
  steps, python = _profiled(tmp_path / "smoke", first_step=2)
  assert steps == [2, 3]
  assert not [name for name in python if "model.py" in name]
  assert len(list((tmp_path / "smoke" / "profile").rglob("*.xplane.pb"))) == 1


def test_a_run_ending_inside_the_profiler_window_stops_the_trace(tmp_path):
  """The run ends before the window does: the trace is stopped and written all the same, and
  no trace is left running to refuse the next one."""
  window = ["profiler=xplane", "skip_first_n_steps_for_profiler=1", "profiler_steps=10"]
  cfg = _config(tmp_path, "steps=4", "enable_checkpointing=false", *window)
  _run(cfg)
  assert _profiled(tmp_path / "smoke", first_step=1)[0] == [1, 2]
  jax.profiler.start_trace(str(tmp_path / "next"))  # raises while a trace runs
  jax.profiler.stop_trace()
