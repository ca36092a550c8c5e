"""`maxtext-netdata batches`: digests of global batches for determinism and resume checks."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from maxtext_netdata import cli
from maxtext_netdata import config as config_lib
from maxtext_netdata.data.prepare import prepare
from maxtext_netdata.input_pipeline import network_grain
from maxtext_netdata.input_pipeline.sequences import KEYS, BatchBuilder
from tests.helpers import pipeline

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def overrides(tmp_path_factory):
  return pipeline.small_run_overrides(tmp_path_factory.mktemp("batches"))


def run_batches(capsys, overrides, *args):
  code = cli.main(["batches", "configs/base.yml", *overrides, *args])
  out = capsys.readouterr()
  return code, out.out.splitlines(), out.err


def test_lines_are_sha256_of_the_six_arrays(capsys, overrides):
  code, lines, _ = run_batches(capsys, [*overrides, "grain_worker_count=0"], "--steps", "3")
  assert code == 0 and len(lines) == 3
  config = config_lib.load(None, [*overrides, "grain_worker_count=0"])
  builder = BatchBuilder.from_config(config, prepare.ensure_prepared(config).train, 4)
  iterator = network_grain.make_iterator(config, builder, 0, 4, builder.num_steps)
  for step, line in enumerate(lines):
    batch = next(iterator)
    h = hashlib.sha256()
    for key in KEYS:
      assert batch[key].dtype == np.int32
      h.update(batch[key].tobytes())
    assert line == f"step {step} {h.hexdigest()}"
  iterator.close()


def test_start_resumes_mid_epoch(capsys, overrides):
  _, whole, _ = run_batches(capsys, [*overrides, "grain_worker_count=0"], "--steps", "5")
  _, tail, _ = run_batches(
    capsys, [*overrides, "grain_worker_count=0"], "--steps", "3", "--start", "2"
  )
  assert tail == whole[2:]


@pytest.mark.slow
def test_same_digests_for_zero_and_two_workers_and_a_clean_exit(overrides):
  """Through the console entry point, as a user runs it. With workers, every /dev/shm block
  they handed over is unlinked before the process ends, not left to Python's resource tracker
  (which would warn of leaked shared_memory objects). The same from workers that read the
  store at random, each with its read-ahead thread."""
  outputs = []
  for workers, access in ((0, "auto"), (2, "auto"), (2, "random")):
    result = subprocess.run(
      [
        sys.executable,
        "-m",
        "maxtext_netdata",
        "batches",
        "configs/base.yml",
        *overrides,
        f"grain_worker_count={workers}",
        f"network_store_access={access}",
        "--steps",
        "4",
      ],
      cwd=REPO,
      env=dict(os.environ, JAX_PLATFORMS="cpu"),
      capture_output=True,
      text=True,
      timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "leaked" not in result.stderr, result.stderr[-2000:]
    outputs.append(result.stdout)
  assert outputs[0] == outputs[1] == outputs[2] and len(outputs[0].splitlines()) == 4


@pytest.mark.slow
def test_a_machines_first_run_prints_its_batches_before_the_kernel_is_compiled(
  capsys, overrides, tmp_path
):
  """With an empty numba cache the batches come from the kernel's Python code while it
  compiles, the same digests as the compiled kernel's; the command then waits for the compile
  so that the next run loads it (and says nothing of it). A builder's batches asked for at
  once are then all the kernel's: its load (~0.5 s) is waited for, not raced by the Python
  code for the GIL (12-15 s to load beside it, 32 x 1024 batches at ~10 a second meanwhile)."""
  args = [*overrides, "grain_worker_count=0"]
  _, expected, _ = run_batches(capsys, args, "--steps", "3")
  env = dict(os.environ, JAX_PLATFORMS="cpu", NUMBA_CACHE_DIR=str(tmp_path / "cache"))
  command = [sys.executable, "-m", "maxtext_netdata", "batches", "configs/base.yml", *args]
  runs = [
    subprocess.run(
      [*command, "--steps", "3"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    for _ in range(2)
  ]
  for run in runs:
    assert run.returncode == 0 and run.stdout.splitlines() == expected, run.stderr[-2000:]
  cold, warm = runs[0].stderr, runs[1].stderr
  built = re.search(r"(\d+) batches were built by the batch kernel's Python code", cold)
  assert built and 1 <= int(built.group(1)) <= 3, cold
  assert "finishing the batch kernel's compile" in cold, cold
  assert "compiled the batch kernel" not in warm and "finishing" not in warm, warm
  at_once = subprocess.run(
    [sys.executable, "-c", _AT_ONCE.format(overrides=args)],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert at_once.returncode == 0, at_once.stderr[-2000:]
  assert at_once.stdout.split() == ["python", "0", "kernel", "20"], at_once.stderr[-2000:]


# 20 batches as soon as the builder exists: how many the Python code built, and the kernel.
_AT_ONCE = """
from maxtext_netdata import config
from maxtext_netdata.data.prepare import prepare
from maxtext_netdata.input_pipeline import batch_kernel_loading
from maxtext_netdata.input_pipeline.sequences import BatchBuilder
cfg = config.load("configs/base.yml", {overrides!r})
builder = BatchBuilder.from_config(cfg, prepare.ensure_prepared(cfg).train, 4)
kernel = 0
for step in range(20):
  rows = builder.gather(step, 0, 4)
  kernel += batch_kernel_loading.fill_batch_now() is batch_kernel_loading.fill_batch
  builder.build_shifted(rows)
print("python", batch_kernel_loading._python_batches[0], "kernel", kernel)
"""


def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path):
  code, lines, err = run_batches(
    capsys,
    [f"grain_train_files={tmp_path}/missing-*.parquet", f"base_output_directory={tmp_path}"],
    "--steps",
    "1",
  )
  assert code == 2 and not lines
  assert err.startswith("maxtext-netdata batches: error:") and len(err.strip().splitlines()) == 1
  code, _, err = run_batches(capsys, ["dataset_type=synthetic"], "--steps", "1")
  assert code == 2 and "network_grain" in err


def test_the_loader_reads_the_store_the_way_the_config_says(overrides):
  stores = {}
  for access in ("normal", "random", "auto"):
    config = config_lib.load(None, [*overrides, f"network_store_access={access}"])
    builder = BatchBuilder.from_config(config, prepare.ensure_prepared(config).train, 4)
    stores[access] = builder.store
  assert {k: s.access for k, s in stores.items()} == {
    "normal": "normal",
    "random": "random",
    "auto": "normal",  # a test store fits in memory
  }
