"""How a folder of raw parquet is laid out by the two commands that write one, `generate` and
`ingest` (docs/spec.md §1): file names, the completion marker, row groups and the failed-RTT
value.

A writer clears an earlier run's outputs first (`clear_outputs`), writes
`pings-00000-of-0000N.parquet` ..., then the `.complete` marker last: a folder without the
marker is an interrupted run, never a dataset.
"""

from __future__ import annotations

import contextlib
import json
import os

from maxtext_netdata.errors import WritesTo

COMPLETE_MARKER = ".complete"
FILE_PATTERN = "pings-{:05d}-of-{:05d}.parquet"
ROW_GROUP_SIZE = 32_768  # rows per row group of `ingest`'s files
FAILED_RTT = -1.0  # the `rtt` of a measurement that got no reply


def clear_outputs(out_dir: str) -> None:
  """Remove the marker, then the shard files, of an earlier run in `out_dir`."""
  marker = os.path.join(out_dir, COMPLETE_MARKER)
  if os.path.exists(marker):
    os.remove(marker)
  for name in os.listdir(out_dir):
    if name.startswith("pings-") and name.endswith((".parquet", ".json")):
      os.remove(os.path.join(out_dir, name))


def write_complete_marker(out_dir: str, content: dict) -> None:
  """The `.complete` marker of `out_dir`, JSON `content`, written whole or not at all (a
  rename): the last write of a run, after which the folder is a dataset."""
  marker = os.path.join(out_dir, COMPLETE_MARKER)
  try:
    with WritesTo(marker), open(marker + ".tmp", "w", encoding="utf-8") as f:
      json.dump(content, f)
    os.replace(marker + ".tmp", marker)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(marker + ".tmp")
    raise
