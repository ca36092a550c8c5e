"""`ConfigModel`: every key maxtext_netdata knows, with its type, default, description and
checks (pydantic, as MaxText's `configs/types.py` holds its `MaxTextConfig`).

`maxtext_netdata.config` imports this module on first validation: pydantic costs ~0.1 s to
import, and Grain worker processes, which import `maxtext_netdata.config` to unpickle a
`Config`, never validate one. Adding a key is one field here; then regenerate base.yml
(`python -m maxtext_netdata.config > configs/base.yml`).
"""

import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from maxtext_netdata.config import compile_options, iso_seconds

# Value checks. Each raises ValueError("<reason>"); errors read "<source>: key=value <reason>".


def _positive(value: int) -> int:
  if value <= 0:
    raise ValueError("must be positive")
  return value


def _non_negative(value: int) -> int:
  if value < 0:
    raise ValueError("must be 0 or more")
  return value


def _auto_or_positive(value: int) -> int:
  if value == 0 or value < -1:
    raise ValueError("must be -1 (derived) or >= 1")
  return value


# format.tokens.VOCAB_SIZE (config imports nothing of format; tests/cli/test_config.py checks
# that the two agree).
NETDATA_VOCAB_SIZE = 268


def _vocabulary(value: int) -> int:
  if value < NETDATA_VOCAB_SIZE:
    raise ValueError(f"must be at least {NETDATA_VOCAB_SIZE}, the netdata-v1 vocabulary")
  return value


def _worker_count(value: int) -> int:
  if value < -1:
    raise ValueError("must be -1, 0 or more")
  return value


def _epochs(value: int) -> int:
  if value == 0 or value < -1:
    raise ValueError("must be -1 (forever) or >= 1")
  return value


def _fraction(value: float) -> float:
  if not 0.0 <= value < 1.0:
    raise ValueError("must be in [0, 1)")
  return value


def _mode_weights(value: list[float]) -> list[float]:
  if len(value) != 3 or min(value) < 0 or sum(value) <= 0:
    raise ValueError("must be three non-negative numbers (full, partial, none) with a positive sum")
  return value


def _registered_dataset_type(value: str) -> str:
  # The registry is a leaf module without JAX: reading it here keeps one list of dataset types.
  from maxtext_netdata.input_pipeline import registry  # noqa: PLC0415

  if value not in registry.dataset_types():
    raise ValueError(f"is not one of {', '.join(registry.dataset_types())}")
  return value


def _compile_flags(value: str) -> str:
  compile_options(value)
  return value


def _float_text(value: Any) -> Any:
  """YAML 1.1 reads "1e-3" (no dot) as text; MaxText users write it."""
  if isinstance(value, str):
    try:
      return float(value)
    except ValueError:
      pass
  return value


def _time_text(value: Any) -> Any:
  """YAML reads 2025-07-01 as a date and 2025-07-01T00:00:00Z as a datetime: back to text."""
  if isinstance(value, datetime.date):
    return value.isoformat()
  return _empty_if_none(value)


def _iso_time(value: str) -> str:
  if value:
    try:
      iso_seconds(value)
    except ValueError:
      raise ValueError("is not an ISO 8601 time (2025-07-01 or 2025-07-01T12:00:00Z)") from None
  return value


def _as_list(value: Any) -> Any:
  return list(value) if isinstance(value, tuple) else value


def _empty_if_none(value: Any) -> Any:
  return "" if value is None else value


Text = Annotated[str, BeforeValidator(_empty_if_none)]
Real = Annotated[float, BeforeValidator(_float_text)]
Positive = Annotated[int, AfterValidator(_positive)]
NonNegative = Annotated[int, AfterValidator(_non_negative)]
AutoOrPositive = Annotated[int, AfterValidator(_auto_or_positive)]
Vocabulary = Annotated[int, AfterValidator(_vocabulary)]
WorkerCount = Annotated[int, AfterValidator(_worker_count)]
Epochs = Annotated[int, AfterValidator(_epochs)]
Fraction = Annotated[float, BeforeValidator(_float_text), AfterValidator(_fraction)]
Names = Annotated[list[str], BeforeValidator(_as_list)]
ModeWeights = Annotated[list[float], BeforeValidator(_as_list), AfterValidator(_mode_weights)]
DatasetType = Annotated[str, AfterValidator(_registered_dataset_type)]
CompileFlags = Annotated[str, BeforeValidator(_empty_if_none), AfterValidator(_compile_flags)]
IsoTime = Annotated[str, BeforeValidator(_time_text), AfterValidator(_iso_time)]


class ConfigModel(BaseModel):
  """Every key maxtext_netdata knows: type, default and the description base.yml shows.

  Strict like our YAML: an int is no bool, a float no int; an int is a float, None is "" and
  "1e-3" is 1e-3 (see the Annotated types above).
  """

  model_config = ConfigDict(strict=True, extra="forbid")

  run_name: Text = Field(
    "netdata_run", description="sub-directory of base_output_directory for this run's outputs"
  )
  base_output_directory: Text = Field(
    "runs", description="where runs write metrics, TensorBoard logs and checkpoints"
  )
  steps: Positive = Field(100, description="training steps")
  log_period: Positive = Field(
    10, description="a stdout metrics line every this many steps (metrics.jsonl gets every step)"
  )
  enable_tensorboard: bool = Field(
    True, description="write TensorBoard event files beside metrics.jsonl"
  )
  enable_checkpointing: bool = Field(
    True, description="save model, optimizer and data-iterator state with Orbax"
  )
  checkpoint_period: Positive = Field(
    50, description="save a checkpoint every this many steps (and at the end)"
  )
  load_parameters_path: str = Field(
    "",
    description="MaxText's key: a checkpoint (<run_dir>/checkpoints/<n>, or its items folder)"
    " whose parameters start this run, with a fresh optimizer, step and data position (the"
    " same model; e.g. after new days of data); a run that resumes its own checkpoint ignores it",
  )
  profiler: Literal["", "xplane"] = Field(
    "",
    description="MaxText's key: xplane records a JAX profiler trace of profiler_steps steps"
    " into <run_dir>/profile, after the first skip_first_n_steps_for_profiler (the compile)",
  )
  skip_first_n_steps_for_profiler: NonNegative = Field(
    1, description="MaxText's key: steps run before the profiler starts"
  )
  profiler_steps: Positive = Field(5, description="MaxText's key: steps the profiler records")
  profiler_perfetto: bool = Field(
    False, description="with profiler: xplane, also Perfetto's trace (perfetto_trace.json.gz)"
  )
  eval_interval: int = Field(-1, description="run eval every this many steps; -1 never")
  eval_steps: Positive = Field(4, description="batches per eval")
  peak_tflops_per_device: Real = Field(
    989.0, description="bf16 dense peak used for MFU (H100 SXM); set for your chip"
  )
  jax_distributed_initialization_timeout: Positive = Field(
    300, description="seconds for all hosts of a multi-host run to connect"
  )

  dataset_type: DatasetType = Field(
    "network_grain",
    description="input pipeline: network_grain, synthetic, or one added by register_dataset_type",
  )
  grain_train_files: Text = Field(
    "", description="raw parquet: paths, globs or gs:// / s3:// URIs, comma-separated"
  )
  grain_eval_files: Text = Field(
    "", description="raw parquet for eval; empty: the test split of grain_train_files"
  )
  # Defaults by measurement (docs/performance.md, "Loader defaults"): the batch kernel runs
  # without the GIL, so building in the training process costs 4-10x less CPU per token than
  # worker processes (Grain's per-element IPC) and starts in milliseconds, not seconds; read
  # threads cost 1.1-2x the CPU per token and were not faster in wall time on 2 cores.
  grain_worker_count: WorkerCount = Field(
    0, description="Grain worker processes; 0 in-process; -1 picks from cores and memory"
  )
  grain_per_worker_buffer_size: Positive = Field(2, description="batches each worker keeps ready")
  grain_num_threads: NonNegative = Field(
    0, description="read threads of to_iter_dataset (in-process prefetch); 0 builds in next()"
  )
  grain_prefetch_buffer_size: NonNegative = Field(
    4, description="batches prefetched by those threads"
  )
  device_prefetch: int = Field(
    2,
    ge=0,
    description="global batches placed on the devices ahead of the step that takes them;"
    " 0 places each when the step asks",
  )
  grain_ram_budget_mb: Positive = Field(2048, description="memory the -1 worker count may use")
  data_shuffle_seed: int = Field(0, description="seed of every random choice of the data pipeline")
  enable_data_shuffling: bool = Field(
    True, description="false: slots in store order (still deterministic)"
  )
  num_epoch: Epochs = Field(
    1, description="passes over the data; the iterator ends after them; -1 repeats forever"
  )
  packing: bool = Field(
    True, description="fill sequences with several contexts (segment ids 1..k); false pads"
  )
  max_target_length: Positive = Field(1024, description="tokens per sequence")
  per_device_batch_size: Real = Field(8.0, description="sequences per device per step")
  global_batch_size_to_load: AutoOrPositive = Field(
    -1, description="sequences per step over all hosts; -1: per_device_batch_size x devices"
  )
  data_sharding: Names = Field(
    ["data"], description="mesh axes the batch dimension is sharded over"
  )

  network_prepared_dir: Text = Field(
    "",
    description="prepared store location (a folder, or gs:// / s3:// shared by every host);"
    " empty: <base_output_directory>/prepared",
  )
  network_store_cache_dir: Text = Field(
    "",
    description="local folder for the copy of a gs:// / s3:// store;"
    " empty: ~/.cache/maxtext_netdata/stores",
  )
  network_store_access: Literal["auto", "normal", "random"] = Field(
    "auto",
    description="how the loader reads the store's rows from disk: normal (a fault reads the"
    " pages around it: fills page cache fast), random (madvise MADV_RANDOM: its page only,"
    " for a store larger than memory, read at random; the next batches' rows asked for"
    " ahead); auto: random when the rows exceed the memory page cache may take (what"
    " processes hold left out)",
  )
  network_split: Literal["probe", "time"] = Field(
    "probe", description="probe: test set = probes by stable address hash; time: the latest rows"
  )
  network_test_fraction: Fraction = Field(
    0.1, description="share of probes (or of time) held out as the test split"
  )
  network_mode_weights: ModeWeights = Field(
    [0.4, 0.3, 0.3], description="weights of the full / partial / none context modes"
  )
  network_field_order: Literal["random", "fixed", "hashed"] = Field(
    "random", description="random | fixed | hashed order of a measurement's field blocks"
  )
  network_skip_bad_rows: bool = Field(
    False, description="true: drop unparsable rows and count them in the prepare summary"
  )
  network_since: IsoTime = Field(
    "",
    description="prepare keeps the rows at or after this time (ISO 8601, UTC unless it says;"
    " empty: no bound): a rolling window's start",
  )
  network_until: IsoTime = Field(
    "", description="prepare keeps the rows before this time (as network_since; empty: no bound)"
  )
  network_prepare_memory_mb: int = Field(
    1024, ge=256, description="memory prepare may use, whatever the row count (sets its buckets)"
  )
  network_remote_retries: NonNegative = Field(
    5,
    description="S3: the SDK's attempts per request (AWS standard retry strategy, its own"
    " backoff); GCS: sizes the retry window with network_remote_backoff_s",
  )
  network_remote_backoff_s: Real = Field(
    0.5,
    description="GCS only: the client retries transient errors for"
    " backoff_s x (2^network_remote_retries - 1) seconds",
  )
  network_s3_endpoint: Text = Field(
    "", description="S3-compatible endpoint URL; empty: AWS_ENDPOINT_URL or AWS default"
  )
  network_s3_region: Text = Field(
    "", description="S3 region; empty: AWS_REGION / AWS_DEFAULT_REGION"
  )

  vocab_size: Vocabulary = Field(268, description="netdata-v1 vocabulary (a model may round it up)")
  base_emb_dim: Positive = Field(640, description="model width")
  base_num_query_heads: Positive = Field(10, description="attention heads")
  base_num_kv_heads: Positive = Field(
    10, description="key/value heads (grouped-query attention when fewer)"
  )
  head_dim: Positive = Field(64, description="width of one head")
  base_mlp_dim: Positive = Field(2048, description="MLP hidden width")
  base_num_decoder_layers: Positive = Field(20, description="decoder blocks")
  dtype: Literal["bfloat16", "float32", "float16"] = Field(
    "bfloat16", description="activation dtype"
  )
  weight_dtype: Literal["bfloat16", "float32"] = Field("float32", description="parameter dtype")
  logits_dot_in_fp32: bool = Field(True, description="compute the output projection in float32")
  attention: Literal["dot_product", "xla", "cudnn", "cudnn_packed", "pallas", "einsum"] = Field(
    "dot_product",
    description="attention kernel: dot_product (jax.nn.dot_product_attention: cuDNN's fused"
    " kernel on a GPU in bfloat16/float16 where it takes the shapes, else XLA's),"
    " xla, cudnn (fused, GPU, bfloat16/float16 only), cudnn_packed (cuDNN's packed layout,"
    " one sequence per segment, no mask bias; Hopper GPUs or later), pallas (JAX's Pallas"
    " flash attention on the segment ids; GPU only) or einsum (plain einsum + softmax)",
  )
  max_segments_per_seq: Positive = Field(
    16,
    description="cudnn_packed: room for runs of a segment id per row in the packed layout"
    " (MaxText's key); a batch with a row of more takes the mask's kernel for that step",
  )
  remat_policy: Literal["none", "minimal", "minimal_with_context", "full"] = Field(
    "full",
    description="what each decoder block keeps for the backward pass (MaxText's key and"
    " names): none (everything), minimal (the matmul outputs), minimal_with_context (and"
    " the attention output), full (its input only; the rest is recomputed)",
  )

  scan_layers: bool = Field(
    True,
    description="scan one decoder block over the layers (MaxText's key); false unrolls them:"
    " a longer compile, another parameter layout",
  )
  use_iota_embed: bool = Field(
    False, description="embed tokens by a one-hot matmul instead of a gather (MaxText's key)"
  )
  fused_qkv: bool = Field(
    False,
    description="query, key and value projections as one matmul (MaxText's key; needs"
    " base_num_kv_heads = base_num_query_heads)",
  )
  fused_mlp: bool = Field(
    False, description="the MLP's gate and up projections as one matmul (MaxText's key)"
  )
  compile_xla_flags: CompileFlags = Field(
    "",
    description="XLA options for compiling the train and eval steps only, as"
    " `--name=value ...` (MaxText's key): this run's, over XLA_FLAGS; an option XLA does not"
    ' know fails the compile, naming it (docs/training.md, "XLA flags")',
  )

  learning_rate: Real = Field(0.0003, description="peak learning rate")
  warmup_steps_fraction: Real = Field(
    0.1, description="share of steps spent warming up linearly from 0"
  )
  cosine_learning_rate_final_fraction: Real = Field(
    0.1, description="final learning rate as a fraction of the peak"
  )
  learning_rate_schedule_steps: AutoOrPositive = Field(
    -1, description="steps the warmup + cosine schedule spans; -1: steps"
  )
  adam_b1: Real = Field(0.9, description="AdamW beta1")
  adam_b2: Real = Field(0.95, description="AdamW beta2")
  adam_eps: Real = Field(1e-08, description="AdamW epsilon")
  adam_weight_decay: Real = Field(0.1, description="AdamW decoupled weight decay")
  gradient_clipping_threshold: Real = Field(
    1.0, description="global-norm gradient clipping; 0 disables"
  )
  optimizer_flatten: bool = Field(
    False,
    description="the optimizer's update (clipping, AdamW) over one flat vector of every"
    " parameter (optax.flatten): its reductions and moments a few large kernels, not several"
    " a parameter; ours, not MaxText's; a checkpoint restores only under the setting it was"
    " saved with",
  )
