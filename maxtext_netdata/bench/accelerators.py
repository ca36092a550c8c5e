"""How many tokens per second an accelerator would consume training the configured model.

The cost of a token is MaxText's count (`model.training_flops_per_token`): 6 FLOPs per matmul
weight (forward 2, backward 4) plus causal self-attention. A share (MFU) of the chip's peak
divided by that cost gives the tokens per second the chip eats, and so the step time the input
pipeline must beat. `environment` says which chip (and host) a process runs on.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

import jax
import psutil

from maxtext_netdata.bench import loading
from maxtext_netdata.bench.chips import DEVICE_KINDS, PEAK_TFLOPS
from maxtext_netdata.config import Config
from maxtext_netdata.errors import ConfigError
from maxtext_netdata.trainer import model

# Reported when installed: the stack the step runs on and what the pipeline imports.
PACKAGES = (
  "jax",
  "jaxlib",
  "jax-cuda13-plugin",
  "jax-cuda12-plugin",
  "libtpu",
  "flax",
  "optax",
  "orbax-checkpoint",
  "grain",
  "numba",
  "numpy",
  "pyarrow",
  "pydantic",
  "tensorboardX",
)

# MFUs the estimate is stated at: 40% is a good real run, 60% an excellent one.
ESTIMATE_MFUS = (0.4, 0.6)


def resolve_peak_tflops(
  peak_tflops: float | None, accelerator: str | None, config: Config
) -> tuple[float, str]:
  """(peak TFLOP/s per chip, chip name) from `--peak-tflops`, `--accelerator` or the config.

  The name is a listed chip's when the peak is one of theirs, else the peak in words.
  """
  if accelerator is not None:
    key = accelerator.lower()
    if key not in PEAK_TFLOPS:
      raise ConfigError(
        f"--accelerator={accelerator!r} is not one of {', '.join(sorted(PEAK_TFLOPS))}"
      )
    return PEAK_TFLOPS[key], key
  peak = config.peak_tflops_per_device if peak_tflops is None else peak_tflops
  if peak <= 0:
    raise ConfigError(f"peak of {peak} TFLOP/s must be positive")
  name = next((k for k, v in PEAK_TFLOPS.items() if v == peak), f"{peak:g}-TFLOP/s chip")
  return peak, name


def chip_of_device_kind(device_kind: str) -> str | None:
  """The PEAK_TFLOPS chip of a jax `device_kind`, or None for one not listed (a CPU)."""
  return next((chip for pattern, chip in DEVICE_KINDS if pattern in device_kind), None)


def estimate(
  config: Config,
  name: str,
  peak_tflops: float,
  tokens_per_batch: int,
  devices: int = 1,
  mfus: tuple[float, ...] = ESTIMATE_MFUS,
) -> dict:
  """Tokens/s and step time of `devices` chips at each MFU, for batches of `tokens_per_batch`.

  Returns a JSON-ready dict: the chip `name` and peak, the model's parameters and training
  FLOPs per token (as `model.training_flops_per_token` counts them), and per MFU the tokens/s
  consumed and the step time of one batch.
  """
  flops_per_token = model.training_flops_per_token(config)
  at_mfu = []
  for mfu in mfus:
    tokens_per_s = devices * mfu * peak_tflops * 1e12 / flops_per_token
    at_mfu.append(
      {
        "mfu": mfu,
        "tokens_per_s": tokens_per_s,
        "step_time_s": tokens_per_batch / tokens_per_s,
      }
    )
  return {
    "name": name,
    "params": model.num_params(config),
    "flops_per_token": flops_per_token,
    "peak_tflops": peak_tflops,
    "devices": devices,
    "tokens_per_batch": tokens_per_batch,
    "at_mfu": at_mfu,
  }


def environment(peak_tflops: float | None) -> dict:
  """Versions, devices, the chip and its peak (`peak_tflops` if given), host cores and memory."""
  devices = jax.devices()
  kind = devices[0].device_kind
  chip = chip_of_device_kind(kind)
  memory = devices[0].memory_stats() or {}
  return {
    "python": platform.python_version(),
    "executable": sys.executable,
    "packages": {name: version for name in PACKAGES if (version := _version(name))},
    "platform": devices[0].platform,
    "device_kind": kind,
    "devices": len(devices),
    "processes": jax.process_count(),
    "chip": chip,
    "peak_tflops": peak_tflops or (PEAK_TFLOPS[chip] if chip else None),
    "device_memory_bytes": memory.get("bytes_limit"),
    "cpu_cores": loading.cpu_cores(),
    "host_memory_bytes": psutil.virtual_memory().total,
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
  }


def _version(name: str) -> str | None:
  try:
    return metadata.version(name)
  except metadata.PackageNotFoundError:
    return None
