"""One layer's attention, forward and backward, by each kernel of the `attention` key on one
batch's segments: time and error against the float32 einsum reference.

The accelerator check runs it on a real batch (`attention_kernels` in its report): whether
cuDNN's packed layout (`cudnn_packed`, no [b, 1, T, T] mask bias, one sequence per segment) or
Pallas's flash attention on the segment ids (`pallas`) beats `cudnn` with the mask on the
device, and whether they compute the same function there, which a CPU cannot run (Pallas's
kernel runs here only interpreted). A kernel that cannot run here (no cuDNN on a CPU, a GPU
older than Hopper for the packed layout) is recorded with its error and the next one runs.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from maxtext_netdata.config import Config
from maxtext_netdata.trainer import attention

# (name, `attention` kernel, max_segments_per_seq): the kernels compared. JAX sizes the
# packed layout's softmax statistics and cuDNN's grid by rows x max_segments_per_seq, so the
# packed layout runs with room for 16 runs a row (the default), for 64, for the batch's own
# most (`FIT`), and for one run fewer (`SHORT`), so that the batch takes the fallback (the
# mask's kernel) inside the same compiled step.
FIT, SHORT = "fit", "short"
KERNELS = (
  ("cudnn", "cudnn", None),
  ("cudnn_packed", "cudnn_packed", 16),
  ("cudnn_packed_64", "cudnn_packed", 64),
  ("cudnn_packed_fit", "cudnn_packed", FIT),
  ("cudnn_packed_short", "cudnn_packed", SHORT),
  ("xla", "xla", None),
  ("pallas", "pallas", None),
)


def _error_line(error: BaseException) -> str:
  lines = str(error).strip().splitlines()
  return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]


def runs_per_row(segmentation: np.ndarray) -> np.ndarray:
  """The runs of equal segment ids in each row (what `cudnn_packed` makes sequences of)."""
  return 1 + (segmentation[:, 1:] != segmentation[:, :-1]).sum(axis=1)


def compare(
  cfg: Config,
  segmentation: np.ndarray,
  repeats: int = 10,
  seed: int = 0,
  kernels: tuple[str, ...] | None = None,
) -> dict:
  """Each of `KERNELS` (those named in `kernels`, by default all) on random query/key/value
  of `cfg`'s heads in `cfg.dtype` for rows of `segmentation` [b, T]: median seconds of a
  forward and backward pass, and the largest absolute difference of the output and of the
  gradients from the float32 einsum reference on the same values (the reference's own error
  is that of float32). An unknown name in `kernels` is a ValueError, before anything runs."""
  chosen = [k for k in KERNELS if kernels is None or k[0] in kernels]
  if kernels is not None and len(chosen) != len(kernels):
    known = ", ".join(name for name, *_ in KERNELS)
    raise ValueError(f"attention kernels {', '.join(kernels)}: known are {known}")
  rows, length = segmentation.shape
  dtype = jnp.dtype(cfg.dtype)
  keys = jax.random.split(jax.random.key(seed), 4)
  shapes = (cfg.base_num_query_heads, cfg.base_num_kv_heads, cfg.base_num_kv_heads)
  query, key, value = (
    jax.random.normal(k, (rows, length, heads, cfg.head_dim), dtype)
    for k, heads in zip(keys, shapes, strict=False)
  )
  cotangent = jax.random.normal(keys[3], query.shape, jnp.float32)
  segments = jnp.asarray(segmentation, jnp.int32)

  # The cotangent is an argument like the inputs, not an 8 MiB constant baked into every
  # compiled step.
  def forward_backward(kernel: str, inputs: tuple, mask, cotangent):
    def loss(query, key, value):
      out = attention.attend(query, key, value, mask, kernel)
      return jnp.sum(out.astype(jnp.float32) * cotangent), out

    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(*inputs)
    return out, grads

  as_f32 = tuple(x.astype(jnp.float32) for x in (query, key, value))
  reference = jax.jit(forward_backward, static_argnums=0)(
    "einsum", as_f32, attention.kernel_mask(segments, "einsum"), cotangent
  )
  runs = runs_per_row(np.asarray(segmentation))
  results = {}
  for name, kernel, max_runs in chosen:
    if max_runs in (FIT, SHORT):
      max_runs = int(runs.max()) - (max_runs == SHORT)
      if not max_runs:  # rows of one run: nothing falls back
        continue
    try:
      mask = jax.jit(attention.kernel_mask, static_argnums=(1, 2))(segments, kernel, max_runs or 1)
      step = jax.jit(forward_backward, static_argnums=0)
      out, grads = jax.block_until_ready(step(kernel, (query, key, value), mask, cotangent))
      seconds = []
      for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(step(kernel, (query, key, value), mask, cotangent))
        seconds.append(time.perf_counter() - start)
    except Exception as e:  # no cuDNN here, or a layout it refuses
      results[name] = {"error": _error_line(e)}
      continue
    errors = [
      float(jnp.max(jnp.abs(got.astype(jnp.float32) - want)))
      for got, want in zip((out, *grads), (reference[0], *reference[1]), strict=True)
    ]
    results[name] = {
      "max_segments_per_seq": max_runs if kernel == "cudnn_packed" else None,
      "seconds": float(np.median(seconds)),
      "max_abs_error": {"out": errors[0], "dq": errors[1], "dk": errors[2], "dv": errors[3]},
    }
  timed = {name: r["seconds"] for name, r in results.items() if "seconds" in r}
  base = timed.get("cudnn") or timed.get("xla")
  return {
    "shape": [rows, length, cfg.base_num_query_heads, cfg.base_num_kv_heads, cfg.head_dim],
    "dtype": str(dtype),
    "runs_per_row": {"max": int(runs.max()), "mean": float(runs.mean())},
    "kernels": results,
    "speedup_over": "cudnn" if "cudnn" in timed else "xla",
    "speedup": {name: base / s for name, s in timed.items()} if base else {},
  }
