"""How much each part of the accelerator check measures (`bench.accelerator_check`): the sizes
and switches of a run on a device, and of the dry run on the CPU with a tiny model."""

from __future__ import annotations

from maxtext_netdata.bench.accelerator_runs import Sizes
from maxtext_netdata.trainer import xla_flags

ACCELERATOR = Sizes(
  rows=1_000_000,
  steps=20,
  batches=100,
  workers=(0, 4, 8, 16),
  threads=(0, 1, 2, 4),
  thread_tokens=200e6,
  # On an H200 with cuBLAS for every matmul: 36.5% MFU at 32, 38.1% at 64 and 96, 38.0% at
  # 128 (docs/performance.md, "On an H200, a fourth run").
  batch_scales=(1.0, 2.0, 3.0),
  sweep_steps=5,
  overrides=(),
  # Each switch against the configured settings, in order of what they may still give, as the
  # budget may end the sweep early. Not rerun, as measured on an H100 and H200s
  # (docs/performance.md): XLA's attention (2.2-2.5x slower), remat_policy full and minimal
  # (slower than minimal_with_context, 0.95-0.99x), scanned layers (0.85x the unrolled step),
  # cuDNN's packed layout (exact, 1.05x slower in the step). use_iota_embed is measured on a
  # real batch (network_fixed_embed): on the synthetic batch's uniform tokens the scatter-add
  # it replaces costs next to nothing.
  switches=(
    # The optimizer over one flat vector (optax.flatten) instead of ~180 parameters, each with
    # a global-norm reduction and an AdamW update of its own: an H200 trace of the step
    # (tests/bench/fixtures/h200_unrolled_profile_events.json.gz) holds ~350 reduction and
    # ~200 add kernels a step (~9 ms), which those may be among. Not yet measured.
    {"optimizer_flatten": True},
    # The latency config's 10 heads of 64 as 5 of 128: the same parameters and FLOPs, for
    # cuDNN's attention kernels nearer the peak at head_dim 128; 1.02-1.03x on the fourth H200
    # run (39.3% MFU at 64). A change of the model: a training comparison first.
    {"base_num_query_heads": 5, "base_num_kv_heads": 5, "head_dim": 128},
    # Pallas's flash attention on the segment ids (no mask bias, Triton's kernels): not yet
    # measured on a device; attention took 28% of the H200 step for 11% of its FLOPs.
    {"attention": "pallas"},
    {"remat_policy": "none"},  # 1.00-1.04x at 32 on H200s, 1.00x and slower at 64
    {"fused_qkv": True, "fused_mlp": True},  # 0.96x with cuBLAS (faster only beside Triton)
  ),
  # The config's kernel and the packed layout at its fastest, which keeps its exactness on the
  # device checked. The third H200 run compiled all of `attention_kernels.KERNELS` at full
  # size in 124 s, which left the sweeps out of the budget.
  attention_kernels=("cudnn", "cudnn_packed_fit", "pallas"),
  # Each over the defaults, against the ~16-18 ms of memory-bound fusions of the H200's 68 ms
  # step; none beat them there (docs/performance.md, "a fifth run").
  xla_options=tuple(xla_flags.CANDIDATES.values()),
)
DRY_RUN = Sizes(
  rows=30_000,
  steps=3,
  batches=10,
  workers=(0, 1),
  threads=(0, 1),
  thread_tokens=5e6,
  batch_scales=(0.5, 1.0),
  sweep_steps=2,
  overrides=(
    "base_num_decoder_layers=2",
    "base_emb_dim=64",
    "base_num_query_heads=2",
    "base_num_kv_heads=2",
    "head_dim=32",
    "base_mlp_dim=128",
    "max_target_length=128",
    "per_device_batch_size=4",
    "dtype=float32",
    # In-process loading: on a CPU every worker start costs seconds; the sweep starts one.
    "grain_worker_count=0",
  ),
  switches=(  # no cuDNN on a CPU
    {"optimizer_flatten": True},
    {"fused_qkv": True, "fused_mlp": True},
    {"attention": "einsum"},
    {"dtype": "bfloat16"},
  ),
  # XLA's runs on a CPU, and Pallas's interpreted (the same code path as on a GPU)
  attention_kernels=("cudnn", "cudnn_packed_fit", "xla", "pallas"),
  # The device's candidates: XLA's CPU compiler takes a GPU's options and ignores them, so the
  # dry run under the VM's jax shows its XLA knows each (tests/bench/test_accelerator_check.py)
  xla_options=tuple(xla_flags.CANDIDATES.values()),
)
