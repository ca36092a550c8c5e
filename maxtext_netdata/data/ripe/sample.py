"""Which ping results `ingest` keeps under `--probe-fraction`, `--since` and `--until`.

The model reads sequences of one probe's consecutive measurements (docs/spec.md §3), so a
sample must keep whole probes: a share of the rows (every tenth result) would keep nearly
every probe with nine measurements in ten missing, which trains on histories no probe has
(gaps ten times as long), while a share of the probes keeps each kept probe's history as it
is (docs/prepare.md, "A sample"). A probe is in the sample when its hash
(`data.raw.probe_hash`, computed from the row's version and source address as `prepare`
computes it) read little-endian, as a fraction of 2^64, is below the fraction: the same on
every file and machine, and a sample at a smaller fraction is part of one at a larger.
`prepare` splits probes by the same 8 bytes read big-endian; the two readings are
independent, so a sample keeps `network_test_fraction` of its probes for the test split,
each probe in the split it has in the whole data.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pyarrow as pa

from maxtext_netdata.data.raw import addresses, probe_hash, schema


@functools.lru_cache(maxsize=1 << 20)
def _fraction(key: bytes) -> float:
  return int.from_bytes(probe_hash.digest(key), "little") / 2.0**64


def probe_keys(source: pa.Array | pa.ChunkedArray, version: np.ndarray) -> np.ndarray:
  """The 17-byte probe key of each row (or result), as numpy void scalars of 17 bytes."""
  address = addresses.parse_addresses(source, version, source="ingest", column_name="src_addr")[0]
  keys = probe_hash.probe_keys(version, address)
  return keys.view(np.dtype((np.void, probe_hash.KEY_BYTES)))[:, 0]


def probe_fractions(source: pa.Array | pa.ChunkedArray, version: np.ndarray) -> np.ndarray:
  """float64 [N]: each probe's place in the sample order, from 0 to 1."""
  keys, inverse = np.unique(probe_keys(source, version), return_inverse=True)
  return np.array([_fraction(key.tobytes()) for key in keys], np.float64)[inverse]


@dataclasses.dataclass(frozen=True)
class Sample:
  """The probes below `probe_fraction` (1: every probe), times in [since, until) (Unix
  seconds; None: unbounded)."""

  probe_fraction: float = 1.0
  since: int | None = None
  until: int | None = None

  def keeps(
    self, source: pa.Array | pa.ChunkedArray, version: np.ndarray, seconds: np.ndarray
  ) -> np.ndarray:
    """bool [N]: whether the result (or row) of each source, version and time is kept."""
    keep = schema.in_time(seconds, self.since, self.until)
    if self.probe_fraction < 1 and keep.any():
      keep &= probe_fractions(source, version) < self.probe_fraction
    return keep
