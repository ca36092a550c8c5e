"""The tiny MaxText model the MaxText tests train and bench: one decoder layer of width 64,
128-token sequences, 4 sequences per device, so a CPU step takes a fraction of a second."""

from __future__ import annotations

from tests.helpers import REPO

SMOKE = str(REPO / "configs" / "maxtext" / "smoke.yml")
TINY_MODEL = [
  "base_num_decoder_layers=1",
  "base_emb_dim=64",
  "base_num_query_heads=4",
  "base_num_kv_heads=4",
  "head_dim=16",
  "base_mlp_dim=128",
  "max_target_length=128",
  "per_device_batch_size=4",
]
