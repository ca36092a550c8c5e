"""A step's kernel time by what each kernel does, read from the kernels' names in a trace.

`device_time` sums the op events of `profile.read_events` (whose sixth field is the kernel's
name) over a window of steps, per `kernel_class`: attention, matmul, scatter, copy or the
rest, and names the heaviest kernels; `profile.analyze_events` reports it as `device_time`.
"""

from __future__ import annotations

import re
from collections import Counter

# What a kernel does, from its name (GPU kernels: cuDNN's flash attention `sm90_flash_*`,
# cuBLAS's `nvjet_*` and CUTLASS GEMMs seen on an H100; on the CPU, XLA's op names: its
# matmuls show as `ynn_fusion.N` (YNNPACK) or `dot.N`, both seen with jax 0.11 and 0.12).
KERNEL_CLASSES = (
  ("attention", re.compile(r"flash|fmha|sdpa|attention|cudnn", re.IGNORECASE)),
  ("matmul", re.compile(r"gemm|nvjet|cutlass|xmma|cublas|matmul|wgmma|ynn_fusion|\bdot", re.I)),
  # XLA's scatters (the gradient of a gather: an embedding lookup's), whose time depends on
  # how often the indices repeat.
  ("scatter", re.compile(r"scatter", re.IGNORECASE)),
  ("copy", re.compile(r"memcpy|memset|copy|transpose", re.IGNORECASE)),
)


# XLA's CPU ops that run others (a scanned loop's `while.4`): their time is their body's.
_CONTAINER = re.compile(r"(while|conditional|call)(\.\d+)?$")


def kernel_class(name: str) -> str:
  """`attention`, `matmul`, `scatter`, `copy` or `other` (fusions of elementwise ops and
  reductions)."""
  return next((label for label, pattern in KERNEL_CLASSES if pattern.search(name)), "other")


def device_time(ops, lo: int, hi: int, periods: int, top: int = 6) -> dict | None:
  """Kernel time per step of the op events that start in [lo, hi) (`periods` steps), by
  `kernel_class` and for the `top` kernels; None without ops carrying kernel names (TPU
  traces, saved events of before). Kernels on several streams can overlap, so the classes
  may add up to more than the step."""
  named = [o for o in ops if len(o) > 5 and lo <= o[2] < hi and not _CONTAINER.match(o[5])]
  if not named or periods < 1:
    return None
  classes = dict.fromkeys((*(label for label, _ in KERNEL_CLASSES), "other"), 0)
  kernels: Counter = Counter()
  for _, _, start, end, _, kernel in named:
    classes[kernel_class(kernel)] += end - start
    kernels[kernel[:100]] += end - start
  return {
    "kernels_s": sum(classes.values()) / 1e9 / periods,
    "by_class_s": {label: ns / 1e9 / periods for label, ns in classes.items()},
    "top_kernels_s": {name: ns / 1e9 / periods for name, ns in kernels.most_common(top)},
  }
