"""The probe hash (docs/spec.md §3): one stable number per probe, whoever computes it.

A probe is (version, source address); its key is the version byte and the 16 address bytes
(`addresses.parse_addresses`' bytes: IPv4 in the first 4, a null or empty address all zero),
and its hash the first 8 bytes of `blake2b(key)`. `prepare` reads them big-endian to order its
store and split the probes; `ingest --probe-fraction` samples probes by them. Here, in the
raw contract, because both stages import it and neither may import the other.
"""

from __future__ import annotations

import hashlib

import numpy as np

KEY_BYTES = 17
DIGEST_BYTES = 8


def probe_keys(version: np.ndarray, address: np.ndarray) -> np.ndarray:
  """uint8 [N, 17] keys of probes of `version` (uint8-castable [N]) at `address` (uint8 [N, 16])."""
  keys = np.empty((len(version), KEY_BYTES), np.uint8)
  keys[:, 0] = version
  keys[:, 1:] = address
  return keys


def digest(key: bytes) -> bytes:
  """The 8 hash bytes of one 17-byte probe key."""
  return hashlib.blake2b(key, digest_size=DIGEST_BYTES).digest()
