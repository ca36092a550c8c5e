"""A MaxText-style decoder-only Transformer in flax linen.

Token embedding, then `base_num_decoder_layers` blocks of RMSNorm → causal self-attention
with RoPE → residual → RMSNorm → gated SiLU MLP → residual (scanned over layers unless
`scan_layers` is false, as in MaxText), a final RMSNorm and an
untied output projection. Attention is causal and confined to one packed segment: a token
sees earlier tokens of its own `inputs_segmentation` id only, and RoPE rotates by
`inputs_position`, which restarts at 0 per segment. Activations are in `dtype`, parameters
in `weight_dtype`; the output projection runs in float32 when `logits_dot_in_fp32`.

`attention` picks the kernel of that attention (`trainer/attention.py`); every one computes the
same function, causal AND same segment, exactly (docs/training.md, "Attention").

`remat_policy` (MaxText's key and names) picks what each scanned block keeps for the
backward pass, by `nn.remat` with a `jax.checkpoint` policy over the names that
`checkpoint_name` gives the block's matmul outputs (MaxText's names): `none` keeps
everything, `minimal` the projections (query, key, value, out, MLP in and out),
`minimal_with_context` those and the attention output (with cuDNN's kernel, also its
softmax statistics, so its backward needs no second forward: `CUDNN_ATTENTION_FWD`; Pallas's
kernel's likewise: `PALLAS_ATTENTION_FWD`), `full`
only the block's input. The values are the same whichever; memory and step time differ.

`scan_layers` (MaxText's key, default true) scans one block over the layers, so compile time
does not grow with depth; false unrolls them (`layers_0`, `layers_1`, ...), which lets XLA
fuse and schedule across blocks at the cost of a longer compile. The parameters are laid out
differently (stacked or one set per layer): a checkpoint restores only under its setting.

`use_iota_embed` (MaxText's key) looks the tokens up by a one-hot matmul instead of a gather:
the same values, and a backward pass that is a matmul rather than a scatter-add of every
token's gradient into the vocabulary's 268 rows.

On a CPU the MLP's product goes through `gated_silu_for_cpu`, the same function with a
backward pass XLA:CPU runs vectorized (the smoke step 1.13-1.25x as fast); other backends
differentiate `silu(gate) * up` as it is.

`fused_qkv` and `fused_mlp` (MaxText's keys) make the query, key and value projections one
matmul (`qkv_proj`, [emb, 3, heads, head_dim], multi-head attention only) and the MLP's gate
and up projections one (`wi`, [emb, 2, mlp]): the same function with fewer, larger matmuls,
which a GPU runs nearer its peak at small widths. Their parameters are laid out differently,
so a checkpoint restores only under the setting it was saved with.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.ad_checkpoint import checkpoint_name

from maxtext_netdata.config import Config
from maxtext_netdata.trainer.attention import attend, kernel_mask

_ROPE_MAX_TIMESCALE = 10_000.0


def _dtype(name: str) -> jnp.dtype:
  return jnp.dtype(name)


class RMSNorm(nn.Module):
  """Root-mean-square layer norm with a learned scale, computed in float32."""

  dtype: jnp.dtype
  weight_dtype: jnp.dtype
  epsilon: float = 1e-6

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.weight_dtype)
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.epsilon)
    return (y * scale.astype(jnp.float32)).astype(self.dtype)


def apply_rope(x: jax.Array, positions: jax.Array) -> jax.Array:
  """Rotary embedding of `x` [batch, length, heads, head_dim] at `positions` [batch, length]."""
  half = x.shape[-1] // 2
  fraction = 2.0 * jnp.arange(half, dtype=jnp.float32) / x.shape[-1]
  timescale = _ROPE_MAX_TIMESCALE**fraction
  angles = positions[..., None, None].astype(jnp.float32) / timescale  # [b, t, 1, half]
  sin, cos = jnp.sin(angles), jnp.cos(angles)
  first, second = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
  return rotated.astype(x.dtype)


class Attention(nn.Module):
  """Multi-head (or grouped-query) causal self-attention with RoPE."""

  num_query_heads: int
  num_kv_heads: int
  head_dim: int
  dtype: jnp.dtype
  weight_dtype: jnp.dtype
  kernel: str = "dot_product"
  fused_qkv: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array) -> jax.Array:
    def projection(features, name: str, axis=-1) -> nn.DenseGeneral:
      return _dense(features, self.dtype, self.weight_dtype, name, axis)

    if self.fused_qkv:  # one [emb, 3, heads, head_dim] matmul (MaxText's `fused_qkv`)
      qkv = projection((3, self.num_query_heads, self.head_dim), "qkv_proj")(x)
      qkv = checkpoint_name(qkv, "qkv_proj")
      query, key, value = (qkv[..., i, :, :] for i in range(3))
    else:
      heads = {"query": self.num_query_heads, "key": self.num_kv_heads, "value": self.num_kv_heads}
      query, key, value = (
        checkpoint_name(projection((n, self.head_dim), name)(x), f"{name}_proj")
        for name, n in heads.items()
      )
    out = attend(apply_rope(query, positions), apply_rope(key, positions), value, mask, self.kernel)
    out = projection(x.shape[-1], "out", axis=(-2, -1))(checkpoint_name(out, "context"))
    return checkpoint_name(out, "out_proj")


def _dense(features, dtype, weight_dtype, name: str, axis=-1) -> nn.DenseGeneral:
  """A bias-free projection (`nn.DenseGeneral`) computing in `dtype`, kept in `weight_dtype`."""
  return nn.DenseGeneral(
    features, axis=axis, use_bias=False, dtype=dtype, param_dtype=weight_dtype, name=name
  )


class Mlp(nn.Module):
  """Gated SiLU MLP (MaxText's default `mlp_activations: [silu, linear]`)."""

  hidden_dim: int
  dtype: jnp.dtype
  weight_dtype: jnp.dtype
  fused: bool = False  # MaxText's `fused_mlp`: gate and up as one [emb, 2, hidden] matmul

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    def dense(features, name: str) -> nn.DenseGeneral:
      return _dense(features, self.dtype, self.weight_dtype, name)

    if self.fused:
      both = checkpoint_name(dense((2, self.hidden_dim), "wi")(x), "mlpwi")
      gate, up = both[..., 0, :], both[..., 1, :]
    else:
      gate = checkpoint_name(dense(self.hidden_dim, "wi_0")(x), "mlpwi_0")
      up = checkpoint_name(dense(self.hidden_dim, "wi_1")(x), "mlpwi_1")
    hidden = gated_silu_for_cpu(gate, up) if jax.default_backend() == "cpu" else nn.silu(gate) * up
    return checkpoint_name(dense(x.shape[-1], "wo")(hidden), "mlpwo")


@jax.custom_vjp
def gated_silu_for_cpu(gate: jax.Array, up: jax.Array) -> jax.Array:
  """`silu(gate) * up`, with a backward pass shaped for XLA's CPU backend.

  Autodiff's backward of the product is one elementwise loop that XLA:CPU fuses with the
  transpose the weight gradients' matmuls want, and so runs in the transposed order: strided,
  unvectorized reads, 24-32 ms a layer for the smoke model's [2048, 512] (a fifth of its step).
  Here the two gradients are computed in their own layout and held apart by an
  `optimization_barrier`; the transposes are then plain copies (1.3-3.5 ms). The same
  function and the same derivative (silu'(g) = s(1 + g(1 - s)), s = sigmoid(g)), up to float
  rounding; used on the CPU only, where it was measured (docs/performance.md, "The MLP's
  backward, shaped for XLA:CPU"); a GPU fuses autodiff's backward well.
  """
  return nn.silu(gate) * up


def _gated_silu_forward(gate, up):
  return nn.silu(gate) * up, (gate, up)


def _gated_silu_backward(residuals, grad):
  gate, up = residuals
  sigmoid = jax.nn.sigmoid(gate)
  d_gate = grad * up * sigmoid * (1 + gate * (1 - sigmoid))
  d_up = grad * gate * sigmoid
  return jax.lax.optimization_barrier((d_gate, d_up))


gated_silu_for_cpu.defvjp(_gated_silu_forward, _gated_silu_backward)


class DecoderLayer(nn.Module):
  """One pre-norm Transformer block; `(carry, None)` in and out for `nn.scan`."""

  config: Config

  @nn.compact
  def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array):
    cfg = self.config
    dtype, weight_dtype = _dtype(cfg.dtype), _dtype(cfg.weight_dtype)
    attention = Attention(
      cfg.base_num_query_heads,
      cfg.base_num_kv_heads,
      cfg.head_dim,
      dtype,
      weight_dtype,
      cfg.attention,
      cfg.fused_qkv,
      name="attention",
    )
    x = x + attention(RMSNorm(dtype, weight_dtype, name="pre_attention_norm")(x), positions, mask)
    mlp = Mlp(cfg.base_mlp_dim, dtype, weight_dtype, cfg.fused_mlp, name="mlp")
    x = x + mlp(RMSNorm(dtype, weight_dtype, name="pre_mlp_norm")(x))
    return x, None


class Transformer(nn.Module):
  """The decoder: `(inputs, positions, segmentation)` int32 [batch, length] → logits.

  Logits are [batch, length, vocab_size], float32 when `logits_dot_in_fp32`, else `dtype`.
  """

  config: Config

  @nn.compact
  def __call__(self, inputs: jax.Array, positions: jax.Array, segmentation: jax.Array) -> jax.Array:
    cfg = self.config
    dtype, weight_dtype = _dtype(cfg.dtype), _dtype(cfg.weight_dtype)
    embed = nn.Embed(
      cfg.vocab_size,
      cfg.base_emb_dim,
      embedding_init=nn.initializers.normal(stddev=1.0),
      dtype=dtype,
      param_dtype=weight_dtype,
      name="token_embedder",
    )
    if cfg.use_iota_embed:  # MaxText's key: a one-hot matmul instead of a gather
      one_hot = (inputs[..., None] == jnp.arange(cfg.vocab_size, dtype=inputs.dtype)).astype(dtype)
      x = jnp.dot(one_hot, embed.embedding.astype(dtype))
    else:
      x = embed(inputs)
    mask = kernel_mask(segmentation, cfg.attention, cfg.max_segments_per_seq)
    block = remat(DecoderLayer, cfg.remat_policy)
    if cfg.scan_layers:  # one scanned block, its parameters stacked on a leading layer axis
      layers = nn.scan(
        block,
        variable_axes={"params": 0},
        split_rngs={"params": True},
        in_axes=(nn.broadcast, nn.broadcast),
        length=cfg.base_num_decoder_layers,
      )(cfg, name="layers")
      x, _ = layers(x, positions, mask)
    else:  # MaxText's scan_layers=false: each block its own code and parameters
      for i in range(cfg.base_num_decoder_layers):
        x, _ = block(cfg, name=f"layers_{i}")(x, positions, mask)
    x = RMSNorm(dtype, weight_dtype, name="final_norm")(x)
    logits_dtype = jnp.float32 if cfg.logits_dot_in_fp32 else dtype
    return nn.Dense(
      cfg.vocab_size,
      use_bias=False,
      dtype=logits_dtype,
      param_dtype=weight_dtype,
      name="logits_dense",
    )(x.astype(logits_dtype))


def init_params(cfg: Config, rng: jax.Array) -> dict:
  """The model's parameters for `rng`, the same values whatever `scan_layers`.

  Unrolled layers take the scanned model's parameters split per layer (`layers_i` = layer i
  of the stacked `layers`). Flax's init traces the whole forward pass, and unrolled its
  compile grows with depth: for the latency model's 20 layers, 17.5 s against 1.9 s scanned on
  a CPU core (a small width), about a minute on an H200. The split also makes the two
  layouts start from the same point: switching `scan_layers` leaves the run's values alone.
  """
  dummy = jnp.zeros((1, cfg.max_target_length), jnp.int32)
  params = Transformer(cfg.replace(scan_layers=True)).init(rng, dummy, dummy, dummy + 1)["params"]
  if cfg.scan_layers:
    return params
  unrolled = {key: value for key, value in params.items() if key != "layers"}
  for i in range(cfg.base_num_decoder_layers):
    unrolled[f"layers_{i}"] = jax.tree.map(lambda a, i=i: a[i], params["layers"])
  return unrolled


# `remat_policy` → the names of what a block keeps (MaxText's `minimal_policy`).
_MINIMAL = (
  *("query_proj", "key_proj", "value_proj", "qkv_proj", "out_proj"),
  *("mlpwi_0", "mlpwi_1", "mlpwi", "mlpwo"),
)
_SAVED_NAMES = {"minimal": _MINIMAL, "minimal_with_context": (*_MINIMAL, "context")}
# The primitive of cuDNN's fused attention forward in JAX (`jax._src.cudnn.
# fused_attention_stablehlo`, the same in JAX 0.11 and 0.12): its outputs are the attention
# output and the softmax statistics, the residuals its backward reads. JAX's public
# `dot_product_attention` names neither, so a names policy recomputes the whole forward kernel
# in the backward pass (on the H100 a 254 µs kernel a block, besides the 582 µs backward).
# MaxText's own cuDNN kernel names both `context`; `minimal_with_context` keeps them here by
# this primitive. tests/trainer/test_model.py checks the name against the installed JAX.
CUDNN_ATTENTION_FWD = "dot_product_attention_fwd_wrapper"


# Pallas's flash-attention forward (`attention=pallas`) is a `pallas_call` of this name (JAX
# 0.11 and 0.12), returning the output and the softmax statistics its backward reads; kept as
# cuDNN's are, so its backward does not run the forward kernel again either (tested).
PALLAS_ATTENTION_FWD = "mha_forward"


def _attention_forward_outputs(primitive, *_, **params) -> bool:
  """A `jax.checkpoint` policy: keep what cuDNN's or Pallas's attention forward returns."""
  if primitive.name == "pallas_call":
    return params.get("name") == PALLAS_ATTENTION_FWD
  return primitive.name == CUDNN_ATTENTION_FWD


def remat(block: type[nn.Module], policy: str) -> type[nn.Module]:
  """`block` under `policy` (the `remat_policy` key): as it is for `none`, else `nn.remat`
  keeping the named outputs (`minimal*`) or nothing but its input (`full`)."""
  if policy == "none":
    return block
  names = _SAVED_NAMES.get(policy)
  saved = jax.checkpoint_policies.save_only_these_names(*names) if names else None
  if policy == "minimal_with_context":
    saved = jax.checkpoint_policies.save_from_both_policies(saved, _attention_forward_outputs)
  # prevent_cse=False: under scan, as in MaxText, the loop already keeps XLA from merging
  # the recomputation into the forward pass.
  return nn.remat(block, policy=saved, prevent_cse=False)


def check_model_config(cfg: Config) -> None:
  """Raises ValueError for head counts that cannot form the attention."""
  if cfg.base_num_query_heads % cfg.base_num_kv_heads:
    raise ValueError(
      f"base_num_query_heads={cfg.base_num_query_heads} is not a multiple of"
      f" base_num_kv_heads={cfg.base_num_kv_heads}"
    )
  if cfg.fused_qkv and cfg.base_num_kv_heads != cfg.base_num_query_heads:
    raise ValueError(
      f"fused_qkv needs as many key/value heads as query heads (MaxText's rule):"
      f" base_num_kv_heads={cfg.base_num_kv_heads}, base_num_query_heads="
      f"{cfg.base_num_query_heads}"
    )
  if cfg.head_dim % 2:
    raise ValueError(f"head_dim={cfg.head_dim} must be even for RoPE")


def _layer_matmul_params(cfg: Config) -> int:
  d, heads, kv_heads = cfg.base_emb_dim, cfg.base_num_query_heads, cfg.base_num_kv_heads
  return d * cfg.head_dim * (2 * heads + 2 * kv_heads) + 3 * d * cfg.base_mlp_dim


def num_params(cfg: Config) -> int:
  """Parameter count of `Transformer(cfg)` (embedding and output projection included)."""
  d = cfg.base_emb_dim
  per_layer = _layer_matmul_params(cfg) + 2 * d
  return cfg.base_num_decoder_layers * per_layer + 2 * cfg.vocab_size * d + d


def training_flops_per_token(cfg: Config) -> float:
  """Forward + backward FLOPs per token, as MaxText counts them.

  6 per matmul weight (layers and output projection; the embedding lookup and norms are no
  matmuls) plus causal attention, 12·layers·heads·head_dim·length halved by the causal mask.
  Packing shortens the real attention span, so packed sequences are slightly over-counted,
  as in MaxText.
  """
  layers = cfg.base_num_decoder_layers
  matmul_params = layers * _layer_matmul_params(cfg) + cfg.vocab_size * cfg.base_emb_dim
  attention = 12 * layers * cfg.base_num_query_heads * cfg.head_dim * cfg.max_target_length / 2
  return 6.0 * matmul_params + attention
