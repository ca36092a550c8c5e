"""RTT-byte positions, the train-split unigram baseline and the eval sums."""

import math
import types

import jax.numpy as jnp
import numpy as np
import pytest

from maxtext_netdata.format import tokens
from maxtext_netdata.trainer import evaluation
from tests.helpers.train import shift_data

B = tokens.BYTE_OFFSET


def _batch():
  # Two packed measurements (fixed field order, IPv4, no timestamp), then padding.
  one = [0, 1, B + 10, B + 0, B + 0, B + 1, 3, B + 8, B + 8, B + 8, B + 8, 8, B + 57, B + 37]
  two = [0, 1, B + 10, B + 0, B + 0, B + 1, 3, B + 1, B + 1, B + 1, B + 1, 8, B + 74, B + 177]
  inputs = np.array([one + two + [tokens.PAD] * 4], np.int32)
  segmentation = np.array([[1] * 14 + [2] * 14 + [0] * 4], np.int32)
  positions = np.array([list(range(14)) * 2 + [0] * 4], np.int32)
  return {k: jnp.asarray(v) for k, v in shift_data(inputs, segmentation, positions).items()}


def test_rtt_byte_masks_select_the_two_targets_after_rtt_start():
  batch = _batch()
  first, second = evaluation.rtt_byte_masks(batch)
  targets = np.asarray(batch["targets"])
  assert targets[np.asarray(first)].tolist() == [B + 57, B + 74]
  assert targets[np.asarray(second)].tolist() == [B + 37, B + 177]


def test_unigram_log_probs_count_successful_rtts_of_the_train_split():
  split = types.SimpleNamespace(
    rtt_bytes=np.array([[5, 1], [5, 2], [7, 1], [0, 0]], np.uint8),  # the last one failed
  )
  log_probs = evaluation.rtt_unigram_log_probs(split, tokens.VOCAB_SIZE)
  probs = np.exp(log_probs)
  np.testing.assert_allclose(probs.sum(axis=1), 1.0)
  assert probs[0, B + 5] == pytest.approx(3 / 259)  # two rows + one smoothing count
  assert probs[0, B + 0] == pytest.approx(1 / 259)  # the failed row is not counted
  assert probs[1, B + 1] == pytest.approx(3 / 259)
  assert np.all(probs[:, : tokens.BYTE_OFFSET] == 0)


def test_evaluate_sums_losses_over_batches():
  def uniform_model(variables, inputs, positions, segmentation):
    return jnp.zeros((*inputs.shape, tokens.VOCAB_SIZE))

  eval_step = evaluation.make_eval_step(uniform_model, tokens.VOCAB_SIZE)
  log_probs = np.full((2, tokens.VOCAB_SIZE), -np.inf)
  log_probs[0, B + 57] = log_probs[0, B + 74] = math.log(0.5)
  log_probs[1, B + 37] = math.log(0.25)
  log_probs[1, B + 177] = math.log(0.75)

  result = evaluation.evaluate(eval_step, {}, iter([_batch(), _batch(), _batch()]), 2, log_probs)
  uniform = math.log(tokens.VOCAB_SIZE)
  assert result["eval_loss"] == pytest.approx(uniform)
  assert result["eval_rtt_loss"] == pytest.approx(uniform)
  expected = -(2 * math.log(0.5) + math.log(0.25) + math.log(0.75)) / 4
  assert result["eval_rtt_unigram_loss"] == pytest.approx(expected)
  assert evaluation.evaluate(eval_step, {}, iter([]), 2) == {}
