"""Prepared stores and raw parquet for the input-pipeline and prepare tests, by the real writers."""

from __future__ import annotations

import os
import socket

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from maxtext_netdata import config
from maxtext_netdata.data.store import store as store_lib
from maxtext_netdata.format import tokenizer
from maxtext_netdata.format import tokens as tk
from maxtext_netdata.input_pipeline.sequences import INPUT_KEYS, BatchBuilder


def write_store(
  path: str,
  *,
  probes: int = 120,
  mean_rows: int = 300,
  seed: int = 0,
  hashed: bool = True,
  last_second: int | None = None,
) -> store_lib.PreparedStore:
  """A prepared split of `probes` probes (a fifth of them short), mixed IPv4/IPv6, ~10% failed,
  gaps of 0 s to 400 s between a probe's rows (some DELTA4), written with `ProbeRows.write`;
  from 2025-06-15, or, with `last_second`, up to that second (the last row's)."""
  rng = np.random.default_rng(seed)
  counts = rng.integers(1, 2 * mean_rows, probes)
  counts[: probes // 5] = rng.integers(1, 40, probes // 5)
  n = int(counts.sum())
  offsets = np.zeros(probes + 1, np.int64)
  offsets[1:] = np.cumsum(counts)
  version = np.where(rng.random(probes) < 0.58, 4, 6).astype(np.uint8)
  src = rng.integers(0, 256, (probes, 16), dtype=np.uint8)
  src[version == 4, 4:] = 0
  row_version = np.repeat(version, counts)
  dst = rng.integers(0, 256, (n, 16), dtype=np.uint8)
  dst[row_version == 4, 4:] = 0
  gaps = rng.choice([0, 1, 5, 30, 100, 400], size=n, p=[0.2, 0.3, 0.2, 0.15, 0.1, 0.05])
  seconds = (1_750_000_000 + np.cumsum(gaps)).astype(np.int64)
  if last_second is not None:
    seconds += last_second - seconds[-1]
  rtt = rng.lognormal(np.log(50), 1, n).astype(np.float32)
  failed = rng.random(n) < 0.1
  rtt[failed] = -1
  rtt_bytes, _ = tokenizer.rtt_bytes(rtt)
  rows = store_lib.ProbeRows(
    probe_offsets=offsets,
    probe_src=src,
    probe_version=version,
    dst=dst,
    seconds=seconds,
    rtt_bytes=rtt_bytes,
    hashed_order=rng.integers(0, 24, (n, 2), dtype=np.uint8) if hashed else None,
  )
  rows.write(path, {})
  return store_lib.PreparedStore(path)


def builder(store, **overrides) -> BatchBuilder:
  """A batch builder over `store` with the unit tests' data keys (`overrides` win): rows of
  256 tokens, batches of 8, packed and shuffled, every mode, random field orders, one epoch."""
  kwargs = dict(
    seq_len=256,
    global_batch_size=8,
    seed=0,
    packing=True,
    shuffle=True,
    mode_weights=(0.4, 0.3, 0.3),
    field_order="random",
    num_epoch=1,
  )
  kwargs.update(overrides)
  return BatchBuilder(store, **kwargs)


def write_raw_parquet(folder: str, *, rows: int = 6000, probes: int = 40, seed: int = 0) -> str:
  """Raw measurements (docs/spec.md §1) in two time-sorted shards; returns the glob naming them."""
  rng = np.random.default_rng(seed)
  v6 = rng.random(probes) < 0.4
  sources = [
    f"2001:db8::{i + 1:x}" if is6 else f"10.0.{i // 250}.{i % 250 + 1}" for i, is6 in enumerate(v6)
  ]
  probe = rng.integers(0, probes, rows)
  event = np.sort(1_750_000_000 + rng.integers(0, 40_000, rows))
  dst = [
    f"2001:db8:1::{d:x}" if v6[p] else f"192.0.2.{d}"
    for p, d in zip(probe, rng.integers(1, 200, rows), strict=True)
  ]
  rtt = np.where(rng.random(rows) < 0.1, -1.0, rng.lognormal(np.log(50), 1, rows))
  table = pa.table(
    {
      "msm_id": pa.array(rng.integers(1000, 1010, rows), pa.int64()),
      "event_time": pa.array(event.astype("datetime64[s]")),
      "src_addr": pa.array([sources[p] for p in probe]),
      "dst_addr": pa.array(dst),
      "ip_version": pa.array(np.where(v6[probe], 6, 4), pa.int64()),
      "rtt": pa.array(rtt, pa.float64()),
    }
  )
  os.makedirs(folder, exist_ok=True)
  half = rows // 2
  pq.write_table(table.slice(0, half), os.path.join(folder, "part-0.parquet"))
  pq.write_table(table.slice(half), os.path.join(folder, "part-1.parquet"))
  return os.path.join(folder, "*.parquet")


def address(raw: np.ndarray, version: int) -> str:
  """Text of a 16-byte stored address (IPv4 in the first 4 bytes)."""
  family = socket.AF_INET if version == 4 else socket.AF_INET6
  return socket.inet_ntop(family, bytes(raw[: 4 if version == 4 else 16]))


def check_host_batch(store, layout, batch: dict[str, np.ndarray], seq_len: int) -> dict:
  """Asserts that a host batch (`BatchBuilder.build`, before ShiftData) is valid against the
  store it came from.

  Every row: segments 1..k, positions restarting at 0, then only padding (PAD, 0, 0). Every
  segment: decodes (tokenizer.decode) into whole measurements of ONE probe, each equal to its
  store row (`layout.store_row`: source, destination, RTT or failure, timestamp), the rows a
  contiguous run of the probe in one valid mode: full (time order, all timestamped), none (no
  timestamps) or partial (some dropped, the timestamped ones in time order). Returns the
  number of segments in each mode.
  """
  inputs = batch["inputs"]
  seg = batch["inputs_segmentation"]
  pos = batch["inputs_position"]
  assert set(batch) == set(INPUT_KEYS)
  for key in INPUT_KEYS:
    assert batch[key].dtype == np.int32 and batch[key].shape == inputs.shape, key
  probe_of_row = np.repeat(np.arange(store.num_probes), np.diff(store.probe_offsets))
  row_at = dict(zip(layout.position.tolist(), layout.store_row.tolist(), strict=True))
  modes = {"full": 0, "partial": 0, "none": 0}
  for r in range(inputs.shape[0]):
    used = int(np.count_nonzero(seg[r]))
    assert (seg[r, :used] > 0).all() and (seg[r, used:] == 0).all()
    assert (inputs[r, used:] == tk.PAD).all() and (pos[r, used:] == 0).all()
    assert not (inputs[r, :used] == tk.PAD).any()
    bounds = np.flatnonzero(np.diff(seg[r, :used], prepend=0, append=-1)) if used else []
    for s, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
      assert seg[r, a] == s + 1, "segment ids are 1..k in order"
      assert (pos[r, a:b] == np.arange(b - a)).all(), "positions restart at 0"
      measurements = tokenizer.decode(inputs[r, a:b])
      assert measurements and measurements[0]["position"] == 0
      rows = [row_at[r * seq_len + a + m["position"]] for m in measurements]
      probes = set(probe_of_row[rows].tolist())
      assert len(probes) == 1, "one probe per segment"
      probe = probes.pop()
      version = int(store.probe_version[probe])
      stamped = []
      clock = None
      for m, row in zip(measurements, rows, strict=True):
        assert m["src"] == address(store.probe_src[probe], version)
        assert m["dst"] == address(store.dst[row], version)
        assert m["failed"] == bool(store.failed[row])
        if not m["failed"]:
          assert m["rtt_ms"] == tokenizer.rtt_ms_of_bytes(*store.rtt_bytes[row].tolist())
        if m["timestamp"] is not None:
          assert clock is None, "only the first timestamp is absolute"
          clock = m["timestamp"]
        elif m["delta_s"] is not None:
          assert clock is not None, "a delta needs an earlier timestamp"
          clock += m["delta_s"]
        else:
          continue
        assert clock == int(store.seconds[row])
        stamped.append(row)
      assert sorted(rows) == list(range(min(rows), min(rows) + len(rows))), "contiguous run"
      assert stamped == sorted(stamped), "timestamped measurements in time order"
      if len(stamped) == len(rows):
        assert rows == sorted(rows)
        modes["full"] += 1
      elif stamped:
        modes["partial"] += 1
      else:
        modes["none"] += 1
  return modes


def small_run_overrides(root) -> list[str]:
  """Config overrides for a small raw sample written under `root`: 8000 rows of 40 probes,
  128-token sequences, global batches of 4."""
  files = write_raw_parquet(str(root / "raw"), rows=8000, probes=40)
  return [
    f"grain_train_files={files}",
    f"base_output_directory={root}",
    "max_target_length=128",
    "global_batch_size_to_load=4",
  ]


def store_config(prepared_dir, files: list[str], *overrides: str) -> config.Config:
  """The default config with `files` as the raw data and stores prepared under `prepared_dir`."""
  return config.load(
    None,
    [f"grain_train_files={','.join(files)}", f"network_prepared_dir={prepared_dir}", *overrides],
  )


def store_files(root: str) -> dict[str, bytes]:
  """Every file of a store but the top summary (timings), hidden ones and any in deeper
  folders included, by relative path."""
  out = {}
  for folder, _, names in os.walk(root):
    for name in names:
      path = os.path.join(folder, name)
      if path != os.path.join(root, "meta.json"):
        with open(path, "rb") as f:
          out[os.path.relpath(path, root)] = f.read()
  return dict(sorted(out.items()))
