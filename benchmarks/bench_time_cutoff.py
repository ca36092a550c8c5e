"""Benchmark of the time split's cutoff over many pieces, at the size of a month's pieces.

    python benchmarks/bench_time_cutoff.py [--pieces 20] [--rows 2000000] [--probes 2]
        [--days 31]

With `network_split: time`, prepare finds the `1 - network_test_fraction` quantile of every
row's second from its sorted pieces (`data/prepare/assemble.py`, `time_cutoff`); RIPE Atlas's
month is ~17,500 pieces of ~2M rows over ~2.6M distinct seconds. This writes `--pieces` such
pieces (`--probes` probes each, seconds drawn over `--days` days, each probe's rows sorted),
then prints the CPU seconds of `time_cutoff` per piece and whether it equals
`np.quantile(..., method="higher")`. Only `assemble.time_cutoff(pieces, fraction)` and
`store.ProbeRows.write` are called, so the same command runs on an older checkout
(`PYTHONPATH=<checkout>`) for a before/after comparison.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--pieces", type=int, default=20)
  parser.add_argument("--rows", type=int, default=2_000_000)
  parser.add_argument("--probes", type=int, default=2)
  parser.add_argument("--days", type=int, default=31)
  args = parser.parse_args()

  from maxtext_netdata.data.prepare import assemble  # noqa: PLC0415
  from maxtext_netdata.data.store import store  # noqa: PLC0415

  rng = np.random.default_rng(0)
  work = tempfile.mkdtemp(prefix="bench-time-cutoff-")
  pieces, seconds = [], []
  start = 1_751_328_000  # 2025-07-01
  for k in range(args.pieces):
    probe = np.sort(rng.integers(0, args.probes, args.rows))
    second = start + rng.integers(0, args.days * 86400, args.rows)
    order = np.lexsort((second, probe))
    sizes = np.bincount(probe, minlength=args.probes)
    sizes = sizes[sizes > 0]
    path = os.path.join(work, f"{k:05d}")
    store.ProbeRows(
      probe_offsets=np.concatenate([[0], np.cumsum(sizes)]),
      probe_src=np.zeros((len(sizes), 16), np.uint8),
      probe_version=np.full(len(sizes), 4, np.uint8),
      dst=np.zeros((args.rows, 16), np.uint8),
      seconds=second[order].astype(np.uint32),
      rtt_bytes=np.ones((args.rows, 2), np.uint8),
      hashed_order=None,
    ).write(path, {})
    pieces.append(path)
    seconds.append(second)
  every = np.concatenate(seconds)
  print(f"{args.pieces} pieces of {args.rows:,} rows, {len(np.unique(every)):,} distinct seconds")
  for fraction in (0.1, 0.01):
    started = time.process_time()
    cutoff = assemble.time_cutoff(pieces, fraction)
    cpu = time.process_time() - started
    expected = np.quantile(every, 1 - fraction, method="higher")
    print(
      f"fraction {fraction}: {cpu / args.pieces * 1e3:,.1f} CPU ms a piece;"
      f" numpy's quantile: {cutoff == expected}"
    )
  shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
  main()
