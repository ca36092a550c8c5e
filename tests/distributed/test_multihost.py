"""Multi-process runs on CPU: real `jax.distributed` processes talking over 127.0.0.1.

Each multi-process test starts its workers as subprocesses with a coordinator on a free
loopback port and kills the whole process group on timeout, so a stuck collective fails the
test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import numpy as np
import portpicker
import pytest

from maxtext_netdata import config
from maxtext_netdata.distributed import multihost
from maxtext_netdata.errors import ConfigError
from tests.helpers import processes

REPO = Path(__file__).resolve().parents[2]
WORKER_TIMEOUT_S = 300  # a bound on a hang: 4 processes importing jax on 2 busy cores


def run_processes(
  argv: list[str], num_processes: int, *, devices_per_process: int = 1, extra_env=None
) -> list[subprocess.CompletedProcess]:
  """Runs `argv` as processes 0..n-1 of one jax.distributed job; kills them all on timeout."""
  port = portpicker.pick_unused_port()
  procs = []
  for process_id in range(num_processes):
    env = dict(os.environ)
    env.update(
      JAX_PLATFORMS="cpu",
      XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_per_process}",
      PYTHONPATH=str(REPO),
      **(extra_env or {}),
    )
    if num_processes > 1:
      env.update(
        JAX_NUM_PROCESSES=str(num_processes),
        JAX_PROCESS_ID=str(process_id),
        JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
      )
    procs.append(processes.popen(argv, env))
  deadline = time.monotonic() + WORKER_TIMEOUT_S
  results = []
  try:
    for proc in procs:
      remaining = max(1.0, deadline - time.monotonic())
      out, err = proc.communicate(timeout=remaining)
      results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
  except subprocess.TimeoutExpired:
    for proc in procs[len(results) :]:
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    tails = [
      f"process {i}:\n{proc.communicate()[1][-2000:]}"
      for i, proc in enumerate(procs)
      if i >= len(results)
    ]
    pytest.fail(f"processes still running after {WORKER_TIMEOUT_S} s:\n" + "\n".join(tails))
  finally:
    for proc in procs:
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
  return results


def check_ok(results: list[subprocess.CompletedProcess]) -> None:
  for process_id, result in enumerate(results):
    assert result.returncode == 0, f"process {process_id} failed:\n{result.stderr[-3000:]}"


# --- environment → setup ------------------------------------------------------------------


def test_single_process_when_nothing_asks_for_more():
  assert multihost.distributed_setup({}) is None
  assert multihost.distributed_setup({"JAX_NUM_PROCESSES": "1"}) is None
  assert multihost.initialize_distributed(config.load(None), env={}) is False


def test_explicit_setup_from_env():
  setup = multihost.distributed_setup(
    {
      "JAX_NUM_PROCESSES": "4",
      "JAX_PROCESS_ID": "3",
      "JAX_COORDINATOR_ADDRESS": "10.0.0.2:8476",
    }
  )
  assert setup == multihost.DistributedSetup("10.0.0.2:8476", 4, 3)


def test_auto_leaves_everything_to_cluster_detection():
  setup = multihost.distributed_setup({"JAX_NUM_PROCESSES": "auto"})
  assert setup == multihost.DistributedSetup(None, None, None)


@pytest.mark.parametrize(
  "env, message",
  [
    ({"JAX_NUM_PROCESSES": "two"}, "must be a process count or 'auto'"),
    ({"JAX_NUM_PROCESSES": "0"}, "must be at least 1"),
    ({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}, "JAX_COORDINATOR_ADDRESS"),
    (
      {"JAX_NUM_PROCESSES": "2", "JAX_COORDINATOR_ADDRESS": "h:1"},
      "JAX_PROCESS_ID is not set",
    ),
    (
      {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2", "JAX_COORDINATOR_ADDRESS": "h:1"},
      r"JAX_PROCESS_ID=2 must be in \[0, 2\)",
    ),
    (
      {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "x", "JAX_COORDINATOR_ADDRESS": "h:1"},
      "JAX_PROCESS_ID='x' is not an integer",
    ),
    (
      {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0", "JAX_COORDINATOR_ADDRESS": "h"},
      "must be host:port",
    ),
  ],
)
def test_bad_environment_is_a_clear_error(env, message):
  with pytest.raises(ConfigError, match=message):
    multihost.distributed_setup(env)


def test_timeout_must_be_positive():
  with pytest.raises(ConfigError, match="jax_distributed_initialization_timeout=0 must be"):
    config.load(None, ["jax_distributed_initialization_timeout=0"])
  # A config from elsewhere (MaxText's, through the plugin) is checked at start-up too.
  other = types.SimpleNamespace(jax_distributed_initialization_timeout=0)
  env = {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1", "JAX_COORDINATOR_ADDRESS": "h:1"}
  with pytest.raises(ConfigError, match="jax_distributed_initialization_timeout=0"):
    multihost.initialize_distributed(other, env=env)


# --- rows per process ---------------------------------------------------------------------


@pytest.mark.parametrize("batch, count", [(8, 1), (8, 2), (8, 4), (24, 8), (6, 3)])
def test_process_row_ranges_are_disjoint_and_cover_the_batch(batch, count):
  ranges = [multihost.process_row_range(batch, h, count) for h in range(count)]
  rows = [row for start, stop in ranges for row in range(start, stop)]
  assert rows == list(range(batch))
  assert len({stop - start for start, stop in ranges}) == 1


def test_batch_that_does_not_divide_over_processes_is_an_error():
  with pytest.raises(ConfigError, match="10 sequences does not divide over 4 processes"):
    multihost.process_row_range(10, 0, 4)


# --- real jax.distributed processes -------------------------------------------------------

ROWS_WORKER = textwrap.dedent(
  """
    import hashlib, json, sys
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from maxtext_netdata import config
    from maxtext_netdata.distributed import multihost

    cfg = config.load(None, ["jax_distributed_initialization_timeout=60"])
    started = multihost.initialize_distributed(cfg)
    batch = 16
    order = json.loads(sys.argv[1])  # device order of the mesh, as positions in jax.devices()
    devices = [jax.devices()[i] for i in order]
    sharding = NamedSharding(Mesh(np.array(devices), ("data",)), PartitionSpec("data"))
    rows = multihost.process_rows(sharding, (batch, 5))

    def sharded_range(sharding):
      try:
        return multihost.sharded_row_range(sharding, (batch, 5))
      except config.ConfigError as e:
        return str(e)

    # Each row is a pure function of its global index, as in the input pipeline.
    local = (rows[:, None] * 1000 + np.arange(5)[None, :]).astype(np.int32)
    array = jax.make_array_from_process_local_data(sharding, local, (batch, 5))
    whole = multihost.gather_to_host({"x": array})["x"]
    # The pipeline's own placement must give the same array, shard for shard.
    from maxtext_netdata.input_pipeline import interface
    placed = interface.to_global({"x": local}, sharding, batch)["x"]
    same = placed.sharding == array.sharding and placed.shape == array.shape and all(
        a.device == b.device and a.index == b.index and np.array_equal(a.data, b.data)
        for a, b in zip(placed.addressable_shards, array.addressable_shards, strict=True))
    placed_whole = multihost.gather_to_host({"x": placed})["x"]
    print(json.dumps({
        "started": started,
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "rows": rows.tolist(),
        "range": multihost.process_row_range(batch),
        "sharded_range": sharded_range(sharding),
        "digest": hashlib.sha256(whole.tobytes()).hexdigest(),
        "placed_same": same,
        "placed_digest": hashlib.sha256(placed_whole.tobytes()).hexdigest(),
        "expected": hashlib.sha256(
            (np.arange(batch)[:, None] * 1000 + np.arange(5)[None, :]).astype(np.int32).tobytes()
        ).hexdigest(),
    }))
    """
)


def _reports(results) -> list[dict]:
  check_ok(results)
  return [json.loads(r.stdout.strip().splitlines()[-1]) for r in results]


@pytest.mark.slow
@pytest.mark.parametrize("num_processes, devices", [(1, 4), (2, 2), (4, 1)])
def test_rows_per_process_build_the_same_global_array(num_processes, devices):
  order = list(range(4))
  reports = _reports(
    run_processes(
      [sys.executable, "-c", ROWS_WORKER, json.dumps(order)],
      num_processes,
      devices_per_process=devices,
    )
  )
  assert [r["process_index"] for r in reports] == list(range(num_processes))
  assert all(r["started"] is (num_processes > 1) for r in reports)
  assert all(r["process_count"] == num_processes for r in reports)
  # In jax.devices() order, sharding rows are exactly the contiguous process ranges.
  for report in reports:
    start, stop = report["range"]
    assert report["rows"] == list(range(start, stop))
    assert report["sharded_range"] == [start, stop]
  covered = sorted(row for r in reports for row in r["rows"])
  assert covered == list(range(16))
  assert {r["digest"] for r in reports} == {reports[0]["expected"]}
  assert {r["placed_digest"] for r in reports} == {reports[0]["expected"]}
  assert all(r["placed_same"] for r in reports)


@pytest.mark.slow
def test_rows_follow_the_sharding_when_the_mesh_interleaves_processes():
  # Devices 0,1 belong to process 0 and 2,3 to process 1; this mesh alternates them, so a
  # process's rows are not one contiguous range and only process_rows gets them right.
  reports = _reports(
    run_processes(
      [sys.executable, "-c", ROWS_WORKER, json.dumps([0, 2, 1, 3])], 2, devices_per_process=2
    )
  )
  assert reports[0]["rows"] == [0, 1, 2, 3, 8, 9, 10, 11]
  assert reports[1]["rows"] == [4, 5, 6, 7, 12, 13, 14, 15]
  assert "process 0 holds rows [0, 1, 2, 3, 8, 9, 10, 11]" in reports[0]["sharded_range"]
  assert {r["digest"] for r in reports} == {reports[0]["expected"]}
  assert {r["placed_digest"] for r in reports} == {reports[0]["expected"]}
  assert all(r["placed_same"] for r in reports)


def test_auto_without_a_cluster_is_a_one_line_error():
  env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_"))}
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), JAX_NUM_PROCESSES="auto")
  result = subprocess.run(
    [sys.executable, "-m", "maxtext_netdata", "train", "configs/base.yml", "steps=1"],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=WORKER_TIMEOUT_S,
  )
  assert result.returncode == 2
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("maxtext-netdata train: error: JAX_NUM_PROCESSES=auto: JAX detected no")
  assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_unreachable_coordinator_fails_within_the_timeout_and_says_why():
  worker = (
    "from maxtext_netdata import config\n"
    "from maxtext_netdata.distributed import multihost\n"
    "multihost.initialize_distributed(config.load(None,"
    " ['jax_distributed_initialization_timeout=2']))\n"
  )
  port = portpicker.pick_unused_port()
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    PYTHONPATH=str(REPO),
    JAX_NUM_PROCESSES="2",
    JAX_PROCESS_ID="1",
    JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
  )
  result = subprocess.run(
    [sys.executable, "-c", worker],
    env=env,
    capture_output=True,
    text=True,
    timeout=WORKER_TIMEOUT_S,
  )
  assert result.returncode != 0
  assert (
    f"process 1 of 2 connecting to the coordinator at 127.0.0.1:{port} (timeout 2 s)"
    in result.stderr
  )


# --- the input pipeline over several processes ---------------------------------------------

PIPELINE_WORKER = textwrap.dedent(
  """
    import json, sys
    import numpy as np
    from absl import flags
    from maxtext_netdata import config
    from maxtext_netdata.distributed import multihost
    from maxtext_netdata.distributed import mesh as mesh_lib
    from maxtext_netdata.input_pipeline import create_data_iterator
    from maxtext_netdata.input_pipeline.batches_cli import digest

    flags.FLAGS.mark_as_parsed()  # this script is the entry point; Grain's workers read flags
    cfg = config.load(None, json.loads(sys.argv[1]))
    steps, out = int(sys.argv[2]), sys.argv[3]
    multihost.initialize_distributed(cfg)
    import jax

    train, _ = create_data_iterator(cfg, mesh_lib.make_mesh(cfg))
    digests = []
    for step in range(steps):
      batch = next(train)
      digests.append(digest(multihost.gather_to_host(batch)))
      # What this process loaded: its addressable shards, by global row.
      local = {}
      for key, array in batch.items():
        for shard in array.addressable_shards:
          start = shard.index[0].start or 0
          local[f"{key}@{start}"] = np.asarray(shard.data)
      np.savez(f"{out}/process{jax.process_index()}-step{step}.npz", **local)
    train.close()
    print(json.dumps({"digests": digests, "process_index": jax.process_index()}))
    """
)
STEPS = 3


@pytest.fixture(scope="module")
def raw_dir(tmp_path_factory) -> Path:
  from maxtext_netdata.data.synthetic.generate import generate  # noqa: PLC0415

  out = tmp_path_factory.mktemp("raw")
  generate(str(out), rows=20_000, shards=4, seed=7, progress=False)
  return out


def pipeline_overrides(raw_dir: Path, out_dir: Path, **extra) -> list[str]:
  values = {
    "grain_train_files": f"{raw_dir}/*.parquet",
    "base_output_directory": str(out_dir),
    "max_target_length": 256,
    "global_batch_size_to_load": 8,
    "grain_worker_count": 0,
    "data_shuffle_seed": 3,
    **extra,
  }
  return [f"{key}={value}" for key, value in values.items()]


def batches_cli_digests(
  overrides: list[str], steps: int, config_file: str = "configs/base.yml"
) -> list[str]:
  """Digests printed by `maxtext-netdata batches CONFIG_FILE` in one process."""
  result = subprocess.run(
    [sys.executable, "-m", "maxtext_netdata", "batches", config_file, *overrides]
    + ["--steps", str(steps)],
    cwd=REPO,
    env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO)),
    capture_output=True,
    text=True,
    timeout=WORKER_TIMEOUT_S,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.split("\n")
  return [line.split()[2] for line in lines if line.startswith("step ")]


def run_pipeline(overrides, out_dir: Path, num_processes: int, devices: int) -> list[dict]:
  out_dir.mkdir()
  argv = [sys.executable, "-c", PIPELINE_WORKER, json.dumps(overrides), str(STEPS), str(out_dir)]
  return _reports(run_processes(argv, num_processes, devices_per_process=devices))


@pytest.mark.slow
def test_two_processes_load_the_global_batches_of_one(raw_dir, tmp_path):
  # Both processes find no store and prepare it at the same time, into the same directory.
  overrides = pipeline_overrides(raw_dir, tmp_path / "run")
  expected = batches_cli_digests(overrides, STEPS)
  assert len(expected) == STEPS
  assert (tmp_path / "run" / "prepared").is_dir()
  # Prepare again from scratch, concurrently, for the multi-process run.
  overrides = pipeline_overrides(raw_dir, tmp_path / "run2")
  reports = run_pipeline(overrides, tmp_path / "npz", num_processes=2, devices=2)
  assert [r["process_index"] for r in reports] == [0, 1]
  for report in reports:
    assert report["digests"] == expected
  # Host slices: disjoint, covering the global batch, each equal to those rows of it.
  single = run_pipeline(overrides, tmp_path / "npz1", num_processes=1, devices=4)
  assert single[0]["digests"] == expected
  for step in range(STEPS):
    whole = np.load(tmp_path / "npz1" / f"process0-step{step}.npz")
    rows_seen = []
    for process in range(2):
      local = np.load(tmp_path / "npz" / f"process{process}-step{step}.npz")
      for name in local.files:
        key, start = name.split("@")
        shard = local[name]
        np.testing.assert_array_equal(
          shard, _rows(whole, key, int(start), len(shard)), err_msg=f"{name} step {step}"
        )
        if key == "inputs":
          rows_seen.extend(range(int(start), int(start) + len(shard)))
    assert sorted(rows_seen) == list(range(8))


def _rows(batch, key: str, start: int, count: int) -> np.ndarray:
  """Rows [start, start+count) of `key` from a one-process run's shards."""
  parts = sorted((int(n.split("@")[1]), batch[n]) for n in batch.files if n.split("@")[0] == key)
  return np.concatenate([part for _, part in parts])[start : start + count]


@pytest.mark.slow
def test_four_processes_load_the_global_batches_of_one(raw_dir, tmp_path):
  overrides = pipeline_overrides(raw_dir, tmp_path / "run", data_shuffle_seed=11)
  expected = batches_cli_digests(overrides, STEPS)
  reports = run_pipeline(overrides, tmp_path / "npz", num_processes=4, devices=1)
  assert [r["digests"] for r in reports] == [expected] * 4


@pytest.mark.slow
def test_two_processes_with_grain_workers_load_the_global_batches_of_one(raw_dir, tmp_path):
  # Each process spawns its own Grain worker; the batches stay those of one in-process loader.
  overrides = pipeline_overrides(raw_dir, tmp_path / "run", data_shuffle_seed=2)
  expected = batches_cli_digests(overrides, STEPS)
  with_workers = [o for o in overrides if not o.startswith("grain_worker_count=")]
  with_workers.append("grain_worker_count=1")
  reports = run_pipeline(with_workers, tmp_path / "npz", num_processes=2, devices=1)
  assert [r["digests"] for r in reports] == [expected] * 2


# Observed: 1 float32 ulp (3.8314199 vs 3.8314202, 6e-8 relative) after 4 steps of the smoke
# model; 1e-5 leaves two orders of magnitude for other schedules of the same reduction. The
# batches are compared bit for bit beside it; the loss catches lost parameters or optimizer state.
LOSS_RTOL_ACROSS_TOPOLOGIES = 1e-5

# --- training: a checkpoint of two processes resumes in one --------------------------------

TRAIN_WORKER = textwrap.dedent(
  """
    import json, sys
    from absl import flags
    from maxtext_netdata import config
    from maxtext_netdata.distributed import multihost
    from maxtext_netdata.trainer import train
    from maxtext_netdata.input_pipeline import create_data_iterator
    from maxtext_netdata.input_pipeline.batches_cli import digest
    from maxtext_netdata.distributed.mesh import make_mesh

    flags.FLAGS.mark_as_parsed()  # this script is the entry point; Grain's workers read flags
    cfg = config.load("configs/smoke.yml", json.loads(sys.argv[1]))
    multihost.initialize_distributed(cfg)
    train_iterator, eval_iterator = create_data_iterator(cfg, make_mesh(cfg))
    digests = []

    class Recording:
      # The trainer's batches, recorded as digests of the whole global batch.
      def __iter__(self):
        return self

      def __next__(self):
        batch = next(train_iterator)
        digests.append(digest(multihost.gather_to_host(batch)))
        return batch

      def get_state(self):
        return train_iterator.get_state()

      def set_state(self, state):
        train_iterator.set_state(state)

      def close(self):
        train_iterator.close()

    summary = train.train(cfg, data_iterators=(Recording(), eval_iterator))
    print(json.dumps({"digests": digests, "final_loss": summary["final_loss"]}))
    """
)


_RESUME_MODEL = ["base_num_decoder_layers=1", "base_emb_dim=64", "base_mlp_dim=128", "head_dim=16"]
_RESUME_RUN = ["checkpoint_period=2", "eval_interval=-1", "enable_tensorboard=false"]
_RESUME_RUN += ["learning_rate_schedule_steps=4"]


def _train_run(data, run_name: str, steps: int, num_processes: int, workers: int) -> dict:
  """A 1-layer training run of `steps` by `num_processes` processes (4 CPU devices in all)
  with `workers` Grain workers each: its batch digests and final loss, the same on every
  process."""
  overrides = [o for o in data if not o.startswith("grain_worker_count=")]
  overrides += [*_RESUME_MODEL, *_RESUME_RUN, f"run_name={run_name}", f"steps={steps}"]
  overrides.append(f"grain_worker_count={workers}")
  argv = [sys.executable, "-c", TRAIN_WORKER, json.dumps(overrides)]
  reports = _reports(run_processes(argv, num_processes, devices_per_process=4 // num_processes))
  assert all(r == reports[0] for r in reports)
  return reports[0]


@pytest.fixture(scope="module")
def uninterrupted_run(raw_dir, tmp_path_factory) -> dict:
  """The reference of the resume tests: 4 steps by one process, in-process loading; its
  batches are those `maxtext-netdata batches` prints for the same config."""
  data = pipeline_overrides(raw_dir, tmp_path_factory.mktemp("whole"), data_shuffle_seed=5)
  whole = _train_run(data, "whole", 4, 1, 0)
  # The trainer reads configs/smoke.yml, whose data keys (split, field order) differ from base.yml.
  assert whole["digests"] == batches_cli_digests(data, 4, "configs/smoke.yml")
  return whole


@pytest.mark.slow
@pytest.mark.parametrize(
  ("saved", "resumed"),
  [((2, 1), (1, 0)), ((1, 2), (2, 0))],
  ids=["2 processes with workers -> 1", "1 process with 2 workers -> 2"],
)
def test_checkpoint_resumes_on_another_process_count_with_the_same_batches(
  raw_dir, tmp_path, saved, resumed, uninterrupted_run
):
  """(processes, grain workers) of the saving and the resuming run: the resumed run trains on
  the batches, and ends with the loss, of an uninterrupted one-process run."""
  base = tmp_path / "run"
  data = pipeline_overrides(raw_dir, base, data_shuffle_seed=5)
  whole = uninterrupted_run
  first = _train_run(data, "resume", 2, *saved)
  names = sorted(p.name for p in (base / "resume/checkpoints/2/iter").glob("*.json"))
  assert names == [f"process_{i}-of-{saved[0]}.json" for i in range(saved[0])]
  rest = _train_run(data, "resume", 4, *resumed)
  assert first["digests"] + rest["digests"] == whole["digests"]
  # Data is a pure function of the config: bits. The loss is a float reduction whose order
  # follows the process topology (a 2-process all-reduce adds the per-device gradients in
  # another order than one process with the same 4 devices), so a run that spent some steps on
  # another process count agrees to LOSS_RTOL_ACROSS_TOPOLOGIES, not to the last bit
  # (docs/multihost.md, "What is exact").
  np.testing.assert_allclose(
    rest["final_loss"], whole["final_loss"], rtol=LOSS_RTOL_ACROSS_TOPOLOGIES
  )
  records = [json.loads(line) for line in (base / "resume/metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == [0, 1, 2, 3]
