"""One store for every process of a run: prepared once, then checked to be the same everywhere.

`prepare_shared_store(config)` is what the multi-process pipeline calls before its first batch:

1. Process 0 prepares the store (opens it, copies it from `gs://` / `s3://`, or builds it).
   The others wait for its outcome (a broadcast from process 0), so a shared folder or bucket
   sees one builder; if process 0 failed, every other process stops with one line saying so.
2. The other processes then prepare theirs: from the shared folder or bucket they find
   process 0's store and open or copy it; with a private folder (a host's local disk) they
   build their own, which is fine as long as it is the same store.
3. Every process sends its store's identity (fingerprint, rows, probes and failed rows of
   the train and eval splits) to all (`process_allgather`); any difference from process 0
   is a one-line `DataError` on every process naming the processes and what differs, instead
   of silently training on mixed data. The fingerprint covers each input file's URI, size and
   modification time and the content keys (`data.prepare.prepare.fingerprint`), so a host that lists
   other files, or other versions of them, is caught here.
"""

from __future__ import annotations

import sys

import jax
import numpy as np
from jax.experimental import multihost_utils

from maxtext_netdata.data.prepare import prepare
from maxtext_netdata.errors import DataError

_COUNTS = ("rows", "probes", "failed")
_IDENTITY_BYTES = 8 + 6 * 8


def identity(splits: prepare.PreparedSplits) -> np.ndarray:
  """uint8 [8 + 48]: the fingerprint's 8 bytes, then the counts of train and eval as uint64.

  Bytes, because JAX collectives without x64 would cut int64 counts to 32 bits.
  """
  fingerprint = bytes.fromhex(splits.summary["fingerprint"])
  counts = [
    int(split.meta.get(f"num_{name}", 0))
    for split in (splits.train, splits.eval)
    for name in _COUNTS
  ]
  packed = np.asarray(counts, dtype="<u8").view(np.uint8)
  return np.concatenate([np.frombuffer(fingerprint, dtype=np.uint8), packed])


def describe(row: np.ndarray) -> str:
  """`store <fingerprint> (train R rows / P probes / F failed, eval ...)` of an identity."""
  fingerprint = bytes(row[:8]).hex()
  counts = np.asarray(row[8:], dtype=np.uint8).view("<u8").tolist()
  parts = [
    f"{name} "
    + " / ".join(f"{n:,} {c}" for n, c in zip(counts[i * 3 : i * 3 + 3], _COUNTS, strict=True))
    for i, name in enumerate(("train", "eval"))
  ]
  return f"store {fingerprint} ({', '.join(parts)})"


def mismatch(identities: np.ndarray) -> str | None:
  """The one-line complaint about rows of `identities` [P, K] unlike process 0's, or None."""
  reference = identities[0]
  odd = [p for p in range(1, len(identities)) if not np.array_equal(identities[p], reference)]
  if not odd:
    return None
  same_fingerprint = all(np.array_equal(identities[p][:8], reference[:8]) for p in odd)
  what = "the same fingerprint but other counts" if same_fingerprint else "another store"
  others = "; ".join(f"process {p} holds {describe(identities[p])}" for p in odd)
  hint = (
    "a damaged or stale copy: delete it and run prepare again"
    if same_fingerprint
    else "every host must list the same raw files (same URIs, sizes and modification times)"
    " with the same network_* keys: use shared storage for the raw files or the store"
  )
  return (
    f"store check: {len(odd)} process(es) hold {what} than process 0, which holds"
    f" {describe(reference)}; {others}: {hint}"
  )


def verify_same_store(splits: prepare.PreparedSplits | None) -> None:
  """Raise the same one-line DataError on every process unless all hold process 0's store.

  `splits` None says this process could not prepare its store (it raises its own error
  after this call; the others say which process failed). A collective: every process must
  call it.
  """
  if jax.process_count() == 1:
    return
  own = np.zeros(_IDENTITY_BYTES + 1, dtype=np.uint8)
  if splits is not None:
    own[0] = 1
    own[1:] = identity(splits)
  gathered = np.asarray(multihost_utils.process_allgather(own)).reshape(jax.process_count(), -1)
  failed = [p for p in range(len(gathered)) if not gathered[p, 0]]
  if splits is None:
    return
  if failed:
    raise DataError(
      f"store check: process(es) {', '.join(map(str, failed))} could not prepare the store"
      " (their logs say why); stopping"
    )
  problem = mismatch(gathered[:, 1:])
  if problem is not None:
    raise DataError(problem)


def prepare_shared_store(config) -> prepare.PreparedSplits:
  """The splits of `config` on this process: process 0 prepares first, then the others;
  all are checked to hold the same store (see the module docstring). A collective."""
  if jax.process_count() == 1:
    return prepare.ensure_prepared(config)
  first = jax.process_index() == 0
  splits, failure = None, None
  if first:
    try:
      splits = prepare.ensure_prepared(config, progress=True)
    except Exception as e:  # noqa: BLE001 (told to the others, then raised again below)
      failure = e
  ok = multihost_utils.broadcast_one_to_all(np.asarray([failure is None], dtype=np.int32))
  if failure is not None:
    raise failure
  if not int(np.asarray(ok)[0]):
    raise DataError(
      "store check: process 0 could not prepare the store (its log says why); stopping"
    )
  if not first:
    try:
      splits = prepare.ensure_prepared(config, progress=False)
    except Exception as e:  # noqa: BLE001 (told to the others, then raised again below)
      failure = e
  verify_same_store(splits)
  if failure is not None:
    raise failure
  if first:
    print(
      f"input pipeline: {describe(identity(splits))} on all {jax.process_count()} processes",
      file=sys.stderr,
      flush=True,
    )
  return splits
