"""`maxtext-netdata ingest`'s arguments, apart from the ingest so that `ingest --help` answers
before numba, pyarrow and DuckDB are imported (0.3 s against 1.8 s)."""

from __future__ import annotations

SHARD_ROWS = 1_000_000  # rows per file when --shards is not given


def add_arguments(parser) -> None:
  parser.add_argument(
    "inputs",
    nargs="+",
    metavar="INPUT",
    help="RIPE Atlas ping results: JSON lines or a JSON array, plain, .bz2, .gz or .zst;"
    " paths, globs, gs:// or s3:// URIs, or folders (every file in them, at any depth, whose"
    " name does not start with '.')",
  )
  parser.add_argument("--out", required=True, help="output folder for the parquet shards")
  parser.add_argument(
    "--shards",
    type=int,
    default=0,
    help=f"parquet files (default, or 0: one per {SHARD_ROWS:,} rows)",
  )
  parser.add_argument(
    "--skip-bad", action="store_true", help="skip and count bad lines instead of stopping"
  )
  parser.add_argument(
    "--probe-fraction",
    type=float,
    default=1.0,
    metavar="F",
    help="keep the results of a share F of the probes, chosen by probe hash (whole probes:"
    " the same on every file and machine; default 1: all)",
  )
  parser.add_argument(
    "--since", metavar="TIME", help="keep results at or after TIME (ISO 8601, UTC unless given)"
  )
  parser.add_argument("--until", metavar="TIME", help="keep results before TIME (ISO 8601)")
  parser.add_argument(
    "--decompress-threads",
    type=int,
    default=0,
    metavar="N",
    help="threads decompressing a .bz2 input (default 0: every usable core); .gz and .zst take one",
  )
  parser.add_argument(
    "--runner",
    choices=("builtin", "beam"),
    default="builtin",
    help="builtin: this process; beam: an Apache Beam pipeline, one input file a worker (pip"
    " install '.[beam]'), its options after `--` (DirectRunner by default); the same files",
  )
