"""Eval loss, and the loss on RTT bytes against a unigram baseline.

The RTT bytes are the two tokens after `RTT_START`. Their loss tells whether the model
learnt latency from the context (the probe's other measurements, the destinations) rather
than the token format. The baseline is a unigram model per byte slot fitted on the training
split's RTTs, scored on the same eval positions as the model: a model below it predicts
RTTs from context; one at or above it has learnt nothing about latency (or sees targets
that are not shifted right).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from maxtext_netdata.format import tokens


def token_losses(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Per-position cross-entropy in nats, float32, [batch, length]."""
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)


def rtt_byte_masks(batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
  """Positions whose target is the first / second RTT byte (and counts for the loss)."""
  inputs = batch["inputs"]
  learned = batch["targets_segmentation"] != 0
  first = (inputs == tokens.RTT_START) & learned
  previous = jnp.pad(inputs[:, :-1], ((0, 0), (1, 0)), constant_values=tokens.PAD)
  second = (previous == tokens.RTT_START) & learned
  return first, second


def make_eval_step(apply_fn: Callable[..., jax.Array], vocab_size: int) -> Callable:
  """`eval_step(params, batch)` → sums over the batch (device arrays, nothing transferred)."""

  def eval_step(params: Any, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    logits = apply_fn(
      {"params": params},
      batch["inputs"],
      batch["inputs_position"],
      batch["inputs_segmentation"],
    )
    losses = token_losses(logits, batch["targets"])
    learned = batch["targets_segmentation"] != 0
    first, second = rtt_byte_masks(batch)
    targets = batch["targets"].ravel()
    return {
      "loss_sum": jnp.sum(losses * learned),
      "tokens": jnp.sum(learned),
      "rtt_loss_sum": jnp.sum(losses * (first | second)),
      "rtt_target_counts": jnp.stack(
        [
          jnp.bincount(targets, weights=mask.ravel().astype(jnp.int32), length=vocab_size)
          for mask in (first, second)
        ]
      ),
    }

  return eval_step


def rtt_unigram_log_probs(train_split: Any, vocab_size: int) -> np.ndarray:
  """Log-probabilities [2, vocab_size] of the first / second RTT byte token in a split.

  `train_split` is a prepared store split (`rtt_bytes` uint8 [N, 2]; 0, 0 when failed).
  Add-one smoothing over the 256 byte tokens keeps unseen bytes finite; other tokens get
  probability 0 (log -inf), which no RTT target has.
  """
  rtt_bytes = np.asarray(train_split.rtt_bytes)
  rtt_bytes = rtt_bytes[rtt_bytes.any(axis=1)]  # a failed ping's payload is 0, 0
  log_probs = np.full((2, vocab_size), -np.inf)
  for slot in range(2):
    counts = np.bincount(rtt_bytes[:, slot], minlength=256) + 1.0
    log_probs[slot, tokens.BYTE_OFFSET : tokens.BYTE_OFFSET + 256] = np.log(counts / counts.sum())
  return log_probs


def evaluate(
  eval_step: Callable,
  params: Any,
  batches: Iterator[dict[str, jax.Array]],
  num_batches: int,
  rtt_log_probs: np.ndarray | None = None,
) -> dict[str, float]:
  """eval_loss and eval_rtt_loss over up to `num_batches` batches (nats per target).

  With `rtt_log_probs` (from `rtt_unigram_log_probs`), also eval_rtt_unigram_loss: the
  baseline's loss on the same RTT positions. Returns an empty dict when `batches` is empty.
  """
  totals = None
  for _, batch in zip(range(num_batches), batches, strict=False):
    sums = eval_step(params, batch)
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  if totals is None:
    return {}
  totals = jax.device_get(totals)
  counts = totals["rtt_target_counts"]
  result = {"eval_loss": float(totals["loss_sum"] / max(totals["tokens"], 1))}
  if counts.sum() > 0:
    result["eval_rtt_loss"] = float(totals["rtt_loss_sum"] / counts.sum())
    if rtt_log_probs is not None:
      seen = counts > 0
      result["eval_rtt_unigram_loss"] = float(
        -(counts[seen] * rtt_log_probs[seen]).sum() / counts.sum()
      )
  return result
