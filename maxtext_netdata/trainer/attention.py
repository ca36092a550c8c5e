"""The kernels of the trainer's attention, causal within packed segments, and their masks.

`attention` (the config key) picks the kernel; every one computes the same function, causal AND
same segment, exactly (docs/training.md, "Attention"):
- `dot_product`: `jax.nn.dot_product_attention` with `is_causal=True` and the same-segment
  mask, by cuDNN's fused kernel on an NVIDIA GPU with bfloat16/float16 activations when it
  takes the shapes (JAX checks them as it traces), else by XLA's. JAX 0.11-0.12 left to
  itself picks XLA's everywhere, whose scores [b, heads, T, T] in float32 a training step
  keeps for every layer: 71 GiB for the 112M model at 32 x 1024 on an H100, out of memory;
- `xla`: the same call with `implementation="xla"`;
- `cudnn`: the same call with `implementation="cudnn"`: cuDNN's fused flash-attention kernel
  (NVIDIA GPUs, bfloat16/float16 activations only). It takes no segment ids, so the
  same-segment mask goes in as `mask`, which JAX hands to cuDNN as an additive bias, and
  `is_causal=True` lets the kernel skip the tiles above the diagonal;
- `cudnn_packed`: cuDNN's fused kernel in its packed layout (JAX's private
  `jax._src.cudnn.fused_attention_stablehlo.dot_product_attention` with segment lengths and
  offsets, NVIDIA Hopper or later): each run of equal segment ids, padding's included, is a
  sequence of its own, so there is no [b, 1, T, T] bias to read and the kernel skips the
  tiles between segments as well as those above the diagonal (`packed_segments`). Exact for
  rows whose segments are contiguous runs, the pipeline's rows (docs/spec.md, "Filling"):
  a test compares the mask the runs imply with `attention_mask` on generated batches;
  `max_segments_per_seq` (MaxText's key) is the room for runs a row, and a batch with a row
  of more takes the same-segment mask's kernel for that step instead (a `lax.cond`);
- `pallas`: JAX's Pallas flash-attention kernel for GPUs
  (`jax.experimental.pallas.ops.gpu.attention.mha`, lowered through Triton), which takes the
  segment ids themselves: causal and same segment inside the kernel, no [b, 1, T, T] mask to
  read, the tiles above the diagonal skipped, forward and backward. Off a GPU it runs in
  Pallas's interpreter (how the CPU tests check it computes the same function), far too slow
  to train with, so the trainer takes it on a GPU only;
- `einsum`: the plain einsum + softmax over a dense causal-and-segment mask, the reference
  the others are tested against.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from maxtext_netdata.config import Config

# `attention` key → `jax.nn.dot_product_attention(implementation=...)`.
_IMPLEMENTATIONS = {"dot_product": None, "xla": "xla", "cudnn": "cudnn"}


def segment_mask(segmentation: jax.Array) -> jax.Array:
  """[batch, 1, q, k] True where query q and key k are in the same segment."""
  return (segmentation[:, :, None] == segmentation[:, None, :])[:, None]


def attention_mask(segmentation: jax.Array) -> jax.Array:
  """[batch, 1, q, k] True where query q may attend to key k: causal and same segment.

  Padding (segment 0) attends to earlier padding, so no row is empty and softmax stays finite;
  its outputs never reach the loss.
  """
  length = segmentation.shape[-1]
  causal = jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))
  return causal[None, None] & segment_mask(segmentation)


def einsum_attention(
  query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array
) -> jax.Array:
  """Softmax attention [b, t, heads, head_dim] under `mask` = `attention_mask(...)`: scores
  and softmax in float32, the weighted sum of the values in the activation dtype."""
  groups = query.shape[2] // key.shape[2]
  if groups > 1:
    key = jnp.repeat(key, groups, axis=2)
    value = jnp.repeat(value, groups, axis=2)
  query = query * jnp.asarray(query.shape[-1] ** -0.5, query.dtype)
  scores = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=jnp.float32)
  scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(scores, axis=-1).astype(query.dtype)
  return jnp.einsum("bhqk,bkhd->bqhd", weights, value)


class PackedSegments(NamedTuple):
  """A batch's rows as cuDNN's packed layout takes them: each run of equal segment ids (the
  padding at a row's end a run of its own) one sequence. `seqlen` [b, M] the runs' lengths,
  `offsets` [b, M + 1] their first positions, -1 past a row's last run (the layout of JAX's
  `q_seqlen`/`q_offsets`); `fits`: every row has at most M runs; `mask`: the same-segment
  mask, for a batch that does not fit."""

  seqlen: jax.Array
  offsets: jax.Array
  fits: jax.Array
  mask: jax.Array


def packed_segments(segmentation: jax.Array, max_runs: int) -> PackedSegments:
  """The runs of equal ids of `segmentation` [b, T] in cuDNN's packed layout, with room for
  `max_runs` a row."""
  rows = segmentation.shape[0]
  starts = jnp.concatenate(
    [jnp.ones((rows, 1), jnp.bool_), segmentation[:, 1:] != segmentation[:, :-1]], axis=1
  )
  run = jnp.cumsum(starts, axis=1, dtype=jnp.int32) - 1  # [b, T]: the run of each position
  runs = run[:, -1] + 1
  slots = jnp.arange(max_runs, dtype=jnp.int32)
  lengths = (run[:, :, None] == slots).sum(axis=1, dtype=jnp.int32)  # [b, M]
  present = slots[None] < runs[:, None]
  seqlen = jnp.where(present, lengths, -1)
  offsets = jnp.where(present, jnp.cumsum(lengths, axis=1) - lengths, -1)
  offsets = jnp.concatenate([offsets, jnp.full((rows, 1), -1, jnp.int32)], axis=1)
  return PackedSegments(seqlen, offsets, jnp.all(runs <= max_runs), segment_mask(segmentation))


def packed_attention(
  query: jax.Array, key: jax.Array, value: jax.Array, packed: PackedSegments
) -> jax.Array:
  """Causal attention within each run of `packed` by cuDNN's packed layout; a batch that does
  not fit (`packed.fits` false) takes the same-segment mask's kernel for that step (that of
  `dot_product`: cuDNN's where it runs, as `cudnn_packed` does)."""
  from jax._src.cudnn import fused_attention_stablehlo as cudnn  # noqa: PLC0415 (GPU only)

  def packed_kernel(query, key, value):
    return cudnn.dot_product_attention(
      query,
      key,
      value,
      q_seqlen=packed.seqlen,
      kv_seqlen=packed.seqlen,
      q_offsets=packed.offsets,
      kv_offsets=packed.offsets,
      scale=query.shape[-1] ** -0.5,
      mask_type=cudnn.MaskType.PADDING_CAUSAL,
      qkv_layout="BTNH",
    )

  def masked_kernel(query, key, value):  # cuDNN's kernel with the mask, on a GPU in 16 bits
    return attend(query, key, value, packed.mask, "dot_product")

  return jax.lax.cond(packed.fits, packed_kernel, masked_kernel, query, key, value)


# The Pallas kernel's tiles: the forward's (query x key rows) and the backward's, for dK/dV and
# for dQ; those of Triton's fused-attention tutorial for head_dim 64 on Hopper, each capped at
# the sequence length (which they must divide).
PALLAS_BLOCKS = {"q": 128, "k": 64, "q_dkv": 32, "kv_dkv": 128, "q_dq": 128, "kv_dq": 32}


def _pallas_ops():
  import warnings  # noqa: PLC0415

  with warnings.catch_warnings():  # JAX names a successor; the kernel is the one it ships
    warnings.simplefilter("ignore", DeprecationWarning)
    from jax.experimental.pallas.ops.gpu import attention as pallas_gpu  # noqa: PLC0415
  return pallas_gpu


def _pallas_options(query: jax.Array) -> dict:
  """The Pallas kernel's arguments for `query`'s shape (its tiles capped at the length)."""
  pallas_gpu = _pallas_ops()
  length = query.shape[1]
  blocks = {name: min(size, length) for name, size in PALLAS_BLOCKS.items()}
  uneven = sorted({size for size in blocks.values() if length % size})
  if uneven:
    raise ValueError(
      f"attention=pallas: max_target_length={length} must be a multiple of its tiles {uneven}"
    )
  sizes = pallas_gpu.BlockSizes(
    block_q=blocks["q"],
    block_k=blocks["k"],
    block_q_dkv=blocks["q_dkv"],
    block_kv_dkv=blocks["kv_dkv"],
    block_q_dq=blocks["q_dq"],
    block_kv_dq=blocks["kv_dq"],
  )
  # The order of `_mha_backward`'s leading arguments.
  return dict(
    sm_scale=query.shape[-1] ** -0.5,
    causal=True,
    block_sizes=sizes,
    backward_pass_impl="triton",
    num_warps=None,
    num_stages=2,
    grid=None,
    interpret=jax.default_backend() != "gpu",
    debug=False,
  )


@jax.custom_vjp
def _pallas_mha(query, key, value, segmentation):
  return _pallas_ops().mha.fun(
    query, key, value, segmentation, return_residuals=False, **_pallas_options(query)
  )


def _pallas_mha_forward(query, key, value, segmentation):
  # The kernel itself (`mha.fun`), not JAX's custom-VJP wrapper around it: a `jax.checkpoint`
  # policy sees through this function's forward to the kernel's `pallas_call`, not through
  # a custom VJP nested in it, so `minimal_with_context` can keep the output and statistics.
  out, lse = _pallas_ops().mha.fun(
    query, key, value, segmentation, return_residuals=True, **_pallas_options(query)
  )
  return out, (query, key, value, segmentation, out, lse)


def _pallas_mha_backward(residuals, grad):
  options = _pallas_options(residuals[0])
  d_query, d_key, d_value, _ = _pallas_ops()._mha_backward(
    *options.values(), False, residuals, grad
  )
  no_gradient = np.zeros(residuals[3].shape, jax.dtypes.float0)  # integer segment ids
  return d_query, d_key, d_value, no_gradient


_pallas_mha.defvjp(_pallas_mha_forward, _pallas_mha_backward)


def pallas_attention(
  query: jax.Array, key: jax.Array, value: jax.Array, segmentation: jax.Array
) -> jax.Array:
  """Causal attention within segments by Pallas's flash-attention kernel
  (`jax.experimental.pallas.ops.gpu.attention`: its forward kernel and its backward, JAX 0.11
  and 0.12 alike), which compares the segment ids `segmentation` [b, T] itself; key/value
  heads are repeated for grouped queries (the kernel takes one head count). Interpreted off a
  GPU. Its own custom VJP (rather than the module's `mha`) so that `remat_policy` can keep
  the forward's outputs (`model.PALLAS_ATTENTION_FWD`)."""
  groups = query.shape[2] // key.shape[2]
  if groups > 1:
    key, value = jnp.repeat(key, groups, axis=2), jnp.repeat(value, groups, axis=2)
  return _pallas_mha(query, key, value, segmentation.astype(jnp.int32))


def attend(query: jax.Array, key: jax.Array, value: jax.Array, mask, kernel: str) -> jax.Array:
  """Causal attention within segments by `kernel` (the `attention` key).

  `mask` is what `kernel_mask` builds: `attention_mask(...)` for `einsum`, `PackedSegments`
  for `cudnn_packed`, the segment ids for `pallas`, `segment_mask(...)` for the others, which
  add causality with `is_causal=True`. Grouped-query heads go to the kernels as they are (they
  group them).
  """
  if kernel == "einsum":
    return einsum_attention(query, key, value, mask)
  if kernel == "pallas":
    return pallas_attention(query, key, value, mask)
  if kernel == "cudnn_packed":
    return packed_attention(query, key, value, mask)

  def call(implementation: str | None) -> jax.Array:
    return jax.nn.dot_product_attention(
      query,
      key,
      value,
      mask=mask,
      scale=query.shape[-1] ** -0.5,
      is_causal=True,
      implementation=implementation,
    )

  if kernel == "dot_product" and cudnn_may_run(query.dtype):
    try:
      return call("cudnn")
    except _CUDNN_REFUSALS:
      return call("xla")
  return call(_IMPLEMENTATIONS[kernel])


# What JAX raises while tracing when cuDNN's kernel cannot take the shapes, the layout or
# the installed cuDNN version; `dot_product` then runs XLA's.
_CUDNN_REFUSALS = (NotImplementedError, ValueError, RuntimeError)


def cudnn_may_run(dtype: jnp.dtype) -> bool:
  """Whether cuDNN's fused kernel is worth trying: a GPU backend and 16-bit activations."""
  return jax.default_backend() == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)


def attention_used(cfg: Config) -> str:
  """The kernel `cfg.attention` runs here for `cfg`'s shapes: the key itself, or for
  `dot_product` `cudnn` or `xla` (with cuDNN's refusal when it refused), found by tracing
  one row of attention."""
  if cfg.attention != "dot_product":
    return cfg.attention
  dtype = jnp.dtype(cfg.dtype)
  if not cudnn_may_run(dtype):
    return "xla"
  row = (1, cfg.max_target_length)
  query = jax.ShapeDtypeStruct((*row, cfg.base_num_query_heads, cfg.head_dim), dtype)
  key = jax.ShapeDtypeStruct((*row, cfg.base_num_kv_heads, cfg.head_dim), dtype)
  segmentation = jax.ShapeDtypeStruct(row, jnp.int32)

  def cudnn(query, key, value, segmentation):
    return attend(query, key, value, segment_mask(segmentation), "cudnn")

  try:
    jax.eval_shape(cudnn, query, key, key, segmentation)
  except _CUDNN_REFUSALS as e:
    return f"xla (cuDNN refused: {str(e).splitlines()[0] if str(e) else type(e).__name__})"
  return "cudnn"


def kernel_mask(segmentation: jax.Array, kernel: str, max_segments_per_seq: int = 16):
  """The mask `attend` takes for `kernel`, built once per batch and shared by every layer."""
  if kernel == "einsum":
    return attention_mask(segmentation)
  if kernel == "cudnn_packed":
    return packed_segments(segmentation, max_segments_per_seq)
  if kernel == "pallas":
    return segmentation
  return segment_mask(segmentation)
