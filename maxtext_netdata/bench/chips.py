"""The accelerators bench knows by name: each chip's dense bf16 peak and how jax names it.

Plain data, importing nothing, so that `bench --help` lists the chips without starting jax.
"""

from __future__ import annotations

# Dense bf16 peak TFLOP/s per chip, from the vendors' data sheets.
PEAK_TFLOPS = {
  "a100": 312.0,
  "h100": 989.0,
  "h200": 989.0,  # the H100's chip with more and faster memory
  "v5e": 197.0,
  "v5p": 459.0,
  "v6e": 918.0,
}

# jax's `device_kind` -> chip, first match wins ("NVIDIA H100 80GB HBM3", "TPU v5 lite").
# The H100 PCIe peaks lower (756) and is left unmatched rather than counted as an SXM card.
DEVICE_KINDS = (
  ("H200", "h200"),
  ("H100 PCIe", None),
  ("H100", "h100"),
  ("A100", "a100"),
  ("TPU v5 lite", "v5e"),
  ("TPU v5e", "v5e"),
  ("TPU v5", "v5p"),
  ("TPU v6 lite", "v6e"),
  ("TPU v6e", "v6e"),
)
