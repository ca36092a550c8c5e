"""A generated text dataset for MaxText's own grain pipeline: parquet shards with a `text`
column and a SentencePiece model trained on them.

The peer benchmark and the bench tests run MaxText's text pipeline (parquet + SentencePiece,
`tokenizer_type: sentencepiece`) on this machine without downloads or copied assets. Documents
are sentences of a fixed vocabulary with lengths drawn from a log-normal distribution, so
packing has short and long documents to fit, as with web text.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

_WORDS = (
  "the of and to in is that for it as was with be by on not he this are or his from at which"
  " but have an they you were her she there one all we their been has when who will more no if"
  " out so said what up its about into than them can only other new some could time these two"
  " may then do first any my now such like our over man me even most made after also did many"
  " before must through back years where much your way well down should because each just"
  " network latency probe anchor router packet measurement round trip address region server"
).split()

# SentencePiece's smallest working vocabulary for this text (byte fallback off).
VOCAB_SIZE = 200


def write_text_parquet(
  out_dir: str | os.PathLike,
  files: int = 4,
  rows_per_file: int = 2000,
  seed: int = 0,
  mean_words: float = 60.0,
) -> list[Path]:
  """Writes `files` parquet shards of `rows_per_file` documents (`text` column); their paths."""
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  rng = np.random.default_rng(seed)
  words = np.array(_WORDS)
  paths = []
  for index in range(files):
    lengths = np.clip(rng.lognormal(np.log(mean_words), 0.8, rows_per_file), 3, 2000).astype(int)
    texts = []
    for length in lengths:
      chosen = words[rng.integers(0, len(words), length)]
      sentences = np.array_split(chosen, max(1, length // 12))
      texts.append(" ".join(" ".join(s).capitalize() + "." for s in sentences if len(s)))
    path = out_dir / f"text-{index:05d}-of-{files:05d}.parquet"
    pq.write_table(pa.table({"text": texts}), path)
    paths.append(path)
  return paths


def train_sentencepiece(
  parquet_files: list[Path], model_prefix: str | os.PathLike, vocab_size: int = VOCAB_SIZE
) -> Path:
  """Trains a SentencePiece model on the `text` column of `parquet_files`; the `.model` path."""
  import sentencepiece

  texts = pq.read_table(parquet_files[0], columns=["text"]).column("text").to_pylist()
  model_prefix = Path(model_prefix)
  model_prefix.parent.mkdir(parents=True, exist_ok=True)
  sentencepiece.SentencePieceTrainer.train(
    sentence_iterator=iter(texts),
    model_prefix=str(model_prefix),
    vocab_size=vocab_size,
    model_type="unigram",
    pad_id=0,
    unk_id=1,
    bos_id=2,
    eos_id=3,
    input_sentence_size=len(texts),
    minloglevel=2,
  )
  return model_prefix.with_suffix(".model")


def make(
  out_dir: str | os.PathLike, files: int = 4, rows_per_file: int = 2000, seed: int = 0
) -> tuple[str, Path]:
  """The text shards and their SentencePiece model under `out_dir` (reused when present):
  (`grain_train_files` glob, tokenizer path)."""
  out_dir = Path(out_dir)
  tokenizer = out_dir / "spm.model"
  shards = sorted((out_dir / "text").glob("*.parquet"))
  if len(shards) != files or not tokenizer.exists():
    shards = write_text_parquet(out_dir / "text", files, rows_per_file, seed)
    tokenizer = train_sentencepiece(shards, out_dir / "spm")
  return str(out_dir / "text" / "*.parquet"), tokenizer
