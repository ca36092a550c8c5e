"""`maxtext-netdata predict` (trainer/predict.py): a trained checkpoint asked for a probe's
next pings, through the real command, against the store's rows and the model run by hand."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from maxtext_netdata import config as config_lib
from maxtext_netdata.data.store import store as store_lib
from maxtext_netdata.distributed.mesh import make_mesh
from maxtext_netdata.format import tokenizer
from maxtext_netdata.format import tokens as tk
from maxtext_netdata.trainer import checkpointing, model, predict
from maxtext_netdata.trainer.train import Trainer
from tests.helpers import REPO, processes

STEPS = 8


@pytest.fixture(scope="module")
def run(sample_dir, tmp_path_factory):
  """(overrides, train split) of a tiny model trained STEPS steps with one checkpoint."""
  out = tmp_path_factory.mktemp("predict") / "runs"
  overrides = processes.train_overrides(sample_dir, out, "asked", STEPS, 0)
  overrides = [o for o in overrides if not o.startswith("checkpoint_period=")]
  overrides.append(f"checkpoint_period={STEPS}")
  _cli("train", overrides, check=True)
  split = store_lib.PreparedStore(next(str(p) for p in (out.parent / "prepared").glob("*/train")))
  return overrides, split


def _cli(command: str, args: list[str], check: bool = False) -> subprocess.CompletedProcess:
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
  result = subprocess.run(
    [sys.executable, "-m", "maxtext_netdata", command, "configs/smoke.yml", *args],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  if check:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
  return result


def _address(raw: np.ndarray, version: int) -> str:
  return str(ipaddress.ip_address(bytes(raw[: 4 if version == 4 else 16])))


def _busiest_probe(split) -> int:
  return int(np.argmax(np.diff(np.asarray(split.probe_offsets))))


def test_the_context_is_the_probes_latest_rows_that_fit(run):
  """Decoded by the format's own decoder, the context is the probe's last store rows in time
  order, the first with its absolute time, within the budget; the query is src and dst."""
  _, split = run
  probe = _busiest_probe(split)
  for budget in (100, 400):
    context, rows = predict.context_tokens(split, probe, budget, None)
    assert len(context) <= budget and rows.stop == split.probe_rows(probe).stop
    measurements = tokenizer.decode(context.tolist())
    assert len(measurements) == rows.stop - rows.start >= 2
    version = int(split.probe_version[probe])
    for k, m in enumerate(measurements):
      row = rows.start + k
      assert m["src"] == _address(split.probe_src[probe], version)
      assert m["dst"] == _address(split.dst[row], version)
      assert m["failed"] == bool(split.failed[row])
    assert measurements[0]["timestamp"] == int(split.seconds[rows.start])
    # One more row would not have fitted.
    longer, _ = predict._encode(split, probe, slice(rows.start - 1, rows.stop))
    assert len(longer) > budget
  assert len(predict.context_tokens(split, probe, 400, 3)[0]) < 400  # --context-rows 3
  _, limited = predict.context_tokens(split, probe, 400, 3)
  assert limited.stop - limited.start == 3


def test_predictions_are_the_models_own_probabilities(run):
  """The command's figures against the model run by hand on each unpadded sequence: the
  result tag's distribution, and the low byte's after a high byte, for every destination."""
  overrides, split = run
  probe = _busiest_probe(split)
  version = int(split.probe_version[probe])
  rows = split.probe_rows(probe)
  src = _address(split.probe_src[probe], version)
  dsts = list(
    dict.fromkeys(_address(split.dst[r], version) for r in range(rows.stop - 40, rows.stop))
  )[:3]
  result = _cli(
    "predict",
    [*overrides, "--src", src, *sum((["--dst", d] for d in dsts), []), "--json", "--top-k", "4"],
    check=True,
  )
  lines = result.stdout.strip().splitlines()
  assert lines[0].startswith("predict: checkpoint ") and f"/checkpoints/{STEPS};" in lines[0]
  records = [json.loads(line) for line in lines[1:]]
  assert [r["dst"] for r in records] == dsts

  config = config_lib.load(str(REPO / "configs/smoke.yml"), overrides)
  trainer = Trainer(config, make_mesh(config))
  checkpoint = str(checkpointing.checkpoint_dir(config) / str(STEPS))
  params = checkpointing.load_params(checkpoint, trainer.abstract_state())
  network = model.Transformer(config)

  def probabilities(sequence: list[int]) -> np.ndarray:
    """The model's next-token distribution after `sequence`, one unpadded row."""
    x = np.asarray([sequence], np.int32)
    positions = np.arange(len(sequence), dtype=np.int32)[None]
    logits = network.apply({"params": params}, x, positions, np.ones_like(positions))
    return np.asarray(jax.nn.softmax(np.asarray(logits[0, -1], np.float64)))

  query_length = len(predict.query_tokens(np.zeros(16, np.uint8), np.zeros(16, np.uint8), version))
  context, _ = predict.context_tokens(
    split, probe, config.max_target_length - query_length - 2, None
  )
  prefixes = []
  for dst in dsts:
    _, raw = predict.parse_address(dst, "--dst")
    query = predict.query_tokens(np.asarray(split.probe_src[probe]), raw, version)
    prefixes.append([*context.tolist(), *query.tolist()])

  def padded(x):  # the command's batch: [destinations x k, length + 2], padded
    positions = np.broadcast_to(np.arange(x.shape[1], dtype=np.int32), x.shape)
    return network.apply({"params": params}, x, positions, np.ones_like(positions))

  failed, other, top, high_top, low = predict.distributions(padded, np.asarray(prefixes), 4)
  for i, (prefix, record) in enumerate(zip(prefixes, records, strict=True)):
    tag = probabilities(prefix)
    assert record["failed"] == pytest.approx(tag[tk.FAILED], abs=1e-6)
    assert record["failed"] == pytest.approx(failed[i], abs=1e-6)  # jitted there, not here
    assert record["other"] == pytest.approx(1 - tag[tk.FAILED] - tag[tk.RTT_START], abs=1e-6)
    high = probabilities([*prefix, tk.RTT_START])[tk.BYTE_OFFSET : tk.BYTE_OFFSET + 256]
    high = high / high.sum()
    np.testing.assert_array_equal(top[i], np.argsort(-high, kind="stable")[:4])
    np.testing.assert_allclose(high_top[i], high[top[i]], rtol=0, atol=1e-7)
    assert record["covered"] == pytest.approx(high[top[i]].sum(), abs=1e-6)
    for j, h in enumerate(top[i]):
      after = probabilities([*prefix, tk.RTT_START, tk.BYTE_OFFSET + int(h)])
      after = after[tk.BYTE_OFFSET : tk.BYTE_OFFSET + 256]
      np.testing.assert_allclose(low[i, j], after / after.sum(), rtol=0, atol=1e-7)
    # The RTTs: each payload's value, P(high) P(low | high) renormalized, in value order.
    summary = predict.summarize(dsts[i], failed[i], other[i], top[i], high_top[i], low[i])
    values = np.asarray([tokenizer.rtt_ms_of_bytes(int(h), b) for h in top[i] for b in range(256)])
    weights = (high_top[i][:, None] * low[i]).reshape(-1)
    order = np.argsort(values, kind="stable")
    np.testing.assert_array_equal(summary.values_ms, values[order])
    np.testing.assert_allclose(summary.probability, weights[order] / weights.sum(), atol=1e-12)
    assert record["mean_ms"] == pytest.approx(float(values @ (weights / weights.sum())), rel=1e-5)
    cumulative = np.cumsum(weights[order] / weights.sum())
    assert summary.median_ms == values[order][np.searchsorted(cumulative, 0.5)]
    assert summary.p90_ms == values[order][np.searchsorted(cumulative, 0.9)]
    # The command's (jitted: float32 sums in another order) within one payload step or two.
    assert record["median_ms"] == pytest.approx(summary.median_ms, rel=0.01)
    assert record["p10_ms"] <= record["median_ms"] <= record["p90_ms"]
  # The destinations are told apart by the model: a row given another's prefix shows above.
  assert np.abs(low[0] - low[1]).max() > 1e-5


def test_bad_requests_are_one_line_errors(run, tmp_path):
  overrides, split = run
  v4 = next(p for p in range(len(split.probe_version)) if split.probe_version[p] == 4)
  src = _address(split.probe_src[v4], 4)
  cases = [
    ([], ["--src", "192.0.2.250", "--dst", "8.8.8.8"], "no such probe in"),
    ([], ["--src", src, "--dst", "2001:db8::1"], "is IPv4"),
    ([], ["--src", "not-an-address", "--dst", "8.8.8.8"], "not an IPv4 or IPv6 address"),
    (["run_name=never_trained"], ["--src", src, "--dst", "8.8.8.8"], "train this config first"),
    (
      [],
      ["--src", src, "--dst", "8.8.8.8", "--checkpoint", str(tmp_path)],
      f"--checkpoint {tmp_path}: not a checkpoint",
    ),
  ]
  for more, options, message in cases:
    result = _cli("predict", [*overrides, *more, *options])
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
