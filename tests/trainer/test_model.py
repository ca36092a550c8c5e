"""The Transformer: shapes and dtypes, causal and per-segment attention, RoPE positions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxtext_netdata import config
from maxtext_netdata.trainer import model

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
