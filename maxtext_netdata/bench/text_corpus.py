"""A generated text dataset for MaxText's own pipelines: parquet shards with a `text` column,
the same documents as ArrayRecord shards, a SentencePiece model and a Hugging Face tokenizer
trained on them.

The peer benchmark and the bench tests run MaxText's text pipelines on this machine without
downloads or copied assets: `grain` parquet + SentencePiece (`make`), `grain` ArrayRecord
(`make_arrayrecord`) and `hf` reading the parquet shards with a Hugging Face tokenizer
(`make_hf`). Documents are sentences of a fixed vocabulary with lengths drawn from a
log-normal distribution, so packing has short and long documents to fit, as with web text.
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


def train_hf_tokenizer(
  parquet_files: list[Path], out_dir: str | os.PathLike, vocab_size: int = VOCAB_SIZE
) -> Path:
  """Trains a byte-pair tokenizer (`tokenizers`) on the `text` column of `parquet_files` and
  saves it in the Hugging Face format (`tokenizer.json`, `tokenizer_config.json`) that MaxText
  loads with `tokenizer_type: huggingface` (`transformers.AutoTokenizer.from_pretrained`); the
  folder. `<pad>` is 0, so MaxText pads with it; `<s>` and `</s>` are its BOS and EOS."""
  import transformers
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  texts = pq.read_table(parquet_files[0], columns=["text"]).column("text").to_pylist()
  tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
  tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
  tokenizer.decoder = decoders.Metaspace()
  special = ["<pad>", "<unk>", "<s>", "</s>"]
  tokenizer.train_from_iterator(
    texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False)
  )
  fast = transformers.PreTrainedTokenizerFast(
    tokenizer_object=tokenizer,
    pad_token="<pad>",
    unk_token="<unk>",
    bos_token="<s>",
    eos_token="</s>",
  )
  out_dir = Path(out_dir)
  fast.save_pretrained(str(out_dir))
  return out_dir


def write_text_arrayrecord(parquet_files: list[Path], out_dir: str | os.PathLike) -> list[Path]:
  """The documents of each parquet shard as an ArrayRecord shard: one serialized
  `tf.train.Example` a document with a `text` bytes feature, what MaxText's `grain_file_type:
  arrayrecord` parses (its own `example_pb2`, no TensorFlow); the shard paths."""
  from array_record.python.array_record_module import ArrayRecordWriter
  from maxtext.input_pipeline.protos import example_pb2

  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  paths = []
  for source in parquet_files:
    path = out_dir / (Path(source).stem + ".array_record")
    # group_size:1, as MaxText's docs ask, so a random read decodes one record.
    writer = ArrayRecordWriter(str(path), "group_size:1")
    for text in pq.read_table(source, columns=["text"]).column("text").to_pylist():
      example = example_pb2.Example()
      example.features.feature["text"].bytes_list.value.append(text.encode("utf-8"))
      writer.write(example.SerializeToString())
    writer.close()
    paths.append(path)
  return paths


def make_arrayrecord(
  out_dir: str | os.PathLike, files: int = 4, rows_per_file: int = 2000, seed: int = 0
) -> tuple[str, Path]:
  """`make`'s documents as ArrayRecord shards under `out_dir/arrayrecord` (reused when
  present): (`grain_train_files` glob, SentencePiece model path)."""
  make(out_dir, files, rows_per_file, seed)
  out_dir = Path(out_dir)
  shards = sorted((out_dir / "text").glob("*.parquet"))
  if len(list((out_dir / "arrayrecord").glob("*.array_record"))) != files:
    write_text_arrayrecord(shards, out_dir / "arrayrecord")
  return str(out_dir / "arrayrecord" / "*.array_record"), out_dir / "spm.model"


def make_hf(
  out_dir: str | os.PathLike, files: int = 4, rows_per_file: int = 2000, seed: int = 0
) -> tuple[str, Path]:
  """`make`'s parquet shards and a Hugging Face tokenizer trained on them under
  `out_dir/hf_tokenizer` (reused when present): (`hf_train_files` glob, tokenizer folder)."""
  files_glob, _ = make(out_dir, files, rows_per_file, seed)
  tokenizer = Path(out_dir) / "hf_tokenizer"
  if not (tokenizer / "tokenizer.json").exists():
    train_hf_tokenizer(sorted(Path(out_dir, "text").glob("*.parquet")), tokenizer)
  return files_glob, tokenizer
