"""The XLA flags this project's runs start with, unless `XLA_FLAGS` already sets them.

XLA reads `XLA_FLAGS` once, when the first backend starts (the first `jax.devices()` or
compile), so only an entry point may add to it: the `maxtext-netdata` command (`train`,
`bench`, `maxtext-train`, ...) and the accelerator check call `apply()` before anything starts
a backend. A flag the environment names keeps the environment's value:
`XLA_FLAGS=--xla_gpu_enable_triton_gemm=true maxtext-netdata train ...` runs without the
default. The flags only change what XLA's GPU compiler does; CPU and TPU runs ignore them.

- `--xla_gpu_enable_triton_gemm=false`: the matmuls go to cuBLAS, not to XLA's Triton GEMM
  fusions. On an H200 XLA chose Triton for the latency model's key, value and output weight
  gradients and ran them split-K (f32 partial sums, then a reduction fusion): 10.4 ms of a 74
  ms step for 9% of its FLOPs, ~200 TFLOP/s against cuBLAS's ~750 for the other matmuls. Off,
  the step took 67.9 against 73.9 ms at batch 32 (1.09x, MFU 33.6% -> 36.5%) and 130.0
  against 134.1 ms at batch 64 (docs/performance.md, "On an H200, a fourth run").

For one run's steps, the config key `compile_xla_flags` (MaxText's key and syntax, read by
`config.compile_options`) holds XLA options passed to `jax.jit(compiler_options=...)` when
the trainer compiles its train and eval steps, over `XLA_FLAGS`: several runs of one process
can each have their own (the accelerator check's XLA option sweep of `CANDIDATES`), and a
name XLA does not know fails that compile, naming it, instead of ending the process.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import MutableMapping

DEFAULTS = {"xla_gpu_enable_triton_gemm": "false"}

# Flag sets run against the defaults by the accelerator check's XLA option sweep as
# `compile_xla_flags`: what might cut the ~16-18 ms of memory-bound fusions in the H200's 68 ms
# step, by fusing elementwise work into the matmuls (cuDNN's GEMM fusions) or by emitting
# the norms and elementwise fusions with Triton's block-level emitter. On an H200 none beat
# the defaults (docs/performance.md, "a fifth run"); kept for the check on other chips. Each
# must differ from XLA's defaults (tests/trainer/test_xla_flags.py:
# `--xla_gpu_enable_cublaslt=true`, once listed here, is the default of jaxlib 0.11.2 and
# later, and would have measured nothing).
CANDIDATES = {
  "cudnn_gemm_fusion": "--xla_gpu_enable_triton_gemm=true --xla_gpu_cudnn_gemm_fusion_level=2",
  "block_level_fusions": "--xla_gpu_experimental_enable_fusion_block_level_rewriter=true",
  "triton_elementwise_fusions": (
    "--xla_gpu_experimental_enable_triton_heroless_priority_fusion=true"
  ),
}


def _names(flags: str) -> set[str]:
  """The flag names in an XLA_FLAGS value (`--name=value` or `--name`)."""
  return {token.lstrip("-").split("=", 1)[0] for token in shlex.split(flags) if token}


def with_defaults(flags: str) -> str:
  """`flags` with each default it does not name put before it."""
  named = _names(flags)
  missing = [f"--{name}={value}" for name, value in DEFAULTS.items() if name not in named]
  return " ".join([*missing, flags.strip()]).strip()


def apply(environ: MutableMapping[str, str] = os.environ) -> str:
  """Adds the defaults to `environ["XLA_FLAGS"]`; returns the new value."""
  environ["XLA_FLAGS"] = with_defaults(environ.get("XLA_FLAGS", ""))
  return environ["XLA_FLAGS"]
