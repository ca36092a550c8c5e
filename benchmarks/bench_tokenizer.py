"""Throughput of the data foundation on one core: generate, address parsing, tokenizer.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_tokenizer.py [--rows 1000000]

Prints rows/s of `generate` and of `parse_addresses` on a generated address column, and
tokens/s of the vectorized `tokenizer.encode` (batches of 8 and 256 sequences of 1024
tokens, fresh output and in place), of the plain per-row reference tokenizer and of the
`hashed` field order (vectorized and per row). Each figure
is the best of several repeats, as wall time and as CPU time of this one process (numpy
and the parquet writer run on one core here), so other load on the machine disturbs them
less.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from maxtext_netdata.data.raw import addresses, reader  # noqa: E402
from maxtext_netdata.data.synthetic.generate import generate  # noqa: E402
from maxtext_netdata.format import tokenizer  # noqa: E402
from tests.helpers import reference_tokenizer  # noqa: E402

TOKENS_PER_SEQUENCE = 1024


def best_of(fn, repeats: int) -> tuple[float, float]:
  """Smallest (wall, CPU) seconds of `repeats` calls of fn; CPU time is what one core spent."""
  wall = cpu = float("inf")
  for _ in range(repeats):
    start, start_cpu = time.perf_counter(), time.process_time()
    fn()
    wall = min(wall, time.perf_counter() - start)
    cpu = min(cpu, time.process_time() - start_cpu)
  return wall, cpu


def report(name: str, count: float, unit: str, seconds: tuple[float, float]) -> None:
  wall, cpu = seconds
  print(
    f"{name:<40} {count:>10,.0f} {unit:<6} wall {wall * 1e3:>8.2f} ms {count / wall / 1e6:>7.2f}"
    f" M/s   cpu {cpu * 1e3:>8.2f} ms {count / max(cpu, 1e-9) / 1e6:>7.2f} M {unit}/s"
  )


def measurement_columns(path: str, rng: np.random.Generator) -> dict:
  """Encode inputs for the rows of one generated file, as a pipeline would build them."""
  columns, _ = reader.read_raw(path)
  n = len(columns)
  rtt_bytes, failed = tokenizer.rtt_bytes(columns.rtt)
  has_ts = rng.random(n) < 0.7  # the mix of full / partial / none contexts
  segment_start = np.arange(n) % 40 == 0  # ~40 measurements per 1024-token sequence
  ts_kind, ts_value = tokenizer.timestamp_kinds(columns.seconds, has_ts, segment_start)
  order = tokenizer.random_orders(rng.bit_generator.random_raw(n))
  return dict(
    src=columns.src,
    dst=columns.dst,
    version=columns.version,
    rtt_bytes=rtt_bytes,
    failed=failed,
    ts_kind=ts_kind,
    ts_value=ts_value,
    order=order,
  )


def bench_encode(columns: dict, sequences: int, repeats: int) -> None:
  lengths = tokenizer.measurement_lengths(columns["version"], columns["failed"], columns["ts_kind"])
  # Enough measurements to fill `sequences` sequences (no padding: pure tokenizer cost).
  count = int(np.searchsorted(np.cumsum(lengths), sequences * TOKENS_PER_SEQUENCE))
  batch = {key: value[:count] for key, value in columns.items()}
  tokens, offsets = tokenizer.encode(**batch)
  out = np.empty(len(tokens), np.int32)
  positions = offsets[:-1]
  seconds = best_of(lambda: tokenizer.encode(**batch), repeats)
  report(f"encode, {sequences} sequences, new array", len(tokens), "tokens", seconds)
  seconds = best_of(lambda: tokenizer.encode(**batch, out=out, positions=positions), repeats)
  report(f"encode, {sequences} sequences, in place", len(tokens), "tokens", seconds)


def bench_reference(path: str, rows: int) -> None:
  import pyarrow.parquet as pq  # noqa: PLC0415

  table = pq.read_table(path).slice(0, rows)
  src = table.column("src_addr").to_pylist()
  dst = table.column("dst_addr").to_pylist()
  version = table.column("ip_version").to_pylist()
  rtt = table.column("rtt").to_pylist()

  def run():
    total = 0
    for i in range(rows):
      total += len(
        reference_tokenizer.encode_measurement(
          src[i], dst[i], version[i], rtt[i], "delta", 60, reference_tokenizer.FIXED_ORDER
        )
      )
    return total

  tokens = run()
  report("reference tokenizer (per row)", tokens, "tokens", best_of(run, 1))


def bench_hashed(columns, repeats: int) -> None:
  rows = min(len(columns), 50_000)
  src, dst = columns.src_text.slice(0, rows), columns.dst_text.slice(0, rows)
  seconds = columns.seconds[:rows]
  timing = best_of(lambda: tokenizer.hashed_order_pairs(src, dst, seconds), repeats)
  report("hashed_order_pairs (both variants)", rows, "rows", timing)

  def per_row_python():
    for s, d, t in zip(
      src.to_pylist()[:5_000], dst.to_pylist()[:5_000], seconds.tolist(), strict=False
    ):
      reference_tokenizer.hashed_order(s, d, t, True)
      reference_tokenizer.hashed_order(s, d, t, False)

  report("hashed order, per row in Python (both)", 5_000, "rows", best_of(per_row_python, 1))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rows", type=int, default=1_000_000, help="rows to generate")
  parser.add_argument("--repeats", type=int, default=20, help="repeats per timing (best kept)")
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  with tempfile.TemporaryDirectory() as folder:
    seconds = best_of(lambda: generate(folder, rows=args.rows, shards=4, progress=False), 3)
    report("generate (4 shards, parquet written)", args.rows, "rows", seconds)
    path = sorted(p for p in os.listdir(folder) if p.endswith(".parquet"))[0]
    path = os.path.join(folder, path)
    columns, _ = reader.read_raw(path)
    text = columns.src_text
    seconds = best_of(
      lambda: addresses.parse_addresses(text, columns.version, source=path, column_name="src_addr"),
      args.repeats,
    )
    report("parse_addresses (generated src_addr)", len(text), "rows", seconds)
    inputs = measurement_columns(path, rng)
    for sequences in (8, 256):
      bench_encode(inputs, sequences, args.repeats)
    bench_reference(path, 20_000)
    bench_hashed(columns, 3)


if __name__ == "__main__":
  main()
