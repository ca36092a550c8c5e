"""The Transformer: shapes and dtypes, causal and per-segment attention, RoPE positions."""

import re

import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name

from maxtext_netdata import config
from maxtext_netdata.trainer import attention, model

TINY = [
  "base_num_decoder_layers=2",
  "base_emb_dim=32",
  "base_num_query_heads=4",
  "base_num_kv_heads=2",
  "head_dim=8",
  "base_mlp_dim=64",
  "max_target_length=48",
]


def _setup(*overrides):
  cfg = config.load(None, TINY + list(overrides))
  transformer = model.Transformer(cfg)
  ids = jnp.zeros((1, cfg.max_target_length), jnp.int32)
  params = jax.jit(transformer.init)(jax.random.key(0), ids, ids, ids + 1)["params"]
  return cfg, transformer, params


def _logits(apply, params, inputs, positions, segmentation):
  return np.asarray(apply({"params": params}, inputs, positions, segmentation), np.float32)


def test_shapes_dtypes_and_parameter_count():
  cfg, transformer, params = _setup("dtype=bfloat16", "weight_dtype=float32")
  assert sum(p.size for p in jax.tree.leaves(params)) == model.num_params(cfg)
  assert {p.dtype for p in jax.tree.leaves(params)} == {jnp.dtype("float32")}
  ids = jnp.ones((3, cfg.max_target_length), jnp.int32)
  logits = jax.jit(transformer.apply)({"params": params}, ids, ids, ids)
  assert logits.shape == (3, cfg.max_target_length, cfg.vocab_size)
  assert logits.dtype == jnp.float32  # logits_dot_in_fp32 defaults to true

  cfg, transformer, params = _setup("dtype=bfloat16", "logits_dot_in_fp32=false")
  assert jax.jit(transformer.apply)({"params": params}, ids, ids, ids).dtype == jnp.bfloat16


def test_user_model_size():
  cfg = config.load("configs/latency_network.yml")
  assert 100e6 < model.num_params(cfg) < 125e6
  # 6 FLOPs per matmul weight dominate; attention adds the length-dependent part.
  assert model.training_flops_per_token(cfg) > 6 * (model.num_params(cfg) - 268 * 640)


def test_attention_is_causal_and_stays_in_its_segment():
  cfg, transformer, params = _setup("dtype=float32")
  apply = jax.jit(transformer.apply)
  length = cfg.max_target_length
  rng = np.random.default_rng(0)
  inputs = rng.integers(11, 267, (1, length)).astype(np.int32)
  segmentation = np.ones((1, length), np.int32)
  segmentation[:, 20:] = 2
  positions = np.concatenate([np.arange(20), np.arange(length - 20)])[None].astype(np.int32)
  base = _logits(apply, params, inputs, positions, segmentation)

  later = inputs.copy()
  later[:, 10:20] = 11  # inside segment 1, after position 9
  changed = _logits(apply, params, later, positions, segmentation)
  np.testing.assert_array_equal(changed[:, :10], base[:, :10])
  assert not np.allclose(changed[:, 10:20], base[:, 10:20])

  earlier_segment = inputs.copy()
  earlier_segment[:, :20] = 12  # all of segment 1
  changed = _logits(apply, params, earlier_segment, positions, segmentation)
  np.testing.assert_allclose(changed[:, 20:], base[:, 20:], rtol=1e-5, atol=1e-5)


def test_packed_segment_equals_the_segment_alone():
  """RoPE uses inputs_position, so a segment's logits do not depend on where it is packed."""
  cfg, transformer, params = _setup("dtype=float32")
  apply = jax.jit(transformer.apply)
  length = cfg.max_target_length
  rng = np.random.default_rng(1)
  segment = rng.integers(11, 267, 16).astype(np.int32)

  alone = np.full((1, length), 267, np.int32)
  alone[0, :16] = segment
  seg_alone = np.zeros((1, length), np.int32)
  seg_alone[0, :16] = 1
  pos_alone = np.zeros((1, length), np.int32)
  pos_alone[0, :16] = np.arange(16)

  packed = rng.integers(11, 267, (1, length)).astype(np.int32)
  packed[0, 25:41] = segment
  seg_packed = np.ones((1, length), np.int32)
  seg_packed[0, 25:41] = 2
  seg_packed[0, 41:] = 3
  pos_packed = np.zeros((1, length), np.int32)
  pos_packed[0, :25] = np.arange(25)
  pos_packed[0, 25:41] = np.arange(16)
  pos_packed[0, 41:] = np.arange(length - 41)

  a = _logits(apply, params, alone, pos_alone, seg_alone)[0, :16]
  b = _logits(apply, params, packed, pos_packed, seg_packed)[0, 25:41]
  np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)

  stretched = _logits(apply, params, packed, pos_packed * 2, seg_packed)[0, 25:41]
  assert not np.allclose(stretched, b, atol=1e-4)  # positions really reach the attention


def test_rope_preserves_norm_and_relative_offsets():
  x = jax.random.normal(jax.random.key(0), (1, 4, 1, 8))
  positions = jnp.array([[0, 3, 7, 100]])
  rotated = model.apply_rope(x, positions)
  np.testing.assert_allclose(
    jnp.linalg.norm(rotated, axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5
  )
  q, k = x[:, :1], x[:, 1:2]

  def score(query_position, key_position):
    rotated_q = model.apply_rope(q, jnp.array([[query_position]]))
    rotated_k = model.apply_rope(k, jnp.array([[key_position]]))
    return float(jnp.sum(rotated_q * rotated_k))

  same_offset = [score(p + 2, p) for p in (0, 10, 50)]
  np.testing.assert_allclose(same_offset, same_offset[0], rtol=1e-4)
  assert abs(score(5, 0) - same_offset[0]) > 1e-3


def test_head_counts_are_checked():
  cfg = config.load(None, ["base_num_query_heads=6", "base_num_kv_heads=4"])
  with pytest.raises(ValueError, match="multiple"):
    model.check_model_config(cfg)


# float32 on the CPU: the kernels differ in where the 1/sqrt(head_dim) scale is applied (the
# einsum path scales the query, jax.nn.dot_product_attention the scores) and in summation
# order; measured differences are ~1e-6 on outputs of order 1.
KERNEL_TOLERANCE = 1e-5
JAX_KERNELS = ("dot_product", "xla")  # cudnn needs an NVIDIA GPU


def _packed_segmentation(rng, batch: int, length: int) -> np.ndarray:
  """Rows of 2 to 6 contiguous segments 1..k and trailing padding (segment 0), as packed."""
  segmentation = np.zeros((batch, length), np.int32)
  for row in range(batch):
    cuts = np.sort(rng.choice(np.arange(4, length - 4), rng.integers(2, 7), replace=False))
    segmentation[row, : cuts[-1]] = np.searchsorted(cuts, np.arange(cuts[-1]), side="right") + 1
  return segmentation


def _positions(segmentation: np.ndarray) -> np.ndarray:
  """Positions restarting at 0 in each segment of each row, as the pipeline writes them."""
  positions = np.zeros_like(segmentation)
  for row in range(segmentation.shape[0]):
    for segment in np.unique(segmentation[row]):
      where = segmentation[row] == segment
      positions[row, where] = np.arange(where.sum())
  return positions


def _packed_batch(cfg, rng, rows: int = 2) -> tuple:
  """(inputs, positions, segmentation, targets) of `rows` packed rows of random tokens."""
  segmentation = _packed_segmentation(rng, rows, cfg.max_target_length)
  inputs, targets = rng.integers(11, 267, (2, rows, cfg.max_target_length)).astype(np.int32)
  return inputs, _positions(segmentation), segmentation, targets


def _assert_layout(cfg, params) -> None:
  """`params` has the tree and shapes `Transformer(cfg).init` makes."""
  ids = jnp.zeros((1, cfg.max_target_length), jnp.int32)
  shapes = jax.eval_shape(model.Transformer(cfg).init, jax.random.key(0), ids, ids, ids)
  assert jax.tree.map(lambda a: a.shape, params) == jax.tree.map(
    lambda a: a.shape, shapes["params"]
  )


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("kernel", (*JAX_KERNELS, "pallas"))  # Pallas's, interpreted here
def test_dot_product_attention_equals_the_einsum_reference_on_packed_rows(kernel, kv_heads):
  rng = np.random.default_rng(kv_heads)
  batch, length, heads, head_dim = 3, 64, 4, 16
  segmentation = jnp.asarray(_packed_segmentation(rng, batch, length))
  assert all(len(set(row.tolist()) - {0}) >= 2 for row in np.asarray(segmentation))
  query, key, value = (
    jnp.asarray(rng.normal(size=(batch, length, h, head_dim)), jnp.float32)
    for h in (heads, kv_heads, kv_heads)
  )
  reference = attention.attend(
    query, key, value, attention.kernel_mask(segmentation, "einsum"), "einsum"
  )
  out = jax.jit(attention.attend, static_argnums=4)(
    query, key, value, attention.kernel_mask(segmentation, kernel), kernel
  )
  np.testing.assert_allclose(out, reference, rtol=0, atol=KERNEL_TOLERANCE)
  # The mask really matters: plain causal attention over the whole row differs.
  unsegmented = attention.kernel_mask(jnp.ones_like(segmentation), kernel)
  assert not np.allclose(
    attention.attend(query, key, value, unsegmented, kernel), reference, atol=0.1
  )


@pytest.mark.parametrize("kernel", JAX_KERNELS)
def test_every_kernel_gives_the_einsum_logits(kernel):
  """The whole model (grouped-query heads, two layers) on packed rows of several segments."""
  cfg, transformer, params = _setup("dtype=float32", "attention=einsum")
  rng = np.random.default_rng(2)
  segmentation = _packed_segmentation(rng, 3, cfg.max_target_length)
  positions = _positions(segmentation)
  inputs = rng.integers(11, 267, segmentation.shape).astype(np.int32)
  reference = _logits(jax.jit(transformer.apply), params, inputs, positions, segmentation)
  other = model.Transformer(cfg.replace(attention=kernel))
  logits = _logits(jax.jit(other.apply), params, inputs, positions, segmentation)
  np.testing.assert_allclose(logits, reference, rtol=0, atol=KERNEL_TOLERANCE)


def test_pallas_attention_gives_the_einsums_loss_and_gradients_in_the_whole_model():
  """attention=pallas (Pallas's flash-attention kernel on the segment ids, run by Pallas's
  interpreter on the CPU): the whole model's loss and gradients on packed rows are those of
  the einsum over the mask (float32, 1e-5), grouped-query heads included; a length its tiles
  do not divide is refused by name."""
  cfg, _, params = _setup("dtype=float32", "attention=einsum", "max_target_length=64")
  batch = _packed_batch(cfg, np.random.default_rng(9))
  (want_loss, want_grads), _ = _loss_and_grads(cfg, params, batch)
  (loss, grads), _ = _loss_and_grads(cfg.replace(attention="pallas"), params, batch)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  uneven = jnp.zeros((1, 48, 4, 8), jnp.float32)
  with pytest.raises(ValueError, match=r"max_target_length=48 must be a multiple of its tiles"):
    attention.pallas_attention(uneven, uneven, uneven, jnp.ones((1, 48), jnp.int32))


def test_bfloat16_activations_keep_float32_parameters_and_stay_close():
  """dtype=bfloat16: bfloat16 matmuls, float32 parameters; logits near the float32 ones."""
  cfg, transformer, params = _setup("dtype=float32")
  ids = jnp.asarray(np.random.default_rng(3).integers(11, 267, (2, cfg.max_target_length)))
  positions = jnp.broadcast_to(jnp.arange(cfg.max_target_length), ids.shape)
  full = _logits(jax.jit(transformer.apply), params, ids, positions, jnp.ones_like(ids))
  half = model.Transformer(cfg.replace(dtype="bfloat16"))
  jaxpr = jax.make_jaxpr(half.apply)({"params": params}, ids, positions, jnp.ones_like(ids))
  dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]
  assert "bf16[" in str(dots[0]) and "dot_general" in str(dots[0])
  low = _logits(jax.jit(half.apply), params, ids, positions, jnp.ones_like(ids))
  assert 0 < np.abs(low - full).max() < 0.1 * np.abs(full).max()


def _loss_and_grads(cfg, params, batch):
  transformer = model.Transformer(cfg)
  inputs, positions, segmentation, targets = batch

  def loss(params):
    logits = transformer.apply({"params": params}, inputs, positions, segmentation)
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1)
    return -jnp.mean(picked)

  return jax.jit(jax.value_and_grad(loss))(params), loss


def _saved_elements(loss, params, capsys) -> int:
  """Elements the backward pass keeps, by JAX's own account (`print_saved_residuals`)."""
  capsys.readouterr()
  jax.ad_checkpoint.print_saved_residuals(loss, params)
  shapes = re.findall(r"^\w+\[([\d,]*)\]", capsys.readouterr().out, re.MULTILINE)
  return sum(int(np.prod([int(d) for d in shape.split(",") if d])) for shape in shapes)


def test_remat_policies_keep_less_and_recompute_the_same_gradients(capsys):
  """Every `remat_policy` gives `none`'s loss and gradients, and each keeps less for the
  backward pass than the one before it: none > minimal_with_context > minimal > full."""
  cfg, _, params = _setup("dtype=float32")
  batch = _packed_batch(cfg, np.random.default_rng(3))

  saved = []
  (want_loss, want_grads), _ = _loss_and_grads(cfg.replace(remat_policy="none"), params, batch)
  for policy in ("none", "minimal_with_context", "minimal", "full"):
    (loss, grads), loss_fn = _loss_and_grads(cfg.replace(remat_policy=policy), params, batch)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    saved.append(_saved_elements(loss_fn, params, capsys))
  assert saved == sorted(saved, reverse=True) and len(set(saved)) == 4, saved


def _stand_in_cudnn_attention():
  """An attention built as JAX builds cuDNN's: a custom VJP whose forward binds a primitive
  named as cuDNN's forward primitive, returning the output and softmax statistics, which its
  backward reads. (cuDNN itself runs on NVIDIA GPUs only.)"""
  forward_p = jax.extend.core.Primitive(model.CUDNN_ATTENTION_FWD)
  forward_p.multiple_results = True

  def forward(q, k):
    scores = q @ k.T
    stats = jax.nn.logsumexp(scores, axis=-1)
    return [jnp.exp(scores - stats[:, None]) @ k, stats]

  forward_p.def_impl(forward)
  forward_p.def_abstract_eval(
    lambda q, k: [
      jax.core.ShapedArray(q.shape, q.dtype),
      jax.core.ShapedArray(q.shape[:1], q.dtype),
    ]
  )

  @jax.custom_vjp
  def attention(q, k):
    return forward_p.bind(q, k)[0]

  def attention_fwd(q, k):
    out, stats = forward_p.bind(q, k)
    return out, (q, k, out, stats)

  def attention_bwd(residuals, g):
    q, k, _, stats = residuals
    probs = jnp.exp(q @ k.T - stats[:, None])
    d_scores = probs * (g @ k.T - jnp.sum(g * (probs @ k), axis=-1, keepdims=True))
    return d_scores @ k, d_scores.T @ q + probs.T @ g

  attention.defvjp(attention_fwd, attention_bwd)
  return attention


def test_minimal_with_context_keeps_cudnn_attention_for_the_backward_pass():
  """cuDNN's attention forward runs once a step under `minimal_with_context` and twice under
  `minimal` (recomputed for the backward pass), with the same gradients; the primitive's name
  is that of the installed JAX."""
  from jax._src.cudnn import fused_attention_stablehlo  # noqa: PLC0415 (imports without a GPU)

  assert fused_attention_stablehlo._dot_product_attention_fwd_p_wrapper.name == (
    model.CUDNN_ATTENTION_FWD
  )
  stand_in = _stand_in_cudnn_attention()

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
      q = checkpoint_name(nn.Dense(8, use_bias=False, name="query")(x), "query_proj")
      return jnp.sum(jnp.sin(stand_in(q, x))), None

  x = jnp.linspace(-1.0, 1.0, 32, dtype=jnp.float32).reshape(4, 8)
  params = Block().init(jax.random.key(0), x)
  runs, grads = {}, {}
  for policy in ("minimal", "minimal_with_context"):
    block = model.remat(Block, policy)()

    def loss(p, block=block):
      return block.apply(p, x)[0]

    jaxpr = str(jax.make_jaxpr(jax.grad(loss))(params))
    runs[policy] = jaxpr.count(f"= {model.CUDNN_ATTENTION_FWD} ")
    grads[policy] = jax.grad(loss)(params)
  assert runs == {"minimal": 2, "minimal_with_context": 1}, runs
  for got, want in zip(
    jax.tree.leaves(grads["minimal_with_context"]), jax.tree.leaves(grads["minimal"]), strict=True
  ):
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_minimal_with_context_keeps_pallas_attention_for_the_backward_pass():
  """attention=pallas: the whole model's backward runs Pallas's attention forward once a
  layer under `minimal_with_context` (its output and statistics kept) and twice under
  `minimal`, with the same gradients; the kernel's name is that of the installed JAX."""
  cfg, _, params = _setup("dtype=float32", "attention=pallas", "max_target_length=64")
  batch = _packed_batch(cfg, np.random.default_rng(6))

  def forward_kernels(jaxpr) -> int:  # the printed jaxpr names a shared sub-jaxpr once
    found = 0
    for eqn in jaxpr.eqns:
      found += eqn.primitive.name == "pallas_call" and (
        eqn.params.get("name") == model.PALLAS_ATTENTION_FWD
      )
      for param in eqn.params.values():
        for sub in param if isinstance(param, tuple | list) else (param,):
          if isinstance(sub, jax.extend.core.ClosedJaxpr | jax.extend.core.Jaxpr):
            found += forward_kernels(getattr(sub, "jaxpr", sub))
    return found

  runs, grads = {}, {}
  for policy in ("minimal", "minimal_with_context"):
    (_, grads[policy]), loss = _loss_and_grads(cfg.replace(remat_policy=policy), params, batch)
    runs[policy] = forward_kernels(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
  assert runs == {"minimal": 2, "minimal_with_context": 1}, runs  # one scanned block
  for got, want in zip(
    jax.tree.leaves(grads["minimal_with_context"]), jax.tree.leaves(grads["minimal"]), strict=True
  ):
    np.testing.assert_allclose(got, want, rtol=1e-6)


def _fused_params(params):
  """`params` of the unfused model laid out for fused_qkv and fused_mlp: the same weights."""
  layers = dict(params["layers"])
  attention = dict(layers["attention"])
  qkv = [attention.pop(name)["kernel"] for name in ("query", "key", "value")]
  attention["qkv_proj"] = {"kernel": jnp.stack(qkv, axis=-3)}  # [layers, emb, 3, heads, dim]
  mlp = dict(layers["mlp"])
  mlp["wi"] = {"kernel": jnp.stack([mlp.pop("wi_0")["kernel"], mlp.pop("wi_1")["kernel"]], -2)}
  layers.update(attention=attention, mlp=mlp)
  return {**params, "layers": layers}


@pytest.mark.parametrize("dtype, rtol", [(jnp.float32, 1e-6), (jnp.bfloat16, 2**-7)])
def test_the_cpus_gated_silu_has_autodiffs_values_and_gradients(dtype, rtol):
  """`gated_silu_for_cpu` (the MLP's product with its backward shaped for XLA:CPU) gives the
  values of `silu(gate) * up` and the gradients JAX's autodiff takes of it, gates saturated
  both ways included: float32 to 1e-6, bfloat16 to its own rounding (2^-7)."""
  rng = np.random.default_rng(11)
  gate = jnp.asarray(rng.normal(0, 4, (64, 96)), dtype).at[0, :4].set(jnp.array([-30, 30, 0, -1]))
  up = jnp.asarray(rng.normal(0, 1, (64, 96)), dtype)
  weight = jnp.asarray(rng.normal(0, 1, (64, 96)), jnp.float32)

  def loss(product):
    return lambda gate, up: jnp.sum(product(gate, up).astype(jnp.float32) * weight)

  reference = loss(lambda gate, up: nn.silu(gate) * up)
  got = jax.jit(jax.value_and_grad(loss(model.gated_silu_for_cpu), (0, 1)))(gate, up)
  want = jax.jit(jax.value_and_grad(reference, (0, 1)))(gate, up)
  np.testing.assert_array_equal(model.gated_silu_for_cpu(gate, up), nn.silu(gate) * up)
  np.testing.assert_allclose(got[0], want[0], rtol=rtol)
  for grad, want_grad in zip(got[1], want[1], strict=True):
    assert grad.dtype == dtype
    want_grad = np.asarray(want_grad, np.float32)
    np.testing.assert_allclose(np.asarray(grad, np.float32), want_grad, rtol=rtol, atol=rtol)


def test_on_the_cpu_the_mlp_takes_the_backward_shaped_for_it():
  """The model's MLP on the CPU goes through `gated_silu_for_cpu`, whose barrier keeps its
  gradients out of the transposing fusion (the step 1.25x as fast: docs/performance.md)."""
  cfg, transformer, params = _setup("dtype=float32")
  batch = _packed_batch(cfg, np.random.default_rng(4))
  _, loss = _loss_and_grads(cfg, params, batch)
  # The loss calls the custom VJP; its backward, the one maker of a barrier here, is in the
  # gradient's.
  assert "fwd=_gated_silu_forward" in str(jax.make_jaxpr(loss)(params))
  assert "optimization_barrier" in str(jax.make_jaxpr(jax.grad(loss))(params))


def test_fused_projections_compute_the_same_function_and_keep_the_same(capsys):
  """fused_qkv and fused_mlp with the unfused weights stacked: the same loss and gradients
  (1e-5, float32), parameters of the same count, and under `minimal` the backward pass keeps
  as many elements as the unfused model (the fused outputs are among the names it keeps)."""
  cfg, _, params = _setup("dtype=float32", "base_num_kv_heads=4", "remat_policy=minimal")
  fused_cfg = cfg.replace(fused_qkv=True, fused_mlp=True)
  fused = _fused_params(params)
  _assert_layout(fused_cfg, fused)
  assert model.num_params(fused_cfg) == sum(p.size for p in jax.tree.leaves(fused))
  batch = _packed_batch(cfg, np.random.default_rng(5))
  (want_loss, want_grads), want_fn = _loss_and_grads(cfg, params, batch)
  (loss, grads), loss_fn = _loss_and_grads(fused_cfg, fused, batch)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  for got, want in zip(
    jax.tree.leaves(grads), jax.tree.leaves(_fused_params(want_grads)), strict=True
  ):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert _saved_elements(loss_fn, fused, capsys) == _saved_elements(want_fn, params, capsys)
  with pytest.raises(ValueError, match="fused_qkv needs as many key/value heads"):
    model.check_model_config(cfg.replace(fused_qkv=True, base_num_kv_heads=2))


def test_iota_embedding_gives_the_gathers_logits_and_gradients():
  """use_iota_embed looks tokens up by a one-hot matmul: the same logits and gradients as
  the gather (float32; a one-hot row times the table picks the row's values exactly)."""
  cfg, _, params = _setup("dtype=float32")
  rng = np.random.default_rng(7)
  inputs, targets = rng.integers(0, cfg.vocab_size, (2, 2, cfg.max_target_length)).astype(np.int32)
  positions = np.tile(np.arange(cfg.max_target_length, dtype=np.int32), (2, 1))
  batch = (inputs, positions, np.ones_like(inputs), targets)
  (want_loss, want_grads), _ = _loss_and_grads(cfg, params, batch)
  (loss, grads), _ = _loss_and_grads(cfg.replace(use_iota_embed=True), params, batch)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_unrolled_layers_start_from_the_scanned_parameters():
  """`init_params` gives unrolled layers the scanned model's parameters, split per layer, bit
  for bit (its init compiles as the scanned one does); the scanned ones are flax's own init."""
  cfg, _, flax_init = _setup()
  scanned = jax.jit(model.init_params, static_argnums=0)(cfg, jax.random.key(0))
  unrolled_cfg = cfg.replace(scan_layers=False)
  unrolled = jax.jit(model.init_params, static_argnums=0)(unrolled_cfg, jax.random.key(0))
  _assert_layout(unrolled_cfg, unrolled)
  for got, want in zip(jax.tree.leaves(scanned), jax.tree.leaves(flax_init), strict=True):
    np.testing.assert_array_equal(got, want)
  for key in scanned:
    if key != "layers":
      jax.tree.map(np.testing.assert_array_equal, unrolled[key], scanned[key])
  for i in range(cfg.base_num_decoder_layers):
    want = jax.tree.map(lambda a, i=i: a[i], scanned["layers"])
    jax.tree.map(np.testing.assert_array_equal, unrolled[f"layers_{i}"], want)


def test_unrolled_layers_compute_the_scanned_function():
  """scan_layers=false with the scanned parameters split per layer: the same loss and
  gradients (float32, 1e-5), one parameter set per layer, none stacked."""
  cfg, _, params = _setup("dtype=float32", "remat_policy=minimal")
  unrolled_cfg = cfg.replace(scan_layers=False)
  layers = params["layers"]
  unrolled = {k: v for k, v in params.items() if k != "layers"}
  for i in range(cfg.base_num_decoder_layers):
    unrolled[f"layers_{i}"] = jax.tree.map(lambda a, i=i: a[i], layers)
  _assert_layout(unrolled_cfg, unrolled)
  batch = _packed_batch(cfg, np.random.default_rng(9))
  (want_loss, want_grads), _ = _loss_and_grads(cfg, params, batch)
  (loss, grads), _ = _loss_and_grads(unrolled_cfg, unrolled, batch)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  for i in range(cfg.base_num_decoder_layers):
    for got, want in zip(
      jax.tree.leaves(grads[f"layers_{i}"]),
      jax.tree.leaves(jax.tree.map(lambda a, i=i: a[i], want_grads["layers"])),
      strict=True,
    ):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _packed_layout_mask(seqlen: np.ndarray, offsets: np.ndarray, length: int) -> np.ndarray:
  """The [b, 1, T, T] mask that cuDNN's packed layout computes under, read from its JAX
  documentation (`jax._src.cudnn.fused_attention_stablehlo.dot_product_attention`): sequence
  m of a row spans `offsets[m]` to `offsets[m] + seqlen[m]`, -1 past the row's last one, and
  a token attends causally within its own sequence. Checks every position is in exactly one."""
  rows, slots = seqlen.shape
  assert offsets.shape == (rows, slots + 1)
  mask = np.zeros((rows, 1, length, length), bool)
  for row in range(rows):
    count = int((seqlen[row] >= 0).sum())
    assert (seqlen[row, count:] == -1).all() and (offsets[row, count:] == -1).all()
    covered = np.zeros(length, int)
    for start, size in zip(offsets[row, :count], seqlen[row, :count], strict=True):
      mask[row, 0, start : start + size, start : start + size] = np.tril(np.ones((size, size)))
      covered[start : start + size] += 1
    assert (covered == 1).all()
  return mask


def _pipeline_segmentation(tmp_path, rows: int = 40) -> np.ndarray:
  """`inputs_segmentation` of packed batches of the real pipeline on generated data."""
  from maxtext_netdata.distributed import mesh as mesh_lib  # noqa: PLC0415
  from maxtext_netdata.input_pipeline import create_data_iterator  # noqa: PLC0415
  from tests.helpers import pipeline  # noqa: PLC0415

  overrides = [*pipeline.small_run_overrides(tmp_path), "grain_worker_count=0", "num_epoch=-1"]
  cfg = config.load(None, [*overrides, "global_batch_size_to_load=8"])
  train, evaluation = create_data_iterator(cfg, mesh_lib.make_mesh(cfg))
  try:
    batches = [np.asarray(next(train)["inputs_segmentation"]) for _ in range(rows // 8)]
  finally:
    train.close()
    evaluation.close()
  return np.concatenate(batches)


def test_packed_layout_of_pipeline_rows_is_the_causal_segment_mask(tmp_path):
  """`cudnn_packed` hands cuDNN each run of a row as a sequence: on the pipeline's packed rows
  (several segments, trailing padding) and on the test's own, the mask that layout implies is
  `attention_mask` bit for bit, and the batches fit the default room for 16 runs a row."""
  pipeline_rows = _pipeline_segmentation(tmp_path)
  assert (pipeline_rows.max(axis=1) >= 2).any() and (pipeline_rows == 0).any()
  own_rows = _packed_segmentation(np.random.default_rng(3), 6, 96)
  for segmentation in (pipeline_rows, own_rows):
    packed = jax.jit(attention.kernel_mask, static_argnums=1)(
      jnp.asarray(segmentation), "cudnn_packed"
    )
    assert bool(packed.fits) and packed.seqlen.shape == (len(segmentation), 16)
    assert packed.seqlen.dtype == packed.offsets.dtype == jnp.int32  # what cuDNN's API takes
    implied = _packed_layout_mask(
      np.asarray(packed.seqlen), np.asarray(packed.offsets), segmentation.shape[1]
    )
    np.testing.assert_array_equal(implied, np.asarray(attention.attention_mask(segmentation)))


def test_packed_layout_too_small_for_a_row_falls_back_to_the_mask():
  """`max_segments_per_seq` below a row's runs: `fits` is false, and the batch carries the
  same-segment mask for the fallback kernel; with room for the row's own runs it fits."""
  segmentation = jnp.asarray(_packed_segmentation(np.random.default_rng(4), 4, 64))
  most = int((1 + (np.diff(np.asarray(segmentation), axis=1) != 0).sum(axis=1)).max())
  small = attention.kernel_mask(segmentation, "cudnn_packed", most - 1)
  assert not bool(small.fits)
  np.testing.assert_array_equal(small.mask, attention.segment_mask(segmentation))
  exact = attention.kernel_mask(segmentation, "cudnn_packed", most)
  assert bool(exact.fits) and exact.seqlen.shape == (4, most)
  implied = _packed_layout_mask(np.asarray(exact.seqlen), np.asarray(exact.offsets), 64)
  np.testing.assert_array_equal(implied, np.asarray(attention.attention_mask(segmentation)))


def _packed_layout_standin(query, key, value, *, q_seqlen, q_offsets, scale, mask_type, **_):
  """What cuDNN's packed layout computes, by JAX's documentation of
  `jax._src.cudnn.fused_attention_stablehlo.dot_product_attention` (lengths and offsets of
  each row's sequences, causal within each): the einsum over the mask they imply. It stands
  in for the kernel a CPU cannot run, so that the model's own part is tested: the lengths and
  offsets it makes, their way through the scanned or unrolled, recomputed layers, and the
  fallback for a batch with more runs than room."""
  from jax._src.cudnn import fused_attention_stablehlo as cudnn  # noqa: PLC0415

  assert mask_type == cudnn.MaskType.PADDING_CAUSAL and scale == query.shape[-1] ** -0.5
  length = query.shape[1]
  positions = jnp.arange(length)
  starts = q_offsets[:, :-1, None]
  inside = (
    (q_seqlen[:, :, None] >= 0)
    & (positions >= starts)
    & (positions < starts + q_seqlen[:, :, None])
  )
  sequence = jnp.argmax(inside, axis=1)
  causal = jnp.tril(jnp.ones((length, length), jnp.bool_))
  mask = (sequence[:, :, None] == sequence[:, None, :]) & inside.any(axis=1)[:, :, None] & causal
  return attention.einsum_attention(query, key, value, mask[:, None])


@pytest.mark.parametrize("scan_layers", [True, False])
@pytest.mark.parametrize("max_segments_per_seq", [2, 7])
def test_the_packed_layout_reaches_every_layer_and_falls_back_exactly(
  monkeypatch, scan_layers, max_segments_per_seq
):
  """`cudnn_packed` in the whole model (grouped-query heads, `minimal_with_context`) on rows
  of 3-7 runs: the loss and the parameters' gradients of `einsum`'s, with room for fewer runs
  than the rows have (2: the batch takes the mask's kernel) and for all (7: the packed
  layout)."""
  from jax._src.cudnn import fused_attention_stablehlo as cudnn  # noqa: PLC0415

  monkeypatch.setattr(cudnn, "dot_product_attention", _packed_layout_standin)
  settings = ("dtype=float32", "remat_policy=minimal_with_context", f"scan_layers={scan_layers}")
  cfg, transformer, params = _setup(*settings, "attention=einsum")
  packed = model.Transformer(
    cfg.replace(attention="cudnn_packed", max_segments_per_seq=max_segments_per_seq)
  )
  inputs, positions, segmentation, targets = _packed_batch(cfg, np.random.default_rng(5), rows=3)

  def loss(params, module):
    logits = module.apply({"params": params}, inputs, positions, segmentation)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1))

  want = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, transformer)
  got = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, packed)
  np.testing.assert_allclose(got[0], want[0], rtol=0, atol=KERNEL_TOLERANCE)
  for g, w in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1]), strict=True):
    np.testing.assert_allclose(g, w, rtol=0, atol=KERNEL_TOLERANCE)
