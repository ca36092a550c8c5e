"""`maxtext-netdata predict CONFIG [key=value ...] --src ADDR --dst ADDR [--dst ADDR ...]`:
what a trained model expects of a ping not yet made.

The context is the probe's latest measurements in the prepared store's train split (those
that fit in `max_target_length` with the query, at most `--context-rows`), tokenized as one
sequence of the pipeline (docs/spec.md §2): the fixed field order, every measurement
timestamped (the first absolutely, then deltas). The query is one more measurement of the
probe, its source and destination blocks; the model's next tokens then say whether the ping
fails (`FAILED`) or not (`RTT_START`), and its RTT payload: the high byte's distribution, then
the low byte's after each of the `--top-k` likeliest high bytes. From these: the probability
of a failure and the RTT's median, mean and 10th / 90th percentiles over the outcomes that do
not fail, with the share of the high byte's probability the top k cover.

All queries go through the model as one batch of one shape, [destinations x top_k, length]:
the first pass reads the result tag's and the high byte's distributions at two positions of
each row (causal attention: a position sees nothing after it), the second the low byte's.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import os

import numpy as np

from maxtext_netdata import config as config_lib
from maxtext_netdata.data.store import dst_table, store
from maxtext_netdata.errors import UserError
from maxtext_netdata.format import tokenizer
from maxtext_netdata.format import tokens as tk

_ABSOLUTE_EXTRA = tk.TS_BLOCK_LENGTH[tk.TS_ABS] - tk.TS_BLOCK_LENGTH[tk.TS_DELTA1]


@dataclasses.dataclass(frozen=True)
class Prediction:
  """The model's expectation of one ping from the probe to `dst`."""

  dst: str
  failed: float  # P(FAILED) as the result's tag
  other: float  # P(any token but FAILED or RTT_START) there: a model that learnt the format puts ~0
  covered: float  # the share of the high byte's probability in the top k high bytes
  median_ms: float
  mean_ms: float
  p10_ms: float
  p90_ms: float
  values_ms: np.ndarray  # float64 [k * 256] RTTs the payloads stand for, ascending
  probability: np.ndarray  # float64 [k * 256] their probabilities given no failure (sum 1)


def parse_address(text: str, flag: str) -> tuple[int, np.ndarray]:
  """(IP version, uint8 [16] address bytes, IPv4 in the first 4) of `text`."""
  try:
    address = ipaddress.ip_address(text.strip())
  except ValueError:
    raise UserError(f"{flag} {text!r}: not an IPv4 or IPv6 address") from None
  raw = np.zeros(16, np.uint8)
  packed = np.frombuffer(address.packed, np.uint8)
  raw[: len(packed)] = packed
  return address.version, raw


def find_probe(split, version: int, src: np.ndarray, text: str) -> int:
  """The store's probe number of (`version`, `src`); a UserError naming the store if absent."""
  versions = np.asarray(split.probe_version)
  sources = np.asarray(split.probe_src)
  hits = np.flatnonzero((versions == version) & (sources == src).all(axis=1))
  if not len(hits):
    raise UserError(
      f"--src {text}: no such probe in {split.path} ({len(versions):,} probes); the probes are"
      " the source addresses of the training data"
    )
  return int(hits[0])


def context_tokens(
  split, probe: int, budget: int, max_rows: int | None
) -> tuple[np.ndarray, slice]:
  """The tokens of probe `probe`'s latest measurements that fit in `budget` tokens (at most
  `max_rows` of them), as one sequence: (int32 tokens, the store rows they hold)."""
  rows = split.probe_rows(probe)
  start = rows.start if max_rows is None else max(rows.start, rows.stop - max_rows)
  encoded, offsets = _encode(split, probe, slice(start, rows.stop))
  # The first row kept gets the absolute timestamp: room for its longer block too.
  fits = offsets[-1] - offsets[:-1] + _ABSOLUTE_EXTRA <= budget
  first = int(np.argmax(fits)) if fits.any() else len(offsets) - 1
  if first:
    start += first
    encoded, offsets = _encode(split, probe, slice(start, rows.stop))
  return encoded, slice(start, rows.stop)


def _encode(split, probe: int, rows: slice) -> tuple[np.ndarray, np.ndarray]:
  n = rows.stop - rows.start
  seconds = np.asarray(split.seconds[rows])
  starts = np.zeros(n, bool)
  starts[:1] = True
  ts_kind, ts_value = tokenizer.timestamp_kinds(seconds, np.ones(n, bool), starts)
  rtt_bytes = np.asarray(split.rtt_bytes[rows])
  return tokenizer.encode(
    src=np.repeat(np.asarray(split.probe_src[probe])[None], n, axis=0),
    dst=dst_table.decode(split.dst_table, split.dst_index[rows]),
    version=np.full(n, split.probe_version[probe], np.uint8),
    rtt_bytes=rtt_bytes,
    failed=store.failed_of(rtt_bytes),
    ts_kind=ts_kind,
    ts_value=ts_value,
    order=np.zeros(n, np.uint8),
  )


def query_tokens(src: np.ndarray, dst: np.ndarray, version: int) -> np.ndarray:
  """MEASUREMENT_START and the source and destination blocks of a measurement (fixed order)."""
  encoded, _ = tokenizer.encode(
    src=src[None],
    dst=dst[None],
    version=np.array([version], np.uint8),
    rtt_bytes=np.zeros((1, 2), np.uint8),
    failed=np.array([True]),
    ts_kind=np.array([tk.TS_NONE], np.uint8),
    ts_value=np.zeros(1, np.int64),
    order=np.zeros(1, np.uint8),
  )
  return encoded[:-1]  # all but the result block: the FAILED tag


def distributions(logits_fn, prefixes: np.ndarray, top_k: int) -> tuple[np.ndarray, ...]:
  """For each prefix [Q, L] (context and query): (P(FAILED) [Q], P(other tags) [Q], high
  bytes [Q, k] of the top k, their probabilities given RTT_START [Q, k], low-byte
  probabilities given each [Q, k, 256]). `logits_fn(tokens [B, T])` → float logits [B, T, V]."""
  q, length = prefixes.shape
  rows = np.full((q * top_k, length + 2), tk.PAD, np.int32)
  rows[:, :length] = np.repeat(prefixes, top_k, axis=0)
  rows[:, length] = tk.RTT_START
  first = _softmax(logits_fn(rows[::top_k]))  # [Q, L + 2, V]; the last column unread
  tag = first[:, length - 1]
  high = first[:, length, tk.BYTE_OFFSET : tk.BYTE_OFFSET + 256]
  high = high / high.sum(axis=1, keepdims=True)
  top = np.argsort(-high, axis=1, kind="stable")[:, :top_k]
  rows[:, length + 1] = tk.BYTE_OFFSET + top.reshape(-1)
  second = _softmax(logits_fn(rows))[:, length + 1, tk.BYTE_OFFSET : tk.BYTE_OFFSET + 256]
  low = (second / second.sum(axis=1, keepdims=True)).reshape(q, top_k, 256)
  failed = tag[:, tk.FAILED]
  other = 1.0 - failed - tag[:, tk.RTT_START]
  return failed, other, top, np.take_along_axis(high, top, axis=1), low


def _softmax(logits) -> np.ndarray:
  logits = np.asarray(logits, np.float64)
  e = np.exp(logits - logits.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)


def summarize(dst: str, failed, other, top, high, low) -> Prediction:
  """One destination's `Prediction` from its row of `distributions`."""
  h = np.repeat(top.astype(np.int64), 256)
  lo = np.tile(np.arange(256), len(top))
  values = ((h & 7) << 8 | lo) * 2.0 ** (h >> 3) / 1000  # tokenizer.rtt_ms_of_bytes
  probability = (high[:, None] * low).reshape(-1)
  covered = float(high.sum())
  order = np.argsort(values, kind="stable")
  values, probability = values[order], probability[order] / probability.sum()
  cumulative = np.cumsum(probability)

  def quantile(q: float) -> float:
    return float(values[min(np.searchsorted(cumulative, q), len(values) - 1)])

  return Prediction(
    dst=dst,
    failed=float(failed),
    other=float(other),
    covered=covered,
    median_ms=quantile(0.5),
    mean_ms=float(values @ probability),
    p10_ms=quantile(0.1),
    p90_ms=quantile(0.9),
    values_ms=values,
    probability=probability,
  )


def latest_checkpoint(config) -> str:
  """The run's latest checkpoint folder, or `load_parameters_path`; a UserError if neither."""
  from maxtext_netdata.trainer import checkpointing  # noqa: PLC0415 (imports orbax)

  directory = checkpointing.checkpoint_dir(config)
  steps = [int(n) for n in os.listdir(directory) if n.isdigit()] if directory.is_dir() else []
  if steps:
    return str(directory / str(max(steps)))
  if config.load_parameters_path:
    return config.load_parameters_path
  raise UserError(
    f"no checkpoint in {directory} and no load_parameters_path: train this config first"
    " (maxtext-netdata train CONFIG ...) or name one with --checkpoint"
  )


def run(args: argparse.Namespace) -> int:
  import jax  # noqa: PLC0415 (keeps `--help` fast)

  from maxtext_netdata.data.prepare import prepare  # noqa: PLC0415
  from maxtext_netdata.distributed.mesh import make_mesh  # noqa: PLC0415
  from maxtext_netdata.trainer import checkpointing, model  # noqa: PLC0415
  from maxtext_netdata.trainer.train import Trainer  # noqa: PLC0415

  if args.top_k < 1 or args.top_k > 256:
    raise UserError(f"--top-k {args.top_k} must be within 1..256")
  if args.context_rows is not None and args.context_rows < 0:
    raise UserError(f"--context-rows {args.context_rows} must be >= 0")
  config = config_lib.load(args.config, args.overrides)
  if config.dataset_type != "network_grain":
    raise UserError(f"predict reads a network_grain store, not dataset_type={config.dataset_type}")
  version, src = parse_address(args.src, "--src")
  destinations = [parse_address(text, "--dst") for text in args.dst]
  for text, (dst_version, _) in zip(args.dst, destinations, strict=True):
    if dst_version != version:
      raise UserError(
        f"--dst {text}: IPv{dst_version}, but the probe --src {args.src} is IPv{version}"
      )
  checkpoint = args.checkpoint or latest_checkpoint(config)
  split = prepare.ensure_prepared(config).train
  probe = find_probe(split, version, src, args.src)
  query = [query_tokens(src, dst, version) for _, dst in destinations]
  budget = config.max_target_length - len(query[0]) - 2
  if budget < 0:
    raise UserError(f"max_target_length={config.max_target_length} cannot hold one query")
  context, rows = (
    (np.zeros(0, np.int32), slice(0, 0))
    if args.context_rows == 0
    else context_tokens(split, probe, budget, args.context_rows)
  )
  prefixes = np.stack([np.concatenate([context, q]) for q in query]).astype(np.int32)

  mesh = make_mesh(config)
  trainer = Trainer(config, mesh)
  option = "--checkpoint " if args.checkpoint else ""
  if not args.checkpoint and checkpoint == config.load_parameters_path:
    option = "load_parameters_path="
  params = checkpointing.load_params(checkpoint, trainer.abstract_state(), option)
  network = model.Transformer(config)

  @jax.jit
  def logits(params, inputs):
    positions = np.broadcast_to(np.arange(inputs.shape[1], dtype=np.int32), inputs.shape)
    return network.apply({"params": params}, inputs, positions, np.ones_like(positions))

  found = distributions(lambda x: logits(params, x), prefixes, args.top_k)
  seconds = np.asarray(split.seconds[rows])
  span = (
    f"{len(seconds)} measurements, {_utc(seconds[0])} to {_utc(seconds[-1])}"
    if len(seconds)
    else "no measurements"
  )
  print(f"predict: checkpoint {checkpoint}; probe {args.src}, context {span}", flush=True)
  for i, text in enumerate(args.dst):
    p = summarize(text, *(a[i] for a in found))
    if args.json:
      record = {k: v for k, v in dataclasses.asdict(p).items() if not isinstance(v, np.ndarray)}
      print(json.dumps(record), flush=True)
    else:
      print(
        f"{text:<40} failed {p.failed:6.1%}  rtt median {p.median_ms:.3f} ms, mean"
        f" {p.mean_ms:.3f}, p10 {p.p10_ms:.3f}, p90 {p.p90_ms:.3f}"
        f" (top {args.top_k} high bytes: {p.covered:.1%} of their probability)",
        flush=True,
      )
  return 0


def _utc(second) -> str:
  return str(np.datetime64(int(second), "s")).replace("T", " ") + " UTC"
