"""The XLA flags the entry points start with: added where the environment is silent, the
environment's own value kept, and the result accepted by the installed XLA; `compile_xla_flags`
read into compile options; the candidates the accelerator check sweeps known to XLA and other
than its defaults."""

import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from maxtext_netdata import config
from maxtext_netdata.config import ConfigError
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


def _debug_options(folder, options: dict) -> set[str]:
  """The XLA options a compile with `options` ran with, as XLA dumps them (the lines of those
  that differ from XLA's defaults), the dump's own folder left out."""
  dump = folder / f"dump_{len(list(folder.iterdir()))}"
  compiled = jax.jit(lambda x: x * 2, compiler_options={**options, "xla_dump_to": str(dump)})
  compiled(np.ones(2, np.float32))
  (path,) = dump.glob("*.debug_options")
  return {line for line in path.read_text().splitlines() if not line.startswith("xla_dump_to")}


@pytest.mark.parametrize("name", sorted(xla_flags.CANDIDATES))
def test_every_candidate_is_known_and_changes_what_the_defaults_compile_with(name, tmp_path):
  """The candidates are for a machine lent for minutes: an option XLA does not know would fail
  the run, and one the defaults already set would measure nothing (as
  `--xla_gpu_enable_cublaslt=true` would have: on by default). Each option of a candidate must
  change the options XLA compiles with, over the defaults the check starts with."""
  defaults = config.compile_options(xla_flags.with_defaults(""))
  candidate = config.compile_options(xla_flags.CANDIDATES[name])
  base = _debug_options(tmp_path, defaults)
  changed = _debug_options(tmp_path, {**defaults, **candidate})
  for option in candidate:
    lines = ({line for line in d if line.startswith(f"{option}:")} for d in (base, changed))
    assert next(lines) != next(lines), f"--{option} is what the defaults compile with already"


@pytest.mark.parametrize(
  ("flags", "expected"),
  [
    ("", {}),
    (" --xla_gpu_enable_triton_gemm=false ", {"xla_gpu_enable_triton_gemm": False}),
    # MaxText's example continues lines with backslashes; values may hold "=".
    (
      "--xla_a=TRUE \\\n  --xla_b=65536 --xla_dump_to=/tmp/a=b",
      {"xla_a": True, "xla_b": "65536", "xla_dump_to": "/tmp/a=b"},
    ),
  ],
)
def test_compile_xla_flags_are_read_into_compile_options(flags, expected):
  assert config.compile_options(flags) == expected


@pytest.mark.parametrize(
  ("flags", "message"),
  [
    ("--xla_a", "has '--xla_a', not --name=value"),
    ("xla_a=1", "has 'xla_a=1', not --name=value"),
    ("--xla_a=", "has '--xla_a=', not --name=value"),
    ("--xla_a=1 --xla_a=2", "names --xla_a twice"),
  ],
)
def test_a_malformed_compile_xla_flags_is_a_config_error_naming_the_token(flags, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    config.compile_options(flags)
  with pytest.raises(ConfigError, match=re.escape(f"compile_xla_flags={flags!r} {message}")):
    config.load(None, [f"compile_xla_flags={flags}"])


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
