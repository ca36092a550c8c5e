"""`maxtext-netdata batches CONFIG [key=value ...] --steps N [--start S]`.

Prints one line per global step: `step <s> <sha256>` of the global batch, the digest covering
the bytes of the six int32 arrays in the order inputs, inputs_segmentation, inputs_position,
targets, targets_segmentation, targets_position. Identical lines for two configs mean
identical training data: the check for determinism across worker counts and restarts.
"""

from __future__ import annotations

import argparse
import hashlib

import numpy as np

from maxtext_netdata import config as config_lib
from maxtext_netdata.errors import UserError
from maxtext_netdata.input_pipeline.sequences import KEYS


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("config", help="YAML config (dataset_type network_grain)")
  parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
  parser.add_argument("--steps", type=int, required=True, help="number of batches to print")
  parser.add_argument("--start", type=int, default=0, help="first global step (default 0)")
  parser.epilog = (
    "Each line: 'step S DIGEST', DIGEST = sha256 over the bytes of the global batch's"
    f" int32 arrays in the order {', '.join(KEYS)}."
  )


def digest(batch: dict[str, np.ndarray]) -> str:
  """sha256 hex of the six arrays' bytes in KEYS order."""
  h = hashlib.sha256()
  for key in KEYS:
    h.update(np.ascontiguousarray(batch[key], dtype=np.int32).tobytes())
  return h.hexdigest()


def run(args: argparse.Namespace) -> int:
  import jax  # noqa: PLC0415 (keeps `--help` fast)

  from maxtext_netdata.data.prepare import prepare  # noqa: PLC0415
  from maxtext_netdata.input_pipeline import batch_kernel_loading, network_grain  # noqa: PLC0415
  from maxtext_netdata.input_pipeline.sequences import BatchBuilder  # noqa: PLC0415

  if args.steps < 1 or args.start < 0:
    raise UserError(f"--steps {args.steps} must be >= 1 and --start {args.start} >= 0")
  config = config_lib.load(args.config, args.overrides)
  if config.dataset_type != "network_grain":
    raise UserError(f"batches reads network_grain data, not dataset_type={config.dataset_type}")
  size = config.global_batch_size(jax.device_count())
  splits = prepare.ensure_prepared(config)
  builder = BatchBuilder.from_config(config, splits.train, size)
  total = builder.num_steps
  if total is not None and args.start >= total:
    raise UserError(f"--start {args.start}: the data has {total} steps")
  # Every process builds all rows: the global batch, whatever the process count. The
  # trainer's iterator: a dead worker is a one-line error and its /dev/shm blocks go with it.
  iterator = network_grain.HostBatchIterator(config, builder, 0, size, total, start=args.start)
  try:
    for step in range(args.start, args.start + args.steps):
      try:
        batch = next(iterator)
      except StopIteration:
        break
      print(f"step {step} {digest(batch)}", flush=True)
  finally:
    iterator.close()
  batch_kernel_loading.finish_compile()
  return 0
