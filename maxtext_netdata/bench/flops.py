"""Model FLOPs per token of the trainer's Transformer, and the utilization they give (MFU).

The model count is MaxText's (`model.training_flops_per_token`, which the trainer's metrics
use): forward and backward, 6 FLOPs per matmul weight (the layers' projections and MLP, the
output projection) plus causal self-attention counted over the keys a token may see, half of
`max_target_length` on average. Our attention computes the masked full square, so its matmuls
execute twice that attention term (`executed_flops_per_token`); tests/bench/test_flops.py
checks both against counts of the compiled step.

MFU is model FLOPs over the chips' peak. MaxText's figure counts every token slot of the
configured batch, padding included; the trainer's metrics count real tokens only.
`utilization` takes either token count.
"""

from __future__ import annotations

from maxtext_netdata.config import Config
from maxtext_netdata.trainer import model


def attention_flops_per_token(cfg: Config) -> float:
  """Forward + backward FLOPs per token of causal self-attention, as MaxText counts them.

  Per layer and query head, the scores (q·k) and the weighted sum of the values are each one
  multiply-add (2 FLOPs) per head_dim element and key, over max_target_length / 2 keys on
  average (the causal half); backward costs twice forward.
  """
  multiply_adds = 2 * cfg.base_num_query_heads * cfg.head_dim * cfg.max_target_length / 2
  return 3 * 2 * cfg.base_num_decoder_layers * multiply_adds


def executed_flops_per_token(cfg: Config) -> float:
  """Training FLOPs per token the Transformer's matmuls execute: the model count with the
  attention's masked half too (scores and values over every key, then masked), and with
  `use_iota_embed` the embedding's one-hot matmul (forward, and the table's gradient: the
  token ids have none), which model FLOPs leave out as MaxText's do."""
  embedding = 4 * cfg.vocab_size * cfg.base_emb_dim if cfg.use_iota_embed else 0
  return model.training_flops_per_token(cfg) + attention_flops_per_token(cfg) + embedding


def utilization(
  flops_per_token: float, tokens_per_s: float, devices: int, peak_tflops: float | None
) -> float | None:
  """The share of `devices` chips' peak (TFLOP/s each) that `tokens_per_s` tokens of
  `flops_per_token` FLOPs make; None without a peak (a CPU, an unknown chip)."""
  if not peak_tflops:
    return None
  return flops_per_token * tokens_per_s / (devices * peak_tflops * 1e12)
