"""Helpers the tests share: generated stores and configs (`pipeline`), worker processes and
signals (`processes`), reference implementations written from docs/spec.md
(`reference_tokenizer`, `reference_batches`), RIPE result shapes (`ripe_results`), MaxText
runs (`maxtext`, `maxtext_hooks`) and the trainer (`train`)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the repository root: configs/, scripts/, docs/
