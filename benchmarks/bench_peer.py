"""MaxText's own text pipelines and our network_grain pipeline, side by side, in one run.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_peer.py [--batches 40] [--workers 1]
        [--batch 8] [--length 1024] [--dir DIR] [--json PATH]

Both run through MaxText 0.2.5's `create_data_iterator` (ours through the plugin), with the
same batch (`per_device_batch_size` x `max_target_length`), worker settings and timing as
`bench --maxtext` (`maxtext_bench.measure_loading`: first batch, buffers drained, then
`--batches` timed batches until on the device):

- maxtext_grain_text: MaxText's grain pipeline for a text dataset: parquet shards of generated
  documents (`bench.text_corpus`), SentencePiece (vocab 200, trained here on them) with
  `tokenizer_type=sentencepiece`, packing `first_fit`, ShiftData, `grain_worker_count=--workers`;
- maxtext_arrayrecord: the same documents as ArrayRecord `tf.train.Example` records
  (`grain_file_type=arrayrecord`), the same SentencePiece model, packing and workers;
- maxtext_hf: `dataset_type=hf` reading the parquet shards (`hf_path=parquet`) with a Hugging
  Face BPE tokenizer (vocab 200, `tokenizers`, trained here; `tokenizer_type=huggingface`),
  MaxText's hf packing, `grain_worker_count=min(--workers, 1)` (the most it runs);
- network_grain (ours): on generated ping measurements (`maxtext-netdata generate`), the
  prepared store built first (not timed).

Prints, for each: real (non-padding) tokens/s, per busy core (CPU time of the process and its
workers), first batch and padding share; then ours / each of MaxText's per core. Nothing is
downloaded (the Hugging Face libraries run offline).
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
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from maxtext_netdata.bench import maxtext_bench, text_corpus  # noqa: E402
from maxtext_netdata.maxtext import plugin  # noqa: E402

TEXT = str(ROOT / "configs" / "maxtext" / "bench_text.yml")
SMOKE = str(ROOT / "configs" / "maxtext" / "smoke.yml")
# MaxText's pipelines, in the table's order; network_grain (ours) comes last.
PEERS = ("maxtext_grain_text", "maxtext_arrayrecord", "maxtext_hf")


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
  print("[peer] generating the text corpus, SentencePiece and the Hugging Face tokenizer")
  files, tokenizer = text_corpus.make(work / "text", files=max(4, args.workers))
  records, _ = text_corpus.make_arrayrecord(work / "text", files=max(4, args.workers))
  _, hf_tokenizer = text_corpus.make_hf(work / "text", files=max(4, args.workers))
  spm = [f"tokenizer_path={tokenizer}"]
  configs = {
    "maxtext_grain_text": (TEXT, [f"grain_train_files={files}", *spm]),
    "maxtext_arrayrecord": (
      TEXT,
      ["grain_file_type=arrayrecord", f"grain_train_files={records}", *spm],
    ),
    "maxtext_hf": (
      TEXT,
      [
        "dataset_type=hf",
        "hf_path=parquet",
        f"hf_train_files={files}",
        "tokenizer_type=huggingface",
        f"tokenizer_path={hf_tokenizer}",
        f"grain_worker_count={min(args.workers, maxtext_bench.HF_MAX_WORKERS)}",
      ],
    ),
  }
  raw = work / "raw"
  if not list(raw.glob("*.parquet")):
    print(f"[peer] generating {args.rows:,} ping measurements", flush=True)
    generate(str(raw), rows=args.rows, shards=4, seed=0, progress=False)
  configs["network_grain"] = (
    SMOKE,
    [f"grain_train_files={raw / '*.parquet'}", f"network_prepared_dir={work / 'prepared'}"],
  )
  cfgs = {
    name: maxtext_bench.load_config(path, [*common, *extra])
    for name, (path, extra) in configs.items()
  }
  from maxtext_netdata.data.prepare import prepare

  prepare.ensure_prepared(plugin.network_config(cfgs["network_grain"]), progress=False)
  results = {"cpu_cores": len(os.sched_getaffinity(0))}
  for name, cfg in cfgs.items():
    print(f"[peer] {name}: {args.batches} batches, {cfg.grain_worker_count} workers", flush=True)
    results[name] = maxtext_bench.measure_loading(cfg, args.batches)
  ours = results["network_grain"]
  results["ratio_per_core"] = {
    name: ours["real_tokens_per_s_per_core"] / results[name]["real_tokens_per_s_per_core"]
    for name in PEERS
  }
  results["ratio_wall"] = {
    name: ours["real_tokens_per_s"] / results[name]["real_tokens_per_s"] for name in PEERS
  }
  return results


def print_table(results: dict, args) -> None:
  print(
    f"\n{args.batch} x {args.length} tokens per batch, grain_worker_count={args.workers}"
    f" (maxtext_hf: {min(args.workers, maxtext_bench.HF_MAX_WORKERS)}), {args.batches} timed"
    f" batches, {results['cpu_cores']} cores"
  )
  header = f"{'pipeline':<22}{'real tok/s':>14}{'per core':>14}{'cores':>7}{'first':>10}{'pad':>7}"
  print(header)
  for name in (*PEERS, "network_grain"):
    r = results[name]
    print(
      f"{name:<22}{r['real_tokens_per_s']:>14,.0f}{r['real_tokens_per_s_per_core']:>14,.0f}"
      f"{r['cpu_cores_busy']:>7.2f}{r['first_batch_s']:>9.2f}s{r['padding_share']:>7.1%}"
    )
  for name in PEERS:
    print(
      f"network_grain / {name}: {results['ratio_per_core'][name]:.1f}x real tokens/s per core,"
      f" {results['ratio_wall'][name]:.1f}x wall"
    )


if __name__ == "__main__":
  sys.exit(main())
