"""`maxtext-netdata train`'s arguments, apart from the trainer so that `train --help` answers
before jax, flax and the input pipeline are imported (0.3 s against 3.9 s)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("config", help="YAML config, e.g. configs/smoke.yml")
  parser.add_argument("overrides", nargs="*", help="key=value overrides")


def predict(parser: argparse.ArgumentParser) -> None:
  """`maxtext-netdata predict`'s arguments."""
  parser.add_argument("config", help="the YAML config the model was trained with")
  parser.add_argument("overrides", nargs="*", help="key=value overrides, as in training")
  parser.add_argument(
    "--src", required=True, help="the probe: a source address of the training data"
  )
  parser.add_argument(
    "--dst", required=True, action="append", help="a destination address (repeat for more)"
  )
  parser.add_argument(
    "--checkpoint",
    help="a checkpoint folder (<run_dir>/checkpoints/<step>); default: the run's latest,"
    " else load_parameters_path",
  )
  parser.add_argument(
    "--context-rows",
    type=int,
    help="at most this many of the probe's latest measurements as context (default: as many"
    " as fit in max_target_length; 0: none)",
  )
  parser.add_argument(
    "--top-k",
    type=int,
    default=32,
    help="high RTT bytes whose low bytes are read (default 32 of 256)",
  )
  parser.add_argument("--json", action="store_true", help="one JSON object per destination")
  parser.epilog = (
    "Each line: the destination, the probability that the ping fails, and the RTT's median,"
    " mean, 10th and 90th percentiles given that it does not (docs/training.md, 'Asking the"
    " model')."
  )
