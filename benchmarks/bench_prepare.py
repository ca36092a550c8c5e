"""Benchmark of `prepare`, then of loading from its store.

    python benchmarks/bench_prepare.py [--rows 2000000] [--shards 8] [--data DIR] [--hashed]
        [--keep DIR] [--load-steps 20] [--workers 2] [--world-rows N]

Generates `--rows` realistic raw rows (reused from `--data` when already there; with
`--world-rows N`, drawn from the world of an N-row dump: as many distinct probes and
addresses as N rows have, which is what makes a large dump slower per row), prepares
them from scratch in a fresh child process, so that its peak RSS is prepare's own, and
prints wall time, rows per CPU-second, peak RSS and store bytes per row. CPU seconds include
pyarrow's decode threads: "rows per CPU-second" is the per-core rate. Two more fresh processes
time prepare's numba kernels: compiled into an empty cache (a machine's first prepare), then
loaded from it (every later one). Then a second child
loads `--load-steps` batches of `configs/latency_network.yml` from that store with
`--workers` Grain workers and prints the first batch's time, real (non-padding) tokens per
second and each worker's RSS, USS and anonymous memory (USS: pages no other process maps,
which includes store pages only it has read; anonymous: its heap and arrays, what it holds
beyond page cache).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time


def _child(data_dir: str, prepared_dir: str, hashed: bool) -> None:
  """Prepare in this process and print the figures as one JSON line."""
  import psutil  # noqa: PLC0415  (imports counted in the baseline, not in prepare's figures)

  from maxtext_netdata import config  # noqa: PLC0415
  from maxtext_netdata.data.prepare import prepare  # noqa: PLC0415

  cfg = config.load(
    None,
    [
      f"grain_train_files={data_dir}",
      f"network_prepared_dir={prepared_dir}",
      f"network_field_order={'hashed' if hashed else 'random'}",
    ],
  )
  baseline = psutil.Process().memory_info().rss
  usage = resource.getrusage(resource.RUSAGE_SELF)
  cpu_start = usage.ru_utime + usage.ru_stime
  start = time.perf_counter()
  splits = prepare.prepare(cfg, progress=False, force=True)
  seconds = time.perf_counter() - start
  usage = resource.getrusage(resource.RUSAGE_SELF)
  summary = splits.summary
  store_bytes = sum(
    os.path.getsize(os.path.join(folder, name))
    for folder, _, names in os.walk(summary["path"])
    for name in names
  )
  print(
    json.dumps(
      {
        "rows": summary["rows_read"],
        "probes": summary["probes"],
        "seconds": seconds,
        "cpu_seconds": usage.ru_utime + usage.ru_stime - cpu_start,
        "peak_rss": prepare.peak_rss_bytes(),
        "baseline_rss": baseline,
        "store_bytes": store_bytes,
      }
    )
  )


def _compile_child() -> None:
  """Print the seconds this process takes to make prepare's numba kernels ready (JSON)."""
  from maxtext_netdata.data.prepare import row_kernels  # noqa: PLC0415
  from maxtext_netdata.data.raw import ip_text  # noqa: PLC0415
  from maxtext_netdata.kernels import hash_table  # noqa: PLC0415

  seconds = ip_text.compile_seconds() + hash_table.compile_seconds() + row_kernels.compile_seconds()
  print(json.dumps({"seconds": seconds}))


def _compile_figures() -> tuple[float, float]:
  """(seconds to compile prepare's numba kernels into an empty cache, seconds to load them
  from the cache), each in a fresh process: the first prepare on a machine pays the first,
  every later one the second."""
  figures = []
  with tempfile.TemporaryDirectory() as cache:
    for _ in range(2):
      env = dict(os.environ, NUMBA_CACHE_DIR=cache)
      result = subprocess.run(
        [sys.executable, __file__, "--compile-child"],
        check=True, capture_output=True, text=True, env=env,
      )  # fmt: skip
      figures.append(json.loads(result.stdout.strip().splitlines()[-1])["seconds"])
  return figures[0], figures[1]


def _anonymous_bytes(pid: int) -> int:
  """The process's anonymous memory (heap, arrays): what it holds beyond mapped files.

  USS also counts file pages that only this process has mapped (store pages it alone read),
  which are page cache the kernel can drop; anonymous memory is what the process really holds.
  """
  try:
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
      for line in f:
        if line.startswith("Anonymous:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return 0


def _load_child(data_dir: str, prepared_dir: str, steps: int, workers: int) -> None:
  """Load `steps` batches from the prepared store and print the figures as one JSON line."""
  import numpy as np  # noqa: PLC0415
  import psutil  # noqa: PLC0415
  from absl import flags  # noqa: PLC0415

  from maxtext_netdata import config  # noqa: PLC0415
  from maxtext_netdata.data.prepare import prepare  # noqa: PLC0415
  from maxtext_netdata.input_pipeline import network_grain  # noqa: PLC0415
  from maxtext_netdata.input_pipeline.sequences import BatchBuilder  # noqa: PLC0415

  flags.FLAGS.mark_as_parsed()  # Grain's workers read its flags; this script sets none
  root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
  cfg = config.load(
    os.path.join(root, "configs", "latency_network.yml"),
    [
      f"grain_train_files={data_dir}",
      f"network_prepared_dir={prepared_dir}",
      f"grain_worker_count={workers}",
      "global_batch_size_to_load=8",
    ],
  )
  start = time.perf_counter()
  splits = prepare.ensure_prepared(cfg, progress=False)
  builder = BatchBuilder.from_config(cfg, splits.train, 8)
  iterator = network_grain.make_iterator(cfg, builder, 0, 8, builder.num_steps)
  first = None
  tokens = 0
  for step in range(steps):
    batch = next(iterator)
    if step == 0:
      first = time.perf_counter() - start
      after_first = time.perf_counter()
    else:
      tokens += int(np.count_nonzero(batch["targets_segmentation"]))
  seconds = time.perf_counter() - after_first
  children = psutil.Process().children(recursive=True)
  workers_mem = [
    (c.memory_info().rss, c.memory_full_info().uss, _anonymous_bytes(c.pid)) for c in children
  ]
  print(
    json.dumps(
      {
        "first_batch_s": first,
        "tokens_per_s": tokens / seconds if seconds else 0.0,
        "main_rss": psutil.Process().memory_info().rss,
        "workers": workers_mem,
      }
    ),
    flush=True,
  )
  close = getattr(iterator, "close", None)
  if close is not None:
    close()  # stops the workers and frees their shared memory


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=int, default=2_000_000, help="raw rows (default 2M)")
  parser.add_argument("--shards", type=int, default=8, help="raw files (default 8)")
  parser.add_argument("--data", help="folder for the raw files (reused if they match)")
  parser.add_argument("--hashed", action="store_true", help="also store the hashed field order")
  parser.add_argument("--keep", help="prepare into this folder and keep the store")
  parser.add_argument("--load-steps", type=int, default=20, help="batches to load (0: none)")
  parser.add_argument("--workers", type=int, default=2, help="Grain workers while loading")
  parser.add_argument(
    "--world-rows", type=int, help="size the generated world as for this many rows"
  )
  parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
  parser.add_argument("--compile-child", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--load-child", nargs=2, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    _child(*args.child, args.hashed)
    return 0
  if args.compile_child:
    _compile_child()
    return 0
  if args.load_child:
    _load_child(*args.load_child, args.load_steps, args.workers)
    return 0

  from maxtext_netdata.data.raw import layout  # noqa: PLC0415
  from maxtext_netdata.data.synthetic import generate  # noqa: PLC0415

  with tempfile.TemporaryDirectory() as tmp:
    data_dir = args.data or os.path.join(tmp, "raw")
    marker = os.path.join(data_dir, layout.COMPLETE_MARKER)
    world_rows = args.world_rows or args.rows
    wanted = {"rows": args.rows, "shards": args.shards, "seed": 0, "world_rows": world_rows}
    try:
      with open(marker, encoding="utf-8") as f:
        found = json.load(f)
      found = {k: found.get(k, found["rows"] if k == "world_rows" else None) for k in wanted}
    except (OSError, ValueError, KeyError):
      found = None
    if found != wanted:
      print(f"generating {args.rows:,} rows in {args.shards} files ...", file=sys.stderr)
      generate.generate(data_dir, rows=args.rows, shards=args.shards, seed=0, world_rows=world_rows)
    raw_bytes = sum(
      os.path.getsize(os.path.join(data_dir, n))
      for n in os.listdir(data_dir)
      if n.endswith(".parquet")
    )
    prepared = args.keep or os.path.join(tmp, "prepared")
    command = [sys.executable, __file__, "--child", data_dir, prepared]
    if args.hashed:
      command.append("--hashed")
    result = subprocess.run(command, check=True, capture_output=True, text=True)
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    loading = None
    if args.load_steps > 0 and not args.hashed:
      command = [sys.executable, __file__, "--load-child", data_dir, prepared]
      command += [f"--load-steps={args.load_steps}", f"--workers={args.workers}"]
      result = subprocess.run(
        command, check=True, capture_output=True, text=True, start_new_session=True
      )
      loading = json.loads(result.stdout.strip().splitlines()[-1])

  compile_s, load_s = _compile_figures()
  rows = figures["rows"]
  grown = figures["peak_rss"] - figures["baseline_rss"]
  print(f"raw rows              {rows:,} in {args.shards} files, {raw_bytes / rows:.1f} bytes/row")
  if world_rows != rows:
    print(f"world                 as for {world_rows:,} rows (distinct probes and addresses)")
  print(f"probes                {figures['probes']:,}")
  print(
    f"wall time             {figures['seconds']:.2f} s ({rows / figures['seconds']:,.0f} rows/s)"
  )
  print(
    f"CPU time              {figures['cpu_seconds']:.2f} s"
    f" ({rows / figures['cpu_seconds']:,.0f} rows per CPU-second = per core)"
  )
  print(
    f"peak RSS              {figures['peak_rss'] / 2**20:,.0f} MiB"
    f" ({grown / 2**20:,.0f} MiB above the imports: {grown / rows:.1f} bytes/row)"
  )
  print(f"store on disk         {figures['store_bytes'] / rows:.1f} bytes/row")
  print(
    f"numba kernels         compiled in {compile_s:.2f} s (first run on a machine),"
    f" loaded from the cache in {load_s:.2f} s (every later run; inside the times above)"
  )
  if loading:
    print(f"first batch           {loading['first_batch_s']:.2f} s (store opened, workers started)")
    print(
      f"real tokens/s         {loading['tokens_per_s']:,.0f} ({args.load_steps - 1} batches of 8)"
    )
    print(f"main process RSS      {loading['main_rss'] / 2**20:,.0f} MiB")
    for k, (rss, uss, anonymous) in enumerate(loading["workers"]):
      print(
        f"worker {k} RSS / USS / anonymous  {rss / 2**20:,.0f} / {uss / 2**20:,.0f}"
        f" / {anonymous / 2**20:,.0f} MiB"
      )
  return 0


if __name__ == "__main__":
  sys.exit(main())
