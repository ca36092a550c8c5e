"""An output that cannot be written is one line on stderr, exit 2, and nothing that passes
for complete: a full disk, a file over the size limit, a read-only folder.

Each test runs the real command in a subprocess. The small filesystem is a tmpfs mounted for
the test where the test may mount one (root with CAP_SYS_ADMIN, as in CI): writes fail with
ENOSPC. Elsewhere the command runs under a per-file size limit (RLIMIT_FSIZE; Python ignores
SIGXFSZ), and writes past it fail with EFBIG; the outputs here are larger than the limit,
every incidental file (kernel and compilation caches, /dev/shm batches) smaller. The
read-only folder is a tmpfs mounted read-only, or, for a user other than root, a folder
without write permission (root writes there all the same); else those tests are skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import orbax.checkpoint as ocp
import pytest

from maxtext_netdata.data.synthetic.generate import generate
from tests.helpers import processes

MIB = 1 << 20
# Where no tmpfs can be mounted: the size limit of every file the command writes.
FILE_SIZE_LIMIT = 1 * MIB
# The command under a file-size limit: sets it, then becomes the command.
_LIMITED = (
  "import os, resource, sys; n = int(sys.argv[1]);"
  " resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); os.execv(sys.argv[2], sys.argv[2:])"
)
# A model whose checkpoint (~2.2 MB, in one file) is larger than FILE_SIZE_LIMIT.
MODEL = [
  "base_num_decoder_layers=1",
  "base_emb_dim=128",
  "base_num_query_heads=2",
  "base_num_kv_heads=2",
  "head_dim=32",
  "base_mlp_dim=256",
  "max_target_length=128",
  "per_device_batch_size=4",
  "learning_rate_schedule_steps=100",
]
# What a library prints when a failure escapes its one-line report.
NOISE = ("Traceback", "Exception", "ERROR", "Event loop", "shutting down")


@functools.cache
def _can_mount() -> bool:
  """Whether this process may mount a tmpfs (root with CAP_SYS_ADMIN)."""
  with tempfile.TemporaryDirectory() as folder:
    try:
      mounted = subprocess.run(["mount", "-t", "tmpfs", "tmpfs", folder], capture_output=True)
    except OSError:
      return False
    if mounted.returncode != 0:
      return False
    subprocess.run(["umount", folder], check=True)
  return True


@contextlib.contextmanager
def _tmpfs(path: Path, options: str):
  path.mkdir(parents=True, exist_ok=True)
  subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
  try:
    yield
  finally:
    subprocess.run(["umount", "--lazy", str(path)], check=True)


@dataclasses.dataclass
class SmallDisk:
  path: Path  # a folder on it
  launcher: list[str]  # what the command line starts with
  cause: str  # the cause a failed write reports

  def argv(self, *arguments: str) -> list[str]:
    return [*self.launcher, sys.executable, "-m", "maxtext_netdata", *arguments]


@pytest.fixture
def small_disk(tmp_path, request) -> SmallDisk:
  """A folder on a tmpfs of `request.param` bytes ("64k", "8m"), or under FILE_SIZE_LIMIT
  where no tmpfs can be mounted."""
  folder = tmp_path / "small"
  if not _can_mount():
    folder.mkdir()
    launcher = [sys.executable, "-c", _LIMITED, str(FILE_SIZE_LIMIT)]
    yield SmallDisk(folder, launcher, "file too large (EFBIG)")
    return
  with _tmpfs(folder, f"size={request.param}"):
    yield SmallDisk(folder, [], "no space left on device (ENOSPC)")


@pytest.fixture
def read_only(tmp_path) -> tuple[Path, str]:
  """(a folder no file can be written in, the cause a write there reports)."""
  folder = tmp_path / "read-only"
  if _can_mount():
    with _tmpfs(folder, "ro,size=1m"):
      yield folder, "read-only file system (EROFS)"
    return
  if os.geteuid() == 0:
    pytest.skip("neither a read-only mount (no CAP_SYS_ADMIN) nor permissions (root) here")
  folder.mkdir(mode=0o555)
  yield folder, "permission denied (EACCES)"
  folder.chmod(0o755)


def _run(argv: list[str]) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(processes.REPO))
  return subprocess.run(argv, cwd=processes.REPO, env=env, capture_output=True, text=True)


def _the_error_line(command: str, code: int, err: str) -> str:
  """The one error line of a command that failed with exit 2 and printed nothing else."""
  assert code == 2, err[-3000:]
  for noise in NOISE:
    assert noise not in err, err[-3000:]
  # Progress bars (tqdm, on stderr) end their updates in carriage returns.
  lines = [line for line in err.replace("\r", "\n").splitlines() if "error" in line]
  assert len(lines) == 1, err[-3000:]
  assert lines[0].startswith(f"maxtext-netdata {command}: error: cannot "), lines[0]
  return lines[0]


def _no_dataset(folder: Path) -> None:
  """Nothing of a raw dataset in `folder`: no marker, no shard, no temporary file."""
  assert not folder.exists() or sorted(os.listdir(folder)) == []


def _no_store(prepared: Path) -> None:
  """Nothing that passes for a prepared store, nor a build's remains (folder, lock)."""
  assert not glob.glob(f"{prepared}/**/meta.json", recursive=True)
  assert not prepared.exists() or sorted(os.listdir(prepared)) == []


@pytest.mark.parametrize("small_disk", ["1m"], indirect=True)
def test_generate_onto_a_full_disk(small_disk):
  out = small_disk.path / "raw"
  done = _run(small_disk.argv("generate", "--out", str(out), "--rows", "200000", "--shards", "1"))
  line = _the_error_line("generate", done.returncode, done.stderr)
  assert line.endswith(f"{out}/pings-00000-of-00001.parquet: {small_disk.cause}"), line
  _no_dataset(out)


@pytest.mark.parametrize("small_disk", ["1m"], indirect=True)
def test_ingest_onto_a_full_disk(small_disk, tmp_path):
  results = tmp_path / "results"
  generate(str(results), rows=150_000, shards=1, progress=False, fmt="ripe-json")
  out = small_disk.path / "raw"
  done = _run(small_disk.argv("ingest", f"{results}/pings-00000-of-00001.json", "--out", str(out)))
  line = _the_error_line("ingest", done.returncode, done.stderr)
  assert line.endswith(f"{out}/pings-00000-of-00001.parquet: {small_disk.cause}"), line
  _no_dataset(out)


@pytest.mark.parametrize(
  ("config", "overrides"),
  [("base", []), ("smoke", []), ("base", ["network_prepare_memory_mb=256"])],
  ids=["probe split", "time split", "spilled buckets"],
)
@pytest.mark.parametrize("small_disk", ["1m"], indirect=True)
def test_prepare_onto_a_full_disk(small_disk, tmp_path, config, overrides):
  """base: the probe split, assembled into files reserved up front and mapped; smoke: the
  time split, sorted pieces saved first. Either way a column (~3 MB) fills the disk. With
  256 MB the rows go to 4 buckets spilled to files first (~10 MB), which fill it earlier."""
  raw = tmp_path / "raw"
  generate(str(raw), rows=200_000, shards=2, progress=False)
  prepared = small_disk.path / "prepared"
  done = _run(
    small_disk.argv(
      "prepare",
      f"configs/{config}.yml",
      f"grain_train_files={raw}/*.parquet",
      f"network_prepared_dir={prepared}",
      *overrides,
    )
  )
  line = _the_error_line("prepare", done.returncode, done.stderr)
  written = r"bucket-\d+\.bin" if overrides else r"\S+\.npy"
  assert re.search(rf"cannot write {prepared}/\S+/{written}: {re.escape(small_disk.cause)}$", line)
  _no_store(prepared)


@pytest.mark.parametrize("small_disk", ["8m"], indirect=True)
def test_an_update_onto_a_full_disk_leaves_its_base(small_disk, tmp_path):
  """A store of 300k rows (3 MB) on the disk; a day of 150k rows more fits while it is
  prepared alone (its spill, 2.1 MB, then its store, 1.5 MB), but the merged store beside
  both (4.5 MB) does not: the one-line error, and the base as it was, the only folder left."""
  from maxtext_netdata import config as config_lib  # noqa: PLC0415
  from maxtext_netdata.data.prepare import prepare  # noqa: PLC0415

  base_raw = generate(str(tmp_path / "a"), rows=300_000, shards=1, seed=1, progress=False)
  new_raw = generate(str(tmp_path / "b"), rows=150_000, shards=1, seed=2, progress=False)
  outside = tmp_path / "outside"
  cfg = config_lib.load(
    "configs/base.yml", [f"grain_train_files={base_raw[0]}", f"network_prepared_dir={outside}"]
  )
  built = prepare.prepare(cfg, progress=False).summary["path"]
  prepared = small_disk.path / "prepared"
  base = prepared / os.path.basename(built)
  shutil.copytree(built, base)
  before = {p: p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}
  done = _run(
    small_disk.argv(
      "prepare",
      "configs/base.yml",
      f"grain_train_files={base_raw[0]},{new_raw[0]}",
      f"network_prepared_dir={prepared}",
    )
  )
  line = _the_error_line("prepare", done.returncode, done.stderr)
  assert re.search(rf"cannot write {prepared}/\S+: {re.escape(small_disk.cause)}$", line), line
  if small_disk.cause.startswith("no space"):  # the merge's split files, reserved up front
    assert re.search(rf"{prepared}/\.tmp-\S+/train/\S+\.npy: ", line), line
  assert sorted(os.listdir(prepared)) == [base.name]
  assert {p: p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()} == before


@pytest.mark.slow
@pytest.mark.parametrize("small_disk", ["8m"], indirect=True)
def test_training_stops_at_the_checkpoint_that_fills_the_disk(small_disk, tmp_path, sample_dir):
  """Saved every step, checkpoints of ~2.2 MB: a few fit on 8 MiB (none under the size
  limit). The run stops at the failed save, names the last complete checkpoint, and leaves no
  process and no /dev/shm entry; Orbax's own reports of the failure stay off stderr."""
  runs = small_disk.path / "runs"
  overrides = [
    f"grain_train_files={sample_dir}/*.parquet",
    f"network_prepared_dir={tmp_path}/prepared",
    f"base_output_directory={runs}",
    "run_name=full",
    "steps=1000",
    "checkpoint_period=1",
    "grain_worker_count=1",
    "eval_interval=-1",
    "enable_tensorboard=false",
    *MODEL,
  ]
  prepared = _run(
    [sys.executable, "-m", "maxtext_netdata", "prepare", "configs/smoke.yml", *overrides]
  )
  assert prepared.returncode == 0, prepared.stderr[-3000:]  # the store, made where it fits
  shm = set(os.listdir("/dev/shm"))
  proc = processes.start(small_disk.argv("train", "configs/smoke.yml", *overrides), str(tmp_path))
  code, _, err = processes.finish(proc, shm, timeout=120)
  line = _the_error_line("train", code, err)
  checkpoints = runs / "full" / "checkpoints"
  complete = ocp.utils.checkpoint_steps(checkpoints)
  last = (
    f"the last complete checkpoint is step {max(complete)} in {checkpoints}"
    if complete
    else f"no checkpoint in {checkpoints} is complete"
  )
  failed = max(complete, default=0) + 1
  assert line.endswith(f"cannot write {checkpoints}/{failed}: {small_disk.cause}; {last}"), line
  assert not (runs / "full" / "summary.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("small_disk", ["64k"], indirect=True)
def test_training_stops_when_its_metrics_fill_the_disk(small_disk, tmp_path, sample_dir):
  """metrics.jsonl and TensorBoard's events, a few hundred bytes a step, fill 64 KiB within
  a few hundred steps (1 MiB under the size limit: a few thousand)."""
  run = small_disk.path / "runs" / "metrics"
  overrides = [
    *processes.train_overrides(sample_dir, small_disk.path / "runs", "metrics", 10**6, 1),
    f"network_prepared_dir={tmp_path}/prepared",
    "enable_checkpointing=false",
    "enable_tensorboard=true",
  ]
  prepared = _run(
    [sys.executable, "-m", "maxtext_netdata", "prepare", "configs/smoke.yml", *overrides]
  )
  assert prepared.returncode == 0, prepared.stderr[-3000:]  # the store, made where it fits
  shm = set(os.listdir("/dev/shm"))
  proc = processes.start(small_disk.argv("train", "configs/smoke.yml", *overrides), str(tmp_path))
  code, _, err = processes.finish(proc, shm, timeout=120)
  line = _the_error_line("train", code, err)
  cause = re.escape(small_disk.cause)
  assert re.search(rf"cannot write {run}/(metrics\.jsonl|tensorboard): {cause}$", line), line
  assert not (run / "summary.json").exists()


@pytest.mark.parametrize(
  "command",
  [
    ["generate", "--out", "{out}", "--rows", "1000", "--shards", "1"],
    ["prepare", "configs/base.yml", "grain_train_files={sample}/*.parquet", "network_prepared_dir={out}"],
    ["train", "configs/smoke.yml", "grain_train_files={sample}/*.parquet", "network_prepared_dir={tmp}/prepared", "base_output_directory={out}", "steps=2"],
  ],
  ids=["generate", "prepare", "train"],
)  # fmt: skip
def test_a_read_only_folder(command, read_only, sample_dir, tmp_path):
  folder, cause = read_only
  argv = [part.format(out=folder, sample=sample_dir, tmp=tmp_path) for part in command]
  done = _run([sys.executable, "-m", "maxtext_netdata", *argv])
  line = _the_error_line(command[0], done.returncode, done.stderr)
  assert re.search(rf"cannot (write|access) {folder}\S*: {re.escape(cause)}$", line), line
  assert os.listdir(folder) == []
