"""`maxtext-netdata tokenize FILE`: one JSON list of token ids per measurement, in file order.

For inspection and oracle tests: the rows go through the same validation as `prepare`
(`data.raw.schema`), so bad input fails with one line naming the file and row. `--timestamps abs`
gives every row an absolute timestamp, `delta` treats the rows as one sequence (the first
absolute, then deltas), `none` leaves timestamps out.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from maxtext_netdata.data.raw import reader, schema
from maxtext_netdata.errors import UserError
from maxtext_netdata.format import tokenizer


def read_rows(path: str, limit: int | None = None) -> schema.RawColumns:
  """Validated rows of `path`, the first `limit` only (reading no further row groups)."""
  parts, count = [], 0
  for columns, _ in reader.iter_columns(path):
    parts.append(columns)
    count += len(columns)
    if limit is not None and count >= limit:
      break
  if not parts:
    return schema.empty_columns(path)
  columns = schema.concat_columns(parts)
  if limit is None or limit >= len(columns):
    return columns
  return schema.RawColumns(
    src=columns.src[:limit],
    dst=columns.dst[:limit],
    version=columns.version[:limit],
    seconds=columns.seconds[:limit],
    rtt=columns.rtt[:limit],
    src_text=columns.src_text.slice(0, limit),
    dst_text=columns.dst_text.slice(0, limit),
    rows=columns.rows[:limit],
  )


def tokenize_columns(
  columns: schema.RawColumns, field_order: str, timestamps: str, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
  """(int32 tokens, int64 offsets [N + 1]) of the rows in file order, as `tokenize` prints."""
  n = len(columns)
  has_ts = np.full(n, timestamps != "none")
  segment_start = np.full(n, timestamps == "abs")
  ts_kind, ts_value = tokenizer.timestamp_kinds(columns.seconds, has_ts, segment_start)
  if field_order == "fixed":
    order = np.zeros(n, np.uint8)
  elif field_order == "hashed":
    order = tokenizer.hashed_orders(columns.src_text, columns.dst_text, columns.seconds, has_ts)
  else:
    order = tokenizer.random_orders(np.random.default_rng(seed).bit_generator.random_raw(n))
  rtt_bytes, failed = tokenizer.rtt_bytes(columns.rtt)
  return tokenizer.encode(
    src=columns.src,
    dst=columns.dst,
    version=columns.version,
    rtt_bytes=rtt_bytes,
    failed=failed,
    ts_kind=ts_kind,
    ts_value=ts_value,
    order=order,
  )


def run(args) -> int:

  if args.limit is not None and args.limit < 0:
    raise UserError(f"--limit must be >= 0, got {args.limit}")
  columns = read_rows(args.file, args.limit)
  tokens, offsets = tokenize_columns(columns, args.field_order, args.timestamps, args.seed)
  bounds = offsets.tolist()
  flat = tokens.tolist()
  try:
    for begin, end in zip(bounds[:-1], bounds[1:], strict=True):
      sys.stdout.write(json.dumps(flat[begin:end]) + "\n")
    sys.stdout.flush()
  except BrokenPipeError:
    # The reader (e.g. `head`) has stopped: not an error. Keep the exit flush from failing.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
  return 0
