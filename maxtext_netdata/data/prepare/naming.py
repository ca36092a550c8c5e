"""The names of stores: a store's folder is its fingerprint, a digest of everything its
content depends on (`fingerprint`); stores that differ only in their train files and time
bounds share a content key (`content_key`), so one can be updated into another
(`data.prepare.append`) or converted from the format before (`data.prepare.upgrade`). One
process at a time builds the store of a name (`builder_lock`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys

from maxtext_netdata.data import file_lock, remote
from maxtext_netdata.data.prepare import append, local_runner
from maxtext_netdata.data.store import store

# Config keys whose value changes the store's content.
_CONTENT_KEYS = ("network_split", "network_test_fraction", "network_skip_bad_rows")


def digest(description: dict) -> str:
  """The 16 hex digits naming a description."""
  return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:16]


def description(config, eval_files: list[remote.FileEntry]) -> dict:
  """What decides a store's content besides its train files (`content_key` digests it)."""
  cutoff = config.network_split == "time" and config.network_test_fraction > 0
  return {
    "format_version": store.FORMAT_VERSION,
    "eval_files": [dataclasses.astuple(f) for f in eval_files],
    "hashed_order": local_runner.uses_hashed_order(config),
    **{key: config[key] for key in _CONTENT_KEYS},
    # The time split's cutoff at numpy's own index (`assemble.time_cutoff`): a store cut at
    # the index taken before, which differed for some row counts, is not this store.
    **({"time_cutoff": "numpy-higher"} if cutoff else {}),
  }


def fingerprint(
  config, train_files: list[remote.FileEntry], eval_files: list[remote.FileEntry]
) -> str:
  """Hex digest naming the store that `config` and these files produce."""
  return fingerprint_of(
    description(config, eval_files), append.entries(train_files), local_runner.time_bounds(config)
  )


def fingerprint_of(content: dict, train_entries: list, bounds: tuple) -> str:
  """The name of the store of `content` (a `description`), these train files (as
  `append.entries` gives them) and time `bounds`."""
  return digest(
    {
      **content,
      "train_files": [list(e) for e in train_entries],
      # Only when set: the stores of configs without a window keep their names.
      **({"time_bounds": list(bounds)} if tuple(bounds) != (None, None) else {}),
    }
  )


def content_key(config, eval_files: list[remote.FileEntry]) -> str:
  """Hex digest of everything in the fingerprint but the train files and the time bounds:
  stores of one content key differ only in their train files and time bounds, so one can be
  updated into another (`data.prepare.append`)."""
  return digest(description(config, eval_files))


def recut_key(config, eval_files: list[remote.FileEntry]):
  """For a time split without eval files, the content key `config` would have at another test
  fraction (a function of it): a time split of such a key can be cut again at this one
  (`data.prepare.append`); None for any other split."""
  if config.network_split != "time" or eval_files:
    return None
  return lambda fraction: content_key(config.replace(network_test_fraction=fraction), eval_files)


def builder_lock(prepared_dir: str, fp: str, progress: bool):
  """Hold `<prepared_dir>/.lock-<fp>` while building: one builder per store; another waits
  (`file_lock.held`)."""

  def busy() -> None:
    if progress:
      print(f"prepare: another process is building store {fp}; waiting", file=sys.stderr)

  return file_lock.held(os.path.join(prepared_dir, f".lock-{fp}"), busy)
