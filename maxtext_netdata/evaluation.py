"""Eval loss, and the loss on RTT bytes against a unigram baseline.

The RTT bytes are the two tokens after `RTT_START`. Their loss tells whether the model
learnt latency from the context (the probe's other measurements) rather than the token
format. The baseline is the best unigram model in hindsight: for each of the two byte
slots, the cross-entropy of the eval positions' own empirical token distribution. A model
below it predicts RTTs from context; one at or above it has learnt nothing about latency
(or sees targets that are not shifted right).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from maxtext_netdata import tokens


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


def unigram_loss(counts: np.ndarray) -> float:
  """Mean cross-entropy (nats) of each row's own empirical distribution on its positions."""
  counts = np.asarray(counts, dtype=np.float64)
  totals = counts.sum(axis=1, keepdims=True)
  with np.errstate(divide="ignore", invalid="ignore"):
    log_p = np.where(counts > 0, np.log(counts / totals), 0.0)
  return float(-(counts * log_p).sum() / counts.sum())


def evaluate(
  eval_step: Callable, params: Any, batches: Iterator[dict[str, jax.Array]], num_batches: int
) -> dict[str, float]:
  """eval_loss, eval_rtt_loss and eval_rtt_unigram_loss over up to `num_batches` batches.

  Returns an empty dict when the iterator yields nothing.
  """
  totals = None
  for _, batch in zip(range(num_batches), batches, strict=False):
    sums = eval_step(params, batch)
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  if totals is None:
    return {}
  totals = jax.device_get(totals)
  rtt_count = totals["rtt_target_counts"].sum()
  result = {"eval_loss": float(totals["loss_sum"] / max(totals["tokens"], 1))}
  if rtt_count > 0:
    result["eval_rtt_loss"] = float(totals["rtt_loss_sum"] / rtt_count)
    result["eval_rtt_unigram_loss"] = unigram_loss(totals["rtt_target_counts"])
  return result
