"""The accelerator check's parts on generated data (`bench.accelerator_check`): the store
they read (`make_store`), one layer's attention by each kernel on a real batch's segments
(`attention_on_a_real_batch`), and loading alone, by worker count from bench's report
(`loading_by_workers`) and in-process by read threads (`loading_by_threads`).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from maxtext_netdata.bench import attention_kernels, benchmark, loading
from maxtext_netdata.bench.accelerator_runs import Sizes, fixed_network
from maxtext_netdata.config import Config
from maxtext_netdata.distributed.mesh import make_mesh
from maxtext_netdata.input_pipeline import interface


def make_store(cfg: Config, rows: int, raw_dir: Path, devices: int) -> dict:
  """Generates `rows` measurements into `raw_dir` (`maxtext-netdata generate`, a shard per
  core), prepares `cfg`'s store from them and makes the batch kernel ready.

  On a machine's first run the kernel compiles (10-20 s) on a thread while its Python code
  builds the batches, 200-300x slower (`batch_kernel_loading`): a training run's first seconds
  there. The network runs measure the compiled kernel, as later runs there use it; on an H200
  the runs that started during that compile waited for data 56-78% of their steps.
  """
  from maxtext_netdata.data.prepare import prepare
  from maxtext_netdata.input_pipeline import batch_kernel_loading
  from maxtext_netdata.input_pipeline.sequences import BatchBuilder

  shards = max(2, loading.cpu_cores())
  start = time.perf_counter()
  command = [sys.executable, "-m", "maxtext_netdata", "generate", "--out", str(raw_dir)]
  subprocess.run([*command, "--rows", str(rows), "--shards", str(shards)], check=True)
  generated = time.perf_counter()
  splits = prepare.ensure_prepared(cfg)
  prepared = time.perf_counter()
  BatchBuilder.from_config(cfg, splits.train, cfg.global_batch_size(devices))
  batch_kernel_loading.wait_ready()
  summary = splits.summary
  return {
    "rows": rows,
    "shards": shards,
    "generate_s": generated - start,
    "prepare_s": prepared - generated,
    "batch_kernel_s": time.perf_counter() - prepared,
    "cached": splits.cached,
    "probes": summary["probes"],
    "splits": summary["splits"],
    "prepared_dir": cfg.prepared_dir,
  }


def attention_on_a_real_batch(cfg: Config, sizes: Sizes) -> dict:
  """`attention_kernels.compare` on the segments of the first `network_grain` batch."""
  iterator, _ = fixed_network(cfg, make_mesh(cfg))
  segmentation = np.asarray(next(iterator)["inputs_segmentation"])
  return attention_kernels.compare(cfg, segmentation, kernels=sizes.attention_kernels)


_LOADING_KEYS = (
  "real_tokens_per_s",
  "real_tokens_per_s_per_core",
  "batch_s",
  "first_batch_s",
  "cpu_cores_busy",
)


def loading_by_workers(bench: dict) -> list[dict]:
  """Loading alone per swept `grain_worker_count`, from bench's report."""
  keys = ("workers", *_LOADING_KEYS)
  return [{key: s[key] for key in keys} for s in bench["sweep"] or [bench["loading"]]]


def loading_by_threads(cfg: Config, sizes: Sizes) -> list[dict]:
  """In-process loading alone (`benchmark.measure_loading`, as bench times it) with each
  `grain_num_threads` of `sizes`: on the accelerator's host, the measurement behind the
  loader defaults (docs/performance.md, "Loader defaults")."""
  runs = []
  for threads in sizes.threads:
    run_cfg = cfg.replace(grain_worker_count=0, grain_num_threads=threads)
    device_mesh = make_mesh(run_cfg)
    slots = interface.global_batch_size(run_cfg, device_mesh) * run_cfg.max_target_length
    # Enough batches for the CPU clock (10 ms steps) to measure the per-core figure.
    batches = max(sizes.batches, int(sizes.thread_tokens // slots))
    measured = benchmark.measure_loading(run_cfg, device_mesh, batches)
    runs.append({"threads": threads, **{key: measured[key] for key in _LOADING_KEYS}})
  return runs
