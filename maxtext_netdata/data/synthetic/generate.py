"""Realistic raw ping parquet (docs/spec.md §1) for tests, demos and benchmarks.

A small world that a model can learn from: probes and destinations sit near real cities;
each belongs to an AS with an IPv4 /16 and an IPv6 /32 from its region's registry, so the
address says where the host is. RTT follows the great-circle distance (fibre at ~200 km/ms
plus per-path inflation, access latency, jitter and heavy-tailed queueing, rarely a huge
value up to 300 s). Each probe pings many destinations, one stream every 60-300 s, ~58/42
IPv4/IPv6, ~10% failed. Files are time-sorted like real dumps: shard k holds the k-th time
range, so a long-lived probe appears in every shard.

Everything is vectorized numpy, seeded by `seed` alone (each shard draws from its own
generator), and each file is written atomically; `.complete` is written last. A run that
fails (a full disk) removes the files it wrote; a failed write raises OSError naming the file.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import tqdm

from maxtext_netdata.data.raw.layout import (
  FAILED_RTT,
  FILE_PATTERN,
  publish,
  staged,
)
from maxtext_netdata.errors import UserError, WritesTo

START_SECONDS = 1_751_328_000  # 2025-07-01T00:00:00Z
SPAN_SECONDS = 6 * 3600
INTERVALS = np.array([60, 120, 180, 240, 300])
# generate's own row groups: as long as prepare's batches (`raw_reader.BATCH_ROWS`), each
# address column wholly dictionary-encoded. A large world's short row groups held nearly as
# many distinct addresses as rows (~1.5 dictionary entries a row over both columns at 32k
# rows, against ~0.7 at 256k), which prepare decodes and parses entry by entry; a row
# group's dictionary (at most ~43 bytes an entry) stays under the page limit, so parquet
# never falls back to plain pages. Changes the files' bytes, not their content.
WRITE_ROW_GROUP_ROWS = 1 << 18
DICTIONARY_PAGE_BYTES = 16 << 20
PIECE_ROWS = 2_000_000  # rows generated at once (memory ~100 bytes a row)
FORMATS = ("parquet", "ripe-json")

# Regions: latitude, longitude, share of hosts, registry (index into _V4_FIRST_OCTETS/_V6_BASE).
_REGIONS = np.array(
  [
    (50.1, 8.7, 0.13, 0),  # Frankfurt
    (52.4, 4.9, 0.10, 0),  # Amsterdam
    (51.5, -0.1, 0.09, 0),  # London
    (48.9, 2.4, 0.07, 0),  # Paris
    (59.3, 18.1, 0.04, 0),  # Stockholm
    (55.8, 37.6, 0.05, 0),  # Moscow
    (40.7, -74.0, 0.09, 1),  # New York
    (41.9, -87.6, 0.05, 1),  # Chicago
    (37.8, -122.4, 0.06, 1),  # San Francisco
    (-23.5, -46.6, 0.04, 2),  # Sao Paulo
    (-26.2, 28.0, 0.03, 3),  # Johannesburg
    (19.1, 72.9, 0.04, 4),  # Mumbai
    (1.35, 103.8, 0.05, 4),  # Singapore
    (35.7, 139.7, 0.06, 4),  # Tokyo
    (-33.9, 151.2, 0.04, 4),  # Sydney
  ]
)
_V4_FIRST_OCTETS = [
  [62, *range(77, 96), 176, 178, 185, 188, 193, 194, 195, 212, 213, 217],  # RIPE NCC
  [23, 24, 50, *range(63, 77), 96, 97, 98, 99, 104, 107, 108, 162, 173, *range(204, 210)],  # ARIN
  [177, 179, 186, 187, 189, 190, 191, 200, 201],  # LACNIC
  [41, 102, 105, 154, 196, 197],  # AFRINIC
  [1, 14, 27, 36, 39, 42, 43, 49, *range(58, 62), 101, 103, *range(110, 127), 175, 180, 202],
]
_V6_BASE = [0x2A00, 0x2600, 0x2800, 0x2C00, 0x2400]  # first 16 bits; a /12 per registry


def _great_circle_km(lat1, lon1, lat2, lon2):
  lat1, lon1, lat2, lon2 = (np.radians(x) for x in (lat1, lon1, lat2, lon2))
  h = np.sin((lat2 - lat1) / 2) ** 2 + np.cos(lat1) * np.cos(lat2) * np.sin((lon2 - lon1) / 2) ** 2
  return 2 * 6371.0 * np.arcsin(np.sqrt(np.clip(h, 0, 1)))


def _address_texts(raw: np.ndarray, family: int) -> list[str]:
  """Text of each row of address bytes (per host, never per measurement)."""
  return [socket.inet_ntop(family, row.tobytes()) for row in raw]


class _World:
  """Hosts, their places and addresses, and the ping streams between them."""

  def __init__(self, rows: int, rng: np.random.Generator):
    self.n_probes = max(20, rows // 4000)
    self.n_dsts = max(60, 3 * self.n_probes)
    n_hosts = self.n_probes + self.n_dsts
    n_as = max(8, n_hosts // 6)
    as_region = rng.choice(len(_REGIONS), n_as, p=_REGIONS[:, 2] / _REGIONS[:, 2].sum())
    registry = _REGIONS[as_region, 3].astype(int)
    as_v4 = np.empty((n_as, 2), np.uint8)
    as_v4[:, 0] = [rng.choice(_V4_FIRST_OCTETS[r]) for r in registry]
    as_v4[:, 1] = rng.integers(0, 256, n_as)
    as_v6 = np.empty((n_as, 2), np.uint16)
    as_v6[:, 0] = np.array(_V6_BASE)[registry] + rng.integers(0, 16, n_as)
    as_v6[:, 1] = rng.integers(0, 2**16, n_as)

    host_as = rng.integers(0, n_as, n_hosts)
    region = as_region[host_as]
    self.lat = _REGIONS[region, 0] + rng.normal(0, 2.5, n_hosts)
    self.lon = _REGIONS[region, 1] + rng.normal(0, 3.5, n_hosts)
    v4 = np.zeros((n_hosts, 4), np.uint8)
    v4[:, :2] = as_v4[host_as]
    v4[:, 2] = rng.integers(0, 256, n_hosts)
    v4[:, 3] = rng.integers(1, 255, n_hosts)
    v6 = np.zeros((n_hosts, 8), np.uint16)
    v6[:, :2] = as_v6[host_as]
    v6[:, 2:4] = rng.integers(0, 2**16, (n_hosts, 2))
    v6[:, 7] = rng.integers(1, 2**16, n_hosts)
    # Address text of host h: IPv4 at h, IPv6 at n_hosts + 1 + h; the empty address after each.
    self.n_hosts = n_hosts
    self.texts = pa.array(
      _address_texts(v4, socket.AF_INET)
      + [""]
      + _address_texts(v6.astype(">u2").view(np.uint8), socket.AF_INET6)
      + [""],
      pa.string(),
    )
    self.has_v6 = rng.random(n_hosts) < np.where(np.arange(n_hosts) < self.n_probes, 0.8, 0.85)
    # Access latency: mostly wired (~1-3 ms), a few mobile or satellite links.
    self.access_ms = rng.lognormal(np.log(1.5), 0.6, n_hosts)
    slow = rng.random(n_hosts) < 0.04
    self.access_ms[slow] += rng.uniform(20, 600, slow.sum())
    self.access_ms[self.n_probes :] *= 0.2  # destinations are mostly servers
    # Probe lifetimes: most run the whole span; some appear only briefly (short probes).
    self.alive_from = np.zeros(self.n_probes)
    self.alive_to = np.full(self.n_probes, float(SPAN_SECONDS))
    short = rng.random(self.n_probes) < 0.2
    length = rng.uniform(600, 7200, short.sum())
    self.alive_from[short] = rng.uniform(0, SPAN_SECONDS - length)
    self.alive_to[short] = self.alive_from[short] + length
    self._make_streams(rows, rng)

  def _make_streams(self, rows: int, rng: np.random.Generator) -> None:
    per_stream = SPAN_SECONDS / INTERVALS.mean()
    n = max(3 * self.n_probes, int(np.ceil(1.3 * rows / per_stream)))
    activity = rng.lognormal(0, 1.0, self.n_probes)
    activity[self.alive_to - self.alive_from < SPAN_SECONDS] *= 0.1
    probe = rng.choice(self.n_probes, n, p=activity / activity.sum())
    probe[: self.n_probes] = np.arange(self.n_probes)  # every probe pings something
    popularity = rng.lognormal(0, 1.0, self.n_dsts)
    candidates = self.n_probes + rng.choice(self.n_dsts, (n, 6), p=popularity / popularity.sum())
    distance = _great_circle_km(
      self.lat[probe, None], self.lon[probe, None], self.lat[candidates], self.lon[candidates]
    )
    # Probes favour nearby targets (anycast, local services), which sets the RTT median.
    pick = np.where(rng.random(n) < 0.8, np.argmin(distance, axis=1), 0)
    dst = candidates[np.arange(n), pick]
    distance = distance[np.arange(n), pick]
    dual = self.has_v6[probe] & self.has_v6[dst]
    is_v6 = dual & (rng.random(n) < 0.62)
    inflation = 1.0 + rng.lognormal(np.log(0.45), 0.5, n) * np.where(is_v6, 1.15, 1.0)
    base_ms = distance / 100.0 * inflation + self.access_ms[probe] + self.access_ms[dst] + 0.3
    fail_p = np.where(rng.random(n) < 0.03, 1.0, rng.beta(0.6, 9.0, n))
    interval_choice = rng.integers(0, len(INTERVALS), n)
    # One measurement id per (destination, version, interval), shared by its probes; a probe
    # takes part in a measurement once.
    msm_id = 5_000_000 + ((dst - self.n_probes) * 2 + is_v6) * len(INTERVALS) + interval_choice
    keep = np.sort(np.unique(probe * 2**32 + msm_id, return_index=True)[1])
    self.stream_probe, self.stream_dst, self.stream_v6 = probe[keep], dst[keep], is_v6[keep]
    self.base_ms, self.fail_p, self.msm_id = base_ms[keep], fail_p[keep], msm_id[keep]
    self.interval = INTERVALS[interval_choice[keep]].astype(float)
    self.first = self.alive_from[self.stream_probe] + rng.uniform(0, self.interval)
    count = np.floor((self.alive_to[self.stream_probe] - self.first) / self.interval) + 1
    self.count = np.maximum(0, count).astype(np.int64)

  def events(self, begin: int, end: int) -> tuple[np.ndarray, np.ndarray]:
    """(stream, time) of every ping in [begin, end) seconds."""
    lo = np.clip(np.ceil((begin - self.first) / self.interval), 0, self.count).astype(np.int64)
    hi = np.clip(np.ceil((end - self.first) / self.interval), 0, self.count).astype(np.int64)
    per_stream = hi - lo
    stream = np.repeat(np.arange(len(per_stream)), per_stream)
    starts = np.cumsum(per_stream) - per_stream
    k = lo[stream] + np.arange(len(stream)) - starts[stream]
    return stream, self.first[stream] + k * self.interval[stream]


def _piece_table(
  world: _World, stream: np.ndarray, when: np.ndarray, rng, with_probe: bool = False
) -> pa.Table:
  """The rows of the pings (stream, time) in time order: RTTs, failures, address text.

  `with_probe` adds the probe's number as `prb_id` (drawing nothing from `rng`).
  """
  n = len(stream)
  order = np.argsort(when)
  stream, seconds = stream[order], np.floor(when[order]).astype(np.int64)
  is_v6 = world.stream_v6[stream]
  base = world.base_ms[stream]
  rtt = base * (1 + np.abs(rng.normal(0, 0.03, n))) + rng.exponential(0.05 * base + 0.1)
  queued = rng.random(n) < 0.06
  rtt[queued] += (rng.pareto(1.3, queued.sum()) + 0.2) * 25
  huge = rng.random(n) < 2e-4
  rtt[huge] = rng.uniform(1_000, 300_000, huge.sum())
  rtt = np.minimum(np.round(rtt, 3), 300_000.0)
  failed = rng.random(n) < world.fail_p[stream]
  rtt[failed] = FAILED_RTT

  # Index of each row's address text (see _World.texts); a few are empty or null.
  family = np.where(is_v6, world.n_hosts + 1, 0)
  src = family + world.stream_probe[stream]
  empty = rng.random(n) < 2e-4
  src[empty] = family[empty] + world.n_hosts
  dst = pa.array(family + world.stream_dst[stream], mask=rng.random(n) < 1e-4)

  probe = {"prb_id": pa.array(world.stream_probe[stream] + 1, pa.int64())} if with_probe else {}
  return pa.table(
    {
      "msm_id": pa.array(world.msm_id[stream], pa.int64()),
      "event_time": pa.array(START_SECONDS + seconds, pa.timestamp("s", tz="UTC")),
      "src_addr": world.texts.take(src),
      "dst_addr": world.texts.take(dst),
      "ip_version": pa.array(np.where(is_v6, 6, 4), pa.int64()),
      "rtt": pa.array(rtt, pa.float64()),
      "size": pa.array(np.full(n, 48), pa.int64()),
      "packet_error_count": pa.array(failed & (rng.random(n) < 0.1), pa.int64()),
      **probe,
    }
  )


def _json_lines(table: pa.Table) -> pa.ChunkedArray:
  """Each row as a RIPE Atlas ping result (firmware 5080 style), one JSON text a line.

  One result per row with a one-packet `result` list: a generated stream pings once per
  interval, so a row is a whole result. A failed row is a timeout (`{"x": "*"}`), or an
  error packet where `packet_error_count` is set. `from` holds the row's source address and
  `src_addr` the probe's local one (a shared private address over IPv4, as behind NAT); a
  null destination leaves out `dst_addr`/`dst_name`; `prb_id` is the probe's number. Built
  with Arrow string kernels, not per row; Arrow prints floats in their shortest
  round-trip form, so ingest reads back the same values.
  """
  rtt = table.column("rtt")
  failed = pc.less(rtt, 0)
  rtt_text = pc.cast(rtt, pa.string())
  join = pc.binary_join_element_wise
  packet = pc.if_else(
    failed,
    pc.if_else(
      pc.greater(table.column("packet_error_count"), 0),
      '{"error":"Network is unreachable"}',
      '{"x":"*"}',
    ),
    join('{"rtt":', rtt_text, "}", ""),
  )
  stat = pc.if_else(failed, "-1", rtt_text)
  dst = table.column("dst_addr")
  dst_part = pc.coalesce(join(',"dst_name":"', dst, '","dst_addr":"', dst, '"', ""), "")
  src = table.column("src_addr")
  local = pc.if_else(
    pc.and_(pc.equal(table.column("ip_version"), 4), pc.not_equal(src, "")), "192.168.1.10", src
  )
  seconds = pc.cast(table.column("event_time"), pa.int64())
  msm = pc.cast(table.column("msm_id"), pa.string())
  text = pa.string()
  lines = join(
    '{"fw":5080,"lts":17,"af":',
    pc.cast(table.column("ip_version"), text),
    dst_part,
    ',"src_addr":"',
    local,
    '","proto":"ICMP","ttl":57,"size":48,"result":[',
    packet,
    '],"dup":0,"rcvd":',
    pc.if_else(failed, "0", "1"),
    ',"sent":1,"min":',
    stat,
    ',"max":',
    stat,
    ',"avg":',
    stat,
    ',"msm_id":',
    msm,
    ',"prb_id":',
    pc.cast(table.column("prb_id"), text),
    ',"timestamp":',
    pc.cast(seconds, text),
    ',"msm_name":"Ping","from":"',
    src,
    '","type":"ping","group_id":',
    msm,
    ',"stored_timestamp":',
    pc.cast(pc.add(seconds, 29), text),
    "}\n",
    "",
  )
  if lines.null_count:
    raise AssertionError("a generated row has no JSON text")
  return lines


def _write_lines(f, lines: pa.ChunkedArray) -> None:
  """The texts of a string column back to back, straight from Arrow's buffers."""
  for chunk in lines.chunks:
    offsets = np.frombuffer(chunk.buffers()[1], np.int32)[
      chunk.offset : chunk.offset + len(chunk) + 1
    ]
    f.write(memoryview(chunk.buffers()[2])[offsets[0] : offsets[-1]])


def _write_files(
  staging: str,
  out_dir: str,
  rows: int,
  shards: int,
  seed: int,
  progress: bool,
  fmt: str,
  world_rows: int | None,
) -> dict:
  """`generate`'s files, written in folder `staging` (named in errors as in `out_dir`); the
  marker's content."""
  world = _World(world_rows or rows, np.random.default_rng(seed))
  per_shard = -(-rows // (shards * PIECE_ROWS))  # time slices per file
  pieces = shards * per_shard
  paths, written, carried = [], 0, 0
  pattern = FILE_PATTERN if fmt == "parquet" else FILE_PATTERN.replace(".parquet", ".json")
  bar = tqdm.tqdm(
    total=rows, unit=" rows", unit_scale=True, desc="generate", disable=not progress or rows < 1e6
  )
  for shard in range(shards):
    path = os.path.join(out_dir, pattern.format(shard, shards))  # its name in errors
    tmp = os.path.join(staging, os.path.basename(path))
    writer = None
    try:
      for piece in range(shard * per_shard, (shard + 1) * per_shard):
        rng = np.random.default_rng([seed, piece + 1])
        stream, when = world.events(
          SPAN_SECONDS * piece // pieces, SPAN_SECONDS * (piece + 1) // pieces
        )
        wanted = rows * (piece + 1) // pieces - rows * piece // pieces + carried
        keep = np.sort(rng.choice(len(stream), min(wanted, len(stream)), replace=False))
        carried = wanted - len(keep)
        table = _piece_table(world, stream[keep], when[keep], rng, with_probe=fmt != "parquet")
        with WritesTo(path):
          if writer is None:
            writer = _open_writer(tmp, table.schema, fmt)
          if fmt == "parquet":
            writer.write_table(table, row_group_size=WRITE_ROW_GROUP_ROWS)
          else:
            _write_lines(writer, _json_lines(table))
        written += table.num_rows
        bar.update(table.num_rows)
      with WritesTo(path):
        writer.close()
      writer = None
    finally:
      if writer is not None:
        with contextlib.suppress(OSError):  # fails again on a full disk
          writer.close()
    paths.append(path)
  bar.close()
  if carried:
    raise RuntimeError(f"the generated world holds only {written} of {rows} rows")
  return {
    "rows": rows,
    "shards": shards,
    "seed": seed,
    "format": fmt,
    "world_rows": world_rows or rows,
    "files": [os.path.basename(p) for p in paths],
  }


def generate(
  out_dir: str,
  rows: int = 200_000,
  shards: int = 4,
  seed: int = 0,
  progress: bool = True,
  fmt: str = "parquet",
  world_rows: int | None = None,
) -> list[str]:
  """Write `rows` measurements as `shards` time-ordered files in `out_dir`.

  `fmt` "parquet" writes raw parquet (docs/spec.md §1); "ripe-json" writes the same measurements
  as RIPE Atlas ping results, one JSON object a line (`_json_lines`), which `ingest` turns
  back into the parquet's rows (plus `prb_id`).
  Same (rows, shards, seed, fmt) -> byte-identical files. Files of an earlier run in
  `out_dir` (this module's file names and marker) are replaced once this run's are whole
  (`layout.publish`; a run that fails leaves them as they were). Returns the file paths in
  time order. Memory stays bounded whatever the size: a file is written in time slices of
  at most PIECE_ROWS rows. The progress bar on stderr shows for runs of at least a million
  rows when `progress`.

  `world_rows` sizes the world (probes, destinations, streams) as for that many rows, of which
  `rows` are drawn: a small sample with a large dump's number of distinct addresses.
  """
  if shards < 1 or rows < shards:
    raise ValueError(f"need rows >= shards >= 1, got rows={rows}, shards={shards}")
  if fmt not in FORMATS:
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
  # the files of this run: an earlier run's stay until they are whole
  with staged(out_dir) as staging:
    summary = _write_files(staging, out_dir, rows, shards, seed, progress, fmt, world_rows)
    return publish(staging, out_dir, summary["files"], summary)


def _open_writer(tmp: str, schema: pa.Schema, fmt: str):
  if fmt == "parquet":
    # Page checksums let a reader tell a flipped bit from data (prepare verifies them).
    return pq.ParquetWriter(
      tmp, schema, write_page_checksum=True, dictionary_pagesize_limit=DICTIONARY_PAGE_BYTES
    )
  return open(tmp, "wb")  # noqa: SIM115 (closed by the caller)


def add_arguments(parser) -> None:
  parser.add_argument("--out", required=True, help="output folder")
  parser.add_argument("--rows", type=int, default=200_000, help="measurements (default 200000)")
  parser.add_argument("--shards", type=int, default=4, help="parquet files (default 4)")
  parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
  parser.add_argument(
    "--format",
    choices=FORMATS,
    default="parquet",
    help="raw parquet (default) or RIPE Atlas ping results as JSON lines, for `ingest`",
  )


def run(args) -> int:

  if args.shards < 1 or args.rows < args.shards:
    raise UserError(f"need --rows >= --shards >= 1, got --rows {args.rows} --shards {args.shards}")
  started = time.perf_counter()
  paths = generate(args.out, rows=args.rows, shards=args.shards, seed=args.seed, fmt=args.format)
  seconds = time.perf_counter() - started
  print(f"wrote {args.rows:,} rows in {len(paths)} files to {args.out} in {seconds:.2f} s")
  return 0
