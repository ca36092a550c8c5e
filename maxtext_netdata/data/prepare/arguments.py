"""The arguments of `maxtext-netdata prepare` and `tokenize`, apart from their commands so that
`--help` answers before numba and pyarrow are imported (0.3 s against 1.3 s)."""

from __future__ import annotations

FIELD_ORDERS = ("fixed", "hashed", "random")
TIMESTAMPS = ("abs", "delta", "none")


def prepare(parser) -> None:
  parser.add_argument("config", help="YAML config (e.g. configs/base.yml)")
  parser.add_argument("overrides", nargs="*", help="key=value config overrides")
  parser.add_argument(
    "--force",
    action="store_true",
    help="build in full even if a current store exists, or one to update (new files appended,"
    " files no longer listed removed, a time split cut again at another test fraction)",
  )
  parser.add_argument(
    "--prune",
    action="store_true",
    help="then remove the stores this one supersedes: those of the same settings made from a"
    " part of its files, and the one it was updated from (yesterday's store, once today's"
    " files are appended and the oldest day's removed)",
  )
  parser.add_argument(
    "--runner",
    choices=("builtin", "beam"),
    default="builtin",
    help="builtin: this process; beam: an Apache Beam pipeline (pip install '.[beam]'), its"
    " options after `--` (DirectRunner by default)",
  )


def tokenize(parser) -> None:
  parser.add_argument("file", help="raw parquet file: a path, gs:// or s3:// URI")
  parser.add_argument(
    "--field-order",
    choices=FIELD_ORDERS,
    default="fixed",
    help="order of a measurement's field blocks (default fixed: src, dst, result, timestamp)",
  )
  parser.add_argument(
    "--timestamps", choices=TIMESTAMPS, default="delta", help="timestamp tokens (default delta)"
  )
  parser.add_argument("--limit", type=int, default=None, help="tokenize the first N rows only")
  parser.add_argument("--seed", type=int, default=0, help="seed of --field-order random")
