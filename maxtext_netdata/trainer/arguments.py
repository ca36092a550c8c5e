"""`maxtext-netdata train`'s arguments, apart from the trainer so that `train --help` answers
before jax, flax and the input pipeline are imported (0.3 s against 3.9 s)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("config", help="YAML config, e.g. configs/smoke.yml")
  parser.add_argument("overrides", nargs="*", help="key=value overrides")
