"""MaxText's own grain text pipeline and our network_grain pipeline, side by side, in one run.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_peer.py [--batches 40] [--workers 1]
        [--batch 8] [--length 1024] [--dir DIR] [--json PATH]

Both run through MaxText 0.2.5's `create_data_iterator` (ours through the plugin), with the
same batch (`per_device_batch_size` x `max_target_length`), worker settings and timing as
`bench --maxtext` (`maxtext_bench.measure_loading`: first batch, buffers drained, then
`--batches` timed batches until on the device):

- peer: MaxText's grain pipeline for a text dataset: parquet shards of generated documents
  (`bench.text_corpus`), SentencePiece (vocab 200, trained here on them) with
  `tokenizer_type=sentencepiece`, packing `first_fit`, ShiftData, `grain_worker_count=--workers`;
- ours: `dataset_type=network_grain` on generated ping measurements (`maxtext-netdata
  generate`), the prepared store built first (not timed).

Prints, for each: real (non-padding) tokens/s, per busy core (CPU time of the process and its
workers), first batch and padding share; then ours / peer per core. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from maxtext_netdata.bench import maxtext_bench, text_corpus  # noqa: E402
from maxtext_netdata.maxtext import plugin  # noqa: E402

TEXT = str(ROOT / "configs" / "maxtext" / "bench_text.yml")
SMOKE = str(ROOT / "configs" / "maxtext" / "smoke.yml")


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batches", type=int, default=40)
  parser.add_argument("--workers", type=int, default=1, help="grain_worker_count of both")
  parser.add_argument("--batch", type=int, default=8, help="per_device_batch_size")
  parser.add_argument("--length", type=int, default=1024, help="max_target_length")
  parser.add_argument("--rows", type=int, default=200_000, help="ping rows generated")
  parser.add_argument("--dir", help="data folder, kept and reused (default: a temporary one)")
  parser.add_argument("--json", help="also write the figures here")
  args = parser.parse_args()
  from absl import flags

  flags.FLAGS.mark_as_parsed()  # Grain reads absl flags when it starts workers
  with tempfile.TemporaryDirectory(prefix="bench_peer_") as tmp:
    work = Path(args.dir or tmp)
    results = measure(work, args)
  print_table(results, args)
  if args.json:
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
  return 0


def measure(work: Path, args) -> dict:
  from maxtext_netdata.data.synthetic.generate import generate

  plugin.install()
  common = [
    f"per_device_batch_size={args.batch}",
    f"max_target_length={args.length}",
    f"grain_worker_count={args.workers}",
    "grain_per_worker_buffer_size=2",
    "num_epoch=100",
    "enable_checkpointing=false",
    "eval_interval=-1",
    f"base_output_directory={work / 'runs'}",
  ]
  print("[peer] generating the text corpus and training SentencePiece", flush=True)
  files, tokenizer = text_corpus.make(work / "text", files=max(4, args.workers))
  peer_cfg = maxtext_bench.load_config(
    TEXT, [*common, f"grain_train_files={files}", f"tokenizer_path={tokenizer}"]
  )
  raw = work / "raw"
  if not list(raw.glob("*.parquet")):
    print(f"[peer] generating {args.rows:,} ping measurements", flush=True)
    generate(str(raw), rows=args.rows, shards=4, seed=0, progress=False)
  ours_cfg = maxtext_bench.load_config(
    SMOKE,
    [
      *common,
      f"grain_train_files={raw / '*.parquet'}",
      f"network_prepared_dir={work / 'prepared'}",
    ],
  )
  from maxtext_netdata.data.prepare import prepare

  prepare.ensure_prepared(plugin.network_config(ours_cfg), progress=False)
  results = {"cpu_cores": len(os.sched_getaffinity(0))}
  for name, cfg in (("maxtext_grain_text", peer_cfg), ("network_grain", ours_cfg)):
    print(f"[peer] {name}: {args.batches} batches, {args.workers} workers", flush=True)
    results[name] = maxtext_bench.measure_loading(cfg, args.batches)
  peer, ours = results["maxtext_grain_text"], results["network_grain"]
  results["ratio_per_core"] = (
    ours["real_tokens_per_s_per_core"] / peer["real_tokens_per_s_per_core"]
  )
  results["ratio_wall"] = ours["real_tokens_per_s"] / peer["real_tokens_per_s"]
  return results


def print_table(results: dict, args) -> None:
  print(
    f"\n{args.batch} x {args.length} tokens per batch, grain_worker_count={args.workers},"
    f" {args.batches} timed batches, {results['cpu_cores']} cores"
  )
  header = f"{'pipeline':<22}{'real tok/s':>14}{'per core':>14}{'cores':>7}{'first':>10}{'pad':>7}"
  print(header)
  for name in ("maxtext_grain_text", "network_grain"):
    r = results[name]
    print(
      f"{name:<22}{r['real_tokens_per_s']:>14,.0f}{r['real_tokens_per_s_per_core']:>14,.0f}"
      f"{r['cpu_cores_busy']:>7.2f}{r['first_batch_s']:>9.2f}s{r['padding_share']:>7.1%}"
    )
  print(
    f"network_grain / MaxText grain text: {results['ratio_per_core']:.1f}x real tokens/s per"
    f" core, {results['ratio_wall']:.1f}x wall"
  )


if __name__ == "__main__":
  sys.exit(main())
