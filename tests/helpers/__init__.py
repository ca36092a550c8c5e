"""Helpers the tests share: generated stores and configs (`pipeline`), worker processes and
signals (`processes`), reference implementations written from docs/spec.md
(`reference_tokenizer`, `reference_batches`), RIPE result shapes (`ripe_results`), MaxText
runs (`maxtext`, `maxtext_hooks`) and the trainer (`train`)."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the repository root: configs/, scripts/, docs/


def killed_runs_leftovers(out) -> None:
  """What a run of `ingest` or `generate` SIGKILLed while writing folder `out` leaves in it:
  its staging folder, holding a file, and its lock file (`data.raw.layout.staged`)."""
  os.makedirs(out / ".staging-killed")
  (out / ".staging-killed" / "pings-00000-of-00001.parquet").write_bytes(b"PAR1")
  (out / ".writing").touch()


def folder_files(folder) -> dict[str, bytes]:
  """Each file of an output folder, name → bytes (a subfolder left in it is an error)."""
  out = {}
  for name in sorted(os.listdir(folder)):
    with open(os.path.join(folder, name), "rb") as f:
      out[name] = f.read()
  return out
