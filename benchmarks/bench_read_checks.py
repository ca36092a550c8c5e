"""What the corruption checks on the raw-parquet read path cost, per row.

    python benchmarks/bench_read_checks.py [--rows 2000000]

Generates `--rows` rows, writes them once without and once with page checksums, and times,
best of 3: reading the columns `prepare` reads (checksums verified or not), Arrow's full
validation (`schema.check_decoded`), and the whole of `schema.validate_table` (which
includes both the full validation and the dictionary-index check of `parse_addresses`).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq

from maxtext_netdata.data.raw import schema
from maxtext_netdata.data.synthetic.generate import generate


def _best(fn, repeats: int = 3) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return min(times)


def _read(path: str, verify: bool) -> list[pa.Table]:
  options = {
    **schema.PARQUET_READ_OPTIONS,
    "read_dictionary": list(schema.ADDRESS_COLUMNS),  # as the reader reads generate's files
    "page_checksum_verification": verify,
  }
  parquet = pq.ParquetFile(path, **options)
  batches = parquet.iter_batches(batch_size=1 << 18, columns=list(schema.REQUIRED_COLUMNS))
  return [pa.Table.from_batches([b]) for b in batches]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=int, default=2_000_000)
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as folder:
    plain = generate(folder, rows=args.rows, shards=1, seed=0, progress=False)[0]
    checksummed = os.path.join(folder, "checksummed.parquet")
    pq.write_table(
      pq.read_table(plain, **schema.PARQUET_READ_OPTIONS), checksummed, write_page_checksum=True
    )
    tables = _read(checksummed, True)
    n = sum(t.num_rows for t in tables)

    def per_row(seconds: float) -> str:
      return f"{seconds / n * 1e9:7.1f} ns/row"

    figures = {
      "read, no checksums in file": _best(lambda: _read(plain, True)),
      "read, checksums not verified": _best(lambda: _read(checksummed, False)),
      "read, checksums verified": _best(lambda: _read(checksummed, True)),
      "check_decoded (full validation)": _best(
        lambda: [schema.check_decoded(t, source="x") for t in tables]
      ),
      "validate_table (all row checks)": _best(
        lambda: [schema.validate_table(t, source="x") for t in tables]
      ),
    }
  print(f"{n:,} rows, one core")
  for name, seconds in figures.items():
    print(f"  {name:<34} {seconds:7.3f} s  {per_row(seconds)}")
  verify = figures["read, checksums verified"] - figures["read, checksums not verified"]
  print(f"  checksum verification adds         {per_row(verify)}")
  print(
    "  at prepare's 2.4M rows/s (417 ns/row) the checks are"
    f" {(verify + figures['check_decoded (full validation)']) / n * 1e9 / 417:.1%} of a row"
  )


if __name__ == "__main__":
  main()
