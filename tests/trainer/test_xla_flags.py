"""The XLA flags the entry points start with: added where the environment is silent, the
environment's own value kept, and the result accepted by the installed XLA."""

import os
import subprocess
import sys

import pytest

from maxtext_netdata.trainer import xla_flags

TRITON_OFF = "--xla_gpu_enable_triton_gemm=false"


@pytest.mark.parametrize(
  ("given", "expected"),
  [
    ("", TRITON_OFF),
    ("  ", TRITON_OFF),
    (
      "--xla_force_host_platform_device_count=2",
      f"{TRITON_OFF} --xla_force_host_platform_device_count=2",
    ),
    ("--xla_gpu_enable_triton_gemm=true", "--xla_gpu_enable_triton_gemm=true"),
    ("--xla_gpu_enable_triton_gemm", "--xla_gpu_enable_triton_gemm"),
    (
      "--xla_dump_to=/tmp/a --xla_gpu_enable_triton_gemm=true",
      "--xla_dump_to=/tmp/a --xla_gpu_enable_triton_gemm=true",
    ),
  ],
)
def test_a_default_is_added_only_where_the_environment_does_not_name_its_flag(given, expected):
  assert xla_flags.with_defaults(given) == expected


def test_apply_sets_the_environment_and_is_idempotent():
  environ = {}
  assert xla_flags.apply(environ) == TRITON_OFF == environ["XLA_FLAGS"]
  assert xla_flags.apply(environ) == TRITON_OFF


def test_the_installed_xla_knows_every_candidate_flag():
  """The candidates are for a machine lent for minutes: a name XLA does not know would end that
  run at its first device instead of measuring."""
  flags = " ".join(xla_flags.CANDIDATES.values())
  result = subprocess.run(
    [sys.executable, "-c", "import jax; print(len(jax.devices()))"],
    env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags},
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert result.returncode == 0 and result.stdout.strip() == "1", result.stderr[-2000:]


def test_the_installed_xla_accepts_the_flags_and_keeps_the_environment_s_own():
  """XLA aborts the process on a flag it does not know: a default this jaxlib lacks would end
  every run at its first device. The user's flag (3 host devices) must still take effect."""
  code = (
    "import jax\n"
    "from maxtext_netdata.trainer import xla_flags\n"
    "print(xla_flags.apply())\n"  # after importing jax, before any backend: as the entries do
    "print(len(jax.devices()))\n"
  )
  env = {
    **os.environ,
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": "--xla_force_host_platform_device_count=3",
  }
  result = subprocess.run(
    [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
  )
  assert result.returncode == 0, result.stderr[-2000:]
  flags, devices = result.stdout.strip().splitlines()
  assert flags == f"{TRITON_OFF} --xla_force_host_platform_device_count=3"
  assert devices == "3"
