"""Real MaxText trains on `dataset_type=network_grain` through the plugin (CPU, tiny model).

The training tests run MaxText's own trainer as `maxtext-netdata maxtext-train` runs it: forked
from a server that imported it once (tests/helpers/maxtext_runs.py) where a test looks at what
the runs trained, as the command itself (`python -m maxtext_netdata.maxtext.train`) where it
looks at how the command ends; the config tests call MaxText's `pyconfig` in-process.
"""

import asyncio
import fcntl
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types

import numpy as np
import pytest

from tests.helpers import maxtext_runs
from tests.helpers.maxtext import SMOKE, TINY_MODEL

pytest.importorskip("maxtext", reason="MaxText is not installed (pip install '.[maxtext]')")

from maxtext_netdata.config import compile_options  # noqa: E402
from maxtext_netdata.errors import ConfigError  # noqa: E402
from maxtext_netdata.maxtext import patch_checkpoints  # noqa: E402
from maxtext_netdata.maxtext import plugin as maxtext_plugin  # noqa: E402

# Every test here starts MaxText (seconds of import each): the full suite runs them, the fast
# loop (`scripts/test.sh --fast`) leaves them out.
pytestmark = pytest.mark.slow

TINY = [*TINY_MODEL, "log_period=1", "async_checkpointing=false"]


@pytest.fixture(scope="module")
def data_overrides(sample_dir, tmp_path_factory) -> list[str]:
  prepared = tmp_path_factory.mktemp("prepared")
  return [
    f"grain_train_files={os.path.join(sample_dir, '*.parquet')}",
    f"network_prepared_dir={prepared}",
  ]


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory) -> str:
  """Compiled steps shared by the runs of one model."""
  return str(tmp_path_factory.mktemp("jax_cache"))


@pytest.fixture
def coordinator_port():
  """Held by a test whose runs start `jax.distributed` the way MaxText does on CPUs: its
  coordinator listens on the fixed port 1234, so such tests take turns, whichever of the
  suite's worker processes (scripts/test.sh) runs them, through a lock file."""
  lock = os.path.join(tempfile.gettempdir(), "maxtext_netdata-tests-port-1234.lock")
  with open(lock, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
    yield


def _train_args(out, run_name: str, jax_cache: str, *overrides: str) -> list[str]:
  """`maxtext-train`'s arguments for MaxText's trainer through the plugin on the tiny smoke
  model, writing under `out`; `overrides` come last, so they win over the tiny model's."""
  return [
    SMOKE,
    f"base_output_directory={out}",
    f"run_name={run_name}",
    f"jax_cache_dir={jax_cache}",
    *TINY,
    *overrides,
  ]


def _train_argv(out, run_name: str, jax_cache: str, *overrides: str) -> list[str]:
  """The command `python -m maxtext_netdata.maxtext.train` with `_train_args`."""
  return [
    sys.executable,
    "-m",
    "maxtext_netdata.maxtext.train",
    *_train_args(out, run_name, jax_cache, *overrides),
  ]


def _train(out, run_name, overrides, jax_cache) -> tuple[str, list[dict]]:
  """One MaxText training run, forked with MaxText imported (tests/helpers/maxtext_runs.py):
  its output and its per-step metrics (MaxText's `metrics_file`)."""
  metrics_file = os.path.join(out, f"{run_name}-{len(os.listdir(out))}.jsonl")
  args = _train_args(out, run_name, jax_cache, f"metrics_file={metrics_file}", *overrides)
  log = f"{metrics_file}.log"
  run = maxtext_runs.start(args, dict(os.environ, JAX_PLATFORMS="cpu"), log)
  code = maxtext_runs.finish(run, 400, log)
  with open(log, encoding="utf-8", errors="replace") as f:
    output = f.read()
  assert code == 0, output[-4000:]
  with open(metrics_file, encoding="utf-8") as f:
    return output, [json.loads(line) for line in f]


def _iter_state(out, run_name, step) -> dict:
  path = os.path.join(out, run_name, "checkpoints", str(step), "iter", "process_0-of-1.json")
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _maxtext_config(*overrides):
  from maxtext.configs import pyconfig  # noqa: PLC0415

  maxtext_plugin.install()
  return pyconfig.initialize(["test", SMOKE, "base_output_directory=/tmp/unused", *overrides])


@pytest.mark.slow
def test_resume_from_maxtext_checkpoint_continues_the_data_exactly(
  tmp_path, data_overrides, jax_cache
):
  """An interrupted run resumed from MaxText's checkpoint trains on the same batches, with the
  same losses, as an uninterrupted one, though its first half ran 2 Grain workers and the rest
  none; those batches are our pipeline's, step by step. (The other way round, a checkpoint
  saved in-process resumed by workers: the test across process counts.)"""
  # One learning-rate schedule for all runs (MaxText's default spans `steps`).
  common = [*data_overrides, "checkpoint_period=100", "learning_rate_schedule_steps=6"]
  _, whole = _train(tmp_path, "whole", [*common, "steps=6", "grain_worker_count=0"], jax_cache)
  _, first = _train(tmp_path, "cut", [*common, "steps=3", "grain_worker_count=2"], jax_cache)
  resuming = [*common, "steps=6", "grain_worker_count=0"]
  resumed_run, resumed = _train(tmp_path, "cut", resuming, jax_cache)

  assert [m["step"] for m in first] == [0, 1, 2]
  assert [m["step"] for m in resumed] == [3, 4, 5]
  assert "restoring from this run's directory step 2" in resumed_run
  for key in ("learning/loss", "learning/padding_fraction", "learning/total_weights"):
    assert [m[key] for m in first + resumed] == [m[key] for m in whole], key
  # MaxText saved our data position with each checkpoint: after 3 and after 6 batches.
  assert _iter_state(tmp_path, "cut", 2)["step"] == 3
  assert _iter_state(tmp_path, "cut", 5) == _iter_state(tmp_path, "whole", 5)
  assert [m["step"] for m in whole] == [0, 1, 2, 3, 4, 5]
  assert all(math.isfinite(m["learning/loss"]) for m in whole)
  state = _iter_state(tmp_path, "whole", 5)
  assert state["format"] == "netdata-position-1" and state["step"] == 6
  assert all(m["perf/data_wait_seconds"] >= 0 for m in whole)

  # The padding MaxText saw at each step is that of our pipeline's batch of that step.
  from maxtext_netdata.data.prepare import prepare  # noqa: PLC0415
  from maxtext_netdata.input_pipeline import network_grain  # noqa: PLC0415
  from maxtext_netdata.input_pipeline.sequences import BatchBuilder  # noqa: PLC0415

  ours = maxtext_plugin.network_config(_maxtext_config(*TINY, *common, "steps=6"))
  builder = BatchBuilder.from_config(
    ours, prepare.ensure_prepared(ours, progress=False).train, ours.global_batch_size_to_load
  )
  iterator = network_grain.make_iterator(ours, builder, 0, ours.global_batch_size_to_load, 6)
  expected = [float(np.mean(next(iterator)["targets_segmentation"] == 0)) for _ in range(6)]
  assert [m["learning/padding_fraction"] for m in whole] == pytest.approx(expected)


@pytest.mark.slow
def test_synthetic_still_trains_with_the_plugin(tmp_path, jax_cache):
  result, metrics = _train(
    tmp_path,
    "synthetic",
    ["dataset_type=synthetic", "steps=3", "enable_checkpointing=false"],
    jax_cache,
  )
  assert [m["step"] for m in metrics] == [0, 1, 2]
  assert all(math.isfinite(m["learning/loss"]) for m in metrics)
  assert not any("perf/data_wait_seconds" in m for m in metrics)
  assert "completed step: 2" in result


def test_maxtext_config_admits_network_grain_and_network_keys(data_overrides):
  config = _maxtext_config(
    *data_overrides,
    "network_field_order=hashed",
    "network_test_fraction=0.25",
    "network_since=2025-07-02",  # a date to YAML: the key takes it as its text
    "grain_prefetch_buffer_size=100",
    "per_device_batch_size=16",
  )
  assert config.dataset_type == "network_grain"
  ours = maxtext_plugin.network_config(config)
  assert ours.dataset_type == "network_grain"
  assert ours.network_field_order == "hashed"
  assert ours.network_test_fraction == 0.25
  assert ours.network_since == "2025-07-02" and ours.network_until == ""
  assert ours.max_target_length == config.max_target_length == 256
  assert ours.global_batch_size_to_load == config.global_batch_size_to_load == 16
  assert ours.grain_prefetch_buffer_size == 7  # 100 examples in batches of 16
  assert ours.grain_train_files == config.grain_train_files


@pytest.mark.parametrize(
  "flags",
  [
    "",
    "--xla_a=TRUE \\\n  --xla_b=65536 --xla_dump_to=/tmp/a=b --xla_c=false",
    "--xla_a",
    "xla_a=1",
    "--xla_a=",
    "--xla_a=1 --xla_a=2",
  ],
)
def test_compile_xla_flags_read_as_maxtext_reads_them(flags):
  """`compile_xla_flags` is MaxText's key: our trainer accepts and refuses the values MaxText's
  parser does, with the same names and values (bools as XLA's option parser takes them)."""
  from maxtext.utils import max_utils  # noqa: PLC0415

  def read(parse):
    try:
      # bools as text, as MaxText keeps them; every other value as given
      return {
        k: str(v).lower() if str(v).lower() in ("true", "false") else v
        for k, v in parse(flags).items()
      }
    except ValueError:
      return None

  assert read(compile_options) == read(max_utils.parse_libtpu_flags_to_dict)


def test_maxtext_rejects_unknown_network_key():
  with pytest.raises(
    maxtext_plugin.MaxTextPluginError,
    match=r"unknown config key 'network_test_fractoin'; did you mean 'network_test_fraction'\?",
  ):
    _maxtext_config("network_test_fractoin=0.2")


@pytest.mark.parametrize(
  ("override", "message"),
  [
    # MaxText's own key and check: pydantic's words, in one line.
    ("steps=abc", "steps='abc' should be a valid integer, unable to parse string as an integer"),
    ("network_test_fraction=lots", "network_test_fraction='lots' should be a valid number"),
    # The validator's words name the key and value themselves.
    ("dataset_type=network_grian", "dataset_type='network_grian' is not one of c4_mlperf, "),
    # The network_* fields are our ConfigModel's: MaxText's validation applies their checks.
    ("network_field_order=sorted", "network_field_order='sorted' should be 'random', 'fixed'"),
    ("network_test_fraction=1.5", "network_test_fraction=1.5 must be in [0, 1)"),
    ("network_until=tomorrow", "network_until='tomorrow' is not an ISO 8601 time (2025"),
  ],
)
def test_maxtext_refuses_a_bad_value_in_one_line(override, message):
  with pytest.raises(maxtext_plugin.MaxTextPluginError) as raised:
    _maxtext_config(override)
  assert str(raised.value).startswith(f"MaxText config: {message}"), raised.value
  assert "\n" not in str(raised.value)


def test_shared_keys_pass_our_checks_too():
  # A shared key MaxText admits must still pass ours when the pipeline is built.
  config = _maxtext_config("grain_worker_count=-2")
  with pytest.raises(ConfigError, match="grain_worker_count=-2 must be -1, 0 or more"):
    maxtext_plugin.network_config(config)


def test_install_is_idempotent_and_keeps_other_dataset_types():
  from maxtext.input_pipeline import input_pipeline_interface  # noqa: PLC0415

  first = maxtext_plugin.install()
  patched = input_pipeline_interface.create_data_iterator
  assert maxtext_plugin.install() is first
  assert input_pipeline_interface.create_data_iterator is patched
  assert _maxtext_config("dataset_type=grain", "grain_train_files=x").dataset_type == "grain"


def test_unsupported_maxtext_version_is_named(monkeypatch):
  monkeypatch.setattr(maxtext_plugin, "_maxtext_version", lambda: "0.1.9")
  with pytest.raises(
    maxtext_plugin.MaxTextPluginError, match=r"maxtext 0.1.9 is installed.*>=0.2.5,<0.3"
  ):
    maxtext_plugin._modules()


def test_eval_iterator_serves_the_test_split_again_at_every_eval(data_overrides):
  from maxtext.input_pipeline import input_pipeline_interface  # noqa: PLC0415
  from maxtext.utils import maxtext_utils  # noqa: PLC0415

  config = _maxtext_config(*TINY, *data_overrides, "eval_interval=2", "eval_steps=2")
  mesh = maxtext_utils.get_mesh_from_config(config)
  train, evaluation = input_pipeline_interface.create_data_iterator(config, mesh)
  try:
    first = [np.asarray(batch["inputs"]) for batch in evaluation]
    second = [np.asarray(batch["inputs"]) for batch in evaluation]
    train_batches = [np.asarray(next(train)["inputs"]) for _ in range(2)]
  finally:
    train.close()
    evaluation.close()
  assert len(first) == 2
  assert all(a.shape == (4, 128) for a in first)
  np.testing.assert_array_equal(first, second)
  assert not any(np.array_equal(a, b) for a in first for b in train_batches)


def test_plugin_and_our_pipeline_yield_the_same_batches(data_overrides):
  """MaxText's network_grain iterators and our `create_data_iterator` for the same config: the
  same train batches, and the same eval batches, as many of them (both build their splits with
  `input_pipeline.network_splits`)."""
  from maxtext.input_pipeline import input_pipeline_interface  # noqa: PLC0415
  from maxtext.utils import maxtext_utils  # noqa: PLC0415

  from maxtext_netdata.distributed import mesh as mesh_lib  # noqa: PLC0415
  from maxtext_netdata.input_pipeline import create_data_iterator  # noqa: PLC0415

  config = _maxtext_config(*TINY, *data_overrides, "eval_interval=2", "eval_steps=2")
  ours = maxtext_plugin.network_config(config).replace(eval_steps=2)
  theirs_train, theirs_eval = input_pipeline_interface.create_data_iterator(
    config, maxtext_utils.get_mesh_from_config(config)
  )
  our_train, our_eval = create_data_iterator(ours, mesh_lib.make_mesh(ours))
  try:
    for _ in range(3):
      theirs, mine = next(theirs_train), next(our_train)
      assert sorted(theirs) == sorted(mine)
      for key in mine:
        np.testing.assert_array_equal(np.asarray(theirs[key]), np.asarray(mine[key]), key)
    theirs = [{k: np.asarray(v) for k, v in batch.items()} for batch in theirs_eval]
    mine = [{k: np.asarray(v) for k, v in batch.items()} for batch in our_eval]
    assert len(theirs) == len(mine) == 2
    for their_batch, my_batch in zip(theirs, mine, strict=True):
      assert sorted(their_batch) == sorted(my_batch)
      for key in my_batch:
        np.testing.assert_array_equal(their_batch[key], my_batch[key], key)
  finally:
    for iterator in (theirs_train, theirs_eval, our_train, our_eval):
      iterator.close()


@pytest.mark.slow
def test_run_with_workers_and_several_evals_leaves_nothing(tmp_path, data_overrides, jax_cache):
  """MaxText's trainer with 2 Grain workers and 3 evals: no process of the run's session and no
  /dev/shm entry it used is left, and the evals started no worker process."""
  from tests.helpers import processes as process_helpers  # noqa: PLC0415

  metrics_file = tmp_path / "metrics.jsonl"
  argv = _train_argv(
    tmp_path,
    "evals",
    jax_cache,
    f"metrics_file={metrics_file}",
    *data_overrides,
    "grain_worker_count=2",
    "steps=6",
    "eval_interval=2",
    "eval_steps=2",
    "enable_checkpointing=false",
  )
  shm = set(os.listdir("/dev/shm"))
  proc = process_helpers.start(argv, jax_cache)
  code, _, err = process_helpers.finish(proc, shm, timeout=400)
  assert code == 0, err[-3000:]
  records = [json.loads(line) for line in metrics_file.read_text().splitlines()]
  assert sum(1 for r in records if "eval/avg_loss" in r) == 3
  assert max(proc.shm_watch.most_workers, default=0) <= 2


def test_metric_path_never_waits_for_the_step_it_is_given(tmp_path, data_overrides):
  """MaxText's metric logger with the plugin's data-wait and padding scalars: handed step n's
  metrics (a loss still computing on the device), it returns before that loss is ready; a
  metric path that reads the current step's values would find them ready. Each loss depends on
  the one before, as each train step depends on the state the one before wrote: step n starts
  when step n-1 ends, so when the logger has step n-1's loss, step n's has all its work ahead."""
  import datetime  # noqa: PLC0415

  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  from maxtext.common import metric_logger  # noqa: PLC0415
  from maxtext.input_pipeline import input_pipeline_interface  # noqa: PLC0415
  from maxtext.utils import maxtext_utils  # noqa: PLC0415

  config = _maxtext_config(
    *TINY, *data_overrides, f"metrics_file={tmp_path}/metrics.jsonl", "enable_tensorboard=false"
  )
  train, evaluation = input_pipeline_interface.create_data_iterator(
    config, maxtext_utils.get_mesh_from_config(config)
  )

  @jax.jit
  def slow_loss(seed, previous):
    start = jnp.full((384, 384), 0.01) * (1 + 0 * seed + 0 * previous)
    return jnp.sum(jax.lax.fori_loop(0, 150, lambda i, y: jnp.tanh(y @ y), start)) * 0 + seed

  loss = slow_loss(jnp.float32(0), jnp.float32(0)).block_until_ready()  # compiled before
  logger = metric_logger.MetricLogger(config, lambda step: 1e-3)
  logger.metadata = {
    metric_logger.MetadataKey.PER_DEVICE_TFLOPS: 1.0,
    metric_logger.MetadataKey.PER_DEVICE_TOKENS: 1.0,
  }
  ready_on_return = []
  try:
    for step in range(3):
      next(train)  # the plugin's feed: this batch's data wait and padding
      loss = slow_loss(jnp.float32(step), loss)
      metrics = {"scalar": {"learning/loss": loss, "learning/total_weights": loss}}
      logger.buffer_and_write_metrics(metrics, step, datetime.timedelta(seconds=0.1))
      ready_on_return.append(loss.is_ready())
      assert metrics["scalar"]["perf/data_wait_seconds"] >= 0
  finally:
    train.close()
    if evaluation is not None:
      evaluation.close()
  assert ready_on_return == [False] * 3


def _train_processes(out, run_name, num_processes, overrides, jax_cache) -> list[dict]:
  """One MaxText run of `num_processes` processes on 127.0.0.1, 2 CPU devices in all (a global
  batch of 8 either way); process 0's per-step metrics.

  Several processes start `jax.distributed` the way MaxText does on CPUs
  (`max_utils.initialize_jax_for_cpu`: `JAX_COORDINATOR_ADDRESS`, `JOB_INDEX`,
  `JOB_COMPLETION_INDEX`, `PROCESSES_IN_JOB`, `JAX_PROCESS_COUNT`, coordinator port 1234).
  A process left in a collective by a failed peer is killed with its session at the timeout.
  """
  metrics = os.path.join(out, f"{run_name}-{len(os.listdir(out))}")
  common = _train_args(
    out, run_name, jax_cache, f"skip_jax_distributed_system={num_processes == 1}", *overrides
  )
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    XLA_FLAGS=f"--xla_force_host_platform_device_count={2 // num_processes}",
  )
  if num_processes > 1:
    with socket.socket() as probe:
      if probe.connect_ex(("127.0.0.1", 1234)) == 0:
        pytest.fail("port 1234, MaxText's CPU coordinator port, is taken by another program")
    env.update(
      JAX_COORDINATOR_ADDRESS="127.0.0.1",
      JOB_INDEX="0",
      PROCESSES_IN_JOB=str(num_processes),
      JAX_PROCESS_COUNT=str(num_processes),
    )
  logs = [f"{metrics}-{i}.log" for i in range(num_processes)]
  runs = [
    maxtext_runs.start(
      [*common, f"metrics_file={metrics}-{i}.jsonl"], dict(env, JOB_COMPLETION_INDEX=str(i)), log
    )
    for i, log in enumerate(logs)
  ]
  try:
    codes = [maxtext_runs.finish(run, 300, log) for run, log in zip(runs, logs, strict=True)]
  finally:
    for run in runs:
      if run.exitcode is None:
        maxtext_runs.kill(run)
  for code, log in zip(codes, logs, strict=True):
    with open(log, encoding="utf-8", errors="replace") as f:
      # absl's INFO and WARNING lines left out: MaxText logs ~1000, the error is among the rest.
      err = "".join(line for line in f if not re.match(r"[IW]\d{4} ", line))
    assert code == 0, err[-4000:]
    assert "Training stopped" not in err, err[-4000:]
  with open(f"{metrics}-0.jsonl", encoding="utf-8") as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow
def test_resume_from_maxtext_checkpoint_across_process_counts(
  tmp_path, data_overrides, jax_cache, coordinator_port
):
  """MaxText's own checkpoints saved by 2 processes restore into 1, and 1 into 2 (Grain workers
  on the 2-process side), through MaxText's restore: the same losses and data position as an
  uninterrupted 1-process run. MaxText alone would refuse both (file count != process count)."""
  common = [*data_overrides, "checkpoint_period=100", "learning_rate_schedule_steps=6"]
  whole = _train_processes(
    tmp_path, "whole", 1, [*common, "steps=6", "grain_worker_count=0"], jax_cache
  )
  cut = []
  for processes, steps in ((2, 2), (1, 4), (2, 6)):
    workers = 1 if processes == 2 else 0
    overrides = [*common, f"steps={steps}", f"grain_worker_count={workers}"]
    cut += _train_processes(tmp_path, "cut", processes, overrides, jax_cache)

  assert [m["step"] for m in cut] == [m["step"] for m in whole] == [0, 1, 2, 3, 4, 5]
  # Global figures; padding_fraction is process 0's rows only, so it follows the process count.
  for key in ("learning/loss", "learning/total_weights"):
    assert [m[key] for m in cut] == [m[key] for m in whole], key
  iter_dir = tmp_path / "cut" / "checkpoints"
  assert sorted(os.listdir(iter_dir / "1" / "iter"))[-2:] == [
    "process_0-of-2.json",
    "process_1-of-2.json",
  ]
  assert "process_0-of-1.json" in os.listdir(iter_dir / "3" / "iter")
  assert _iter_state(tmp_path, "whole", 5) == json.loads(
    (iter_dir / "5" / "iter" / "process_1-of-2.json").read_text()
  )

  # Per-process files that disagree are refused, naming the file, before anything is restored.
  from etils import epath  # noqa: PLC0415
  from maxtext.common import grain_utility  # noqa: PLC0415
  from maxtext.input_pipeline import input_pipeline_interface  # noqa: PLC0415
  from maxtext.utils import maxtext_utils  # noqa: PLC0415

  # This pytest process has 1 CPU device: 8 rows per device keep the global batch of 8.
  config = _maxtext_config(
    *TINY, "per_device_batch_size=8", *common, "steps=6", "grain_worker_count=0"
  )
  train, _ = input_pipeline_interface.create_data_iterator(
    config, maxtext_utils.get_mesh_from_config(config)
  )
  manager = types.SimpleNamespace(directory=epath.Path(iter_dir))
  try:
    # Restored in this 1-process run from the 2 processes' files of step 1.
    checkpointable = grain_utility.for_restore(manager, 1, train, -1)
    asyncio.run(_load(checkpointable, epath.Path(iter_dir / "1" / "iter")))
    saved = json.loads((iter_dir / "1" / "iter" / "process_0-of-2.json").read_text())
    assert json.loads(train.local_iterator.get_state()) == saved
    assert saved["step"] == 2
    moved = iter_dir / "5" / "iter" / "process_1-of-2.json"
    moved.write_text(json.dumps({**json.loads(moved.read_text()), "step": 7}))
    with pytest.raises(patch_checkpoints.CheckpointError, match="process_1-of-2.json hold another"):
      grain_utility.for_restore(manager, 5, train, -1)
  finally:
    train.close()


async def _load(checkpointable, directory):
  """MaxText's `GrainCheckpointable.load`: a coroutine that returns the reading coroutine."""
  await (await checkpointable.load(directory))


@pytest.mark.slow
def test_sigterm_with_jax_distributed_saves_and_leaves_nothing(
  tmp_path, data_overrides, jax_cache, coordinator_port
):
  """SIGTERM to MaxText's trainer with `jax.distributed` on (MaxText's CPU variables, one
  process) and `enable_autocheckpoint`: it saves a checkpoint holding the next data position at
  JAX's sync step and ends with status 0; no process of its session (2 Grain workers) and no
  /dev/shm entry it used is left; a restart continues after that checkpoint."""
  from tests.helpers import processes as process_helpers  # noqa: PLC0415

  metrics = tmp_path / "metrics.jsonl"
  argv = _train_argv(
    tmp_path,
    "term",
    jax_cache,
    f"metrics_file={metrics}",
    *data_overrides,
    "grain_worker_count=2",
    "steps=500",
    "checkpoint_period=1000",
    "skip_jax_distributed_system=false",
    "enable_autocheckpoint=true",
  )
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    JAX_COORDINATOR_ADDRESS="127.0.0.1",
    JOB_INDEX="0",
    JOB_COMPLETION_INDEX="0",
    PROCESSES_IN_JOB="1",
    JAX_PROCESS_COUNT="1",
  )
  shm = set(os.listdir("/dev/shm"))
  with open(tmp_path / "log.txt", "w+", encoding="utf-8") as log:
    proc = subprocess.Popen(
      argv, env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True
    )
    watch = process_helpers._ShmWatch(proc)
    try:
      while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None, "the run ended before its third step"
        time.sleep(0.2)
      os.kill(proc.pid, signal.SIGTERM)
      process_helpers.communicate_or_fail(proc, 120, log.name, " after SIGTERM")
      code = proc.returncode
    finally:
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log.seek(0)
    err = "".join(line for line in log if "Training stopped" in line or "Error" in line)
  assert code == 0, err
  assert "Training stopped: Job received termination signal (SIGTERM)" in err
  deadline = time.monotonic() + 30
  while process_helpers.session(proc.pid) and time.monotonic() < deadline:
    time.sleep(0.2)
  assert process_helpers.session(proc.pid) == []
  watch.join()
  assert watch.seen and (set(os.listdir("/dev/shm")) - shm) & watch.seen == set()
  saved = max(int(step) for step in os.listdir(tmp_path / "term" / "checkpoints"))
  steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
  # MaxText writes a step's metrics when the next step is handed over: the last may be missing.
  assert saved in (steps[-1], steps[-1] + 1)
  assert _iter_state(tmp_path, "term", saved)["step"] == saved + 1

  resumed_run, resumed = _train(
    tmp_path,
    "term",
    [*data_overrides, f"steps={saved + 3}", "grain_worker_count=0", "checkpoint_period=1000"],
    jax_cache,
  )
  assert f"restoring from this run's directory step {saved}" in resumed_run
  assert [m["step"] for m in resumed] == [saved + 1, saved + 2]


@pytest.mark.slow
def test_sigterm_to_a_single_process_run_closes_the_workers(tmp_path, data_overrides, jax_cache):
  """SIGTERM to MaxText's trainer with no SIGTERM handler of its own (one process, no
  `jax.distributed`): the command ends with 143 through its clean-up; its 2 Grain workers and
  every /dev/shm entry it used are gone (SIGTERM's default action left them behind)."""
  from tests.helpers import processes as process_helpers  # noqa: PLC0415

  metrics = tmp_path / "metrics.jsonl"
  argv = _train_argv(
    tmp_path,
    "single",
    jax_cache,
    f"metrics_file={metrics}",
    *data_overrides,
    "grain_worker_count=2",
    "steps=500",
    "checkpoint_period=1000",
  )
  shm = set(os.listdir("/dev/shm"))
  with open(tmp_path / "log.txt", "w+", encoding="utf-8") as log:
    proc = subprocess.Popen(
      argv,
      env=dict(os.environ, JAX_PLATFORMS="cpu"),
      stdout=subprocess.DEVNULL,
      stderr=log,  # a pipe nobody reads would fill with MaxText's log and stop the run
      start_new_session=True,
      text=True,
    )
    proc.shm_watch = process_helpers._ShmWatch(proc)
    try:
      while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None, "the run ended before its third step"
        time.sleep(0.2)
      os.kill(proc.pid, signal.SIGTERM)
      code, _, _ = process_helpers.finish(proc, shm, timeout=120, log=tmp_path / "log.txt")
    finally:
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log.seek(0)
    err = log.read()
  assert code == 128 + signal.SIGTERM, err[-2000:]
  assert "maxtext-netdata maxtext-train: terminated (SIGTERM)" in err
  # The workers and their blocks ended while the interpreter ran, not in its teardown (there
  # Grain's unlinks never came and Python's resource tracker reported the blocks as leaked).
  assert "leaked shared_memory" not in err, err[-2000:]
