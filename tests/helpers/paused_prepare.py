"""`python -m tests.helpers.paused_prepare STAGE prepare ARGS...`: the `maxtext-netdata` CLI with
prepare stopping itself (SIGSTOP) at STAGE, so that a test can kill it at a known point.

The stages wrap the real functions at the boundaries between prepare's steps:
- `reading`: one input file read and spilled (`partition.read_chunks` exhausted);
- `partitioned`: every file spilled (`local_runner.spill` returned);
- `sorted`: the first sorted bucket written into the splits (`assemble.Assembler.add`);
- `slicing`: with 3 buckets each larger than one sort may hold (5,000 rows), the first
  bucket's slices spilled and the first of them sorted (`bucket_sort.order_bucket`);
- `assembled`: every split written, the summary not yet (`prepare._summary` called);
- `merging`: new files appended to a store, its first split merged (`merge.merge_split`).
"""

import functools
import os
import signal
import sys

from maxtext_netdata import cli
from maxtext_netdata.data.prepare import (
  assemble,
  bucket_sort,
  local_runner,
  merge,
  partition,
  prepare,
)

STAGES = ("reading", "partitioned", "sorted", "slicing", "assembled", "merging")


def _stop() -> None:
  os.kill(os.getpid(), signal.SIGSTOP)


def _after_first(function):
  """`function`, stopping this process after its first call returns."""
  calls = []

  @functools.wraps(function)
  def wrapped(*args, **kwargs):
    result = function(*args, **kwargs)
    if not calls:
      calls.append(1)
      _stop()
    return result

  return wrapped


def _install(stage: str) -> None:
  if stage == "reading":
    read = partition.read_chunks

    def read_then_stop(*args, **kwargs):
      yield from read(*args, **kwargs)
      _stop()

    partition.read_chunks = read_then_stop
  elif stage == "partitioned":
    local_runner.spill = _after_first(local_runner.spill)
  elif stage == "sorted":
    assemble.Assembler.add = _after_first(assemble.Assembler.add)
  elif stage == "slicing":
    partition.num_buckets = lambda rows, memory_mb: 3
    partition.sort_rows = lambda memory_mb: 5_000
    bucket_sort.order_bucket = _after_first(bucket_sort.order_bucket)
  elif stage == "assembled":
    summary = prepare._summary

    def stop_then_summary(*args, **kwargs):
      _stop()
      return summary(*args, **kwargs)

    prepare._summary = stop_then_summary
  elif stage == "merging":
    merge.merge_split = _after_first(merge.merge_split)
  else:
    raise SystemExit(f"stage must be one of {', '.join(STAGES)}")


if __name__ == "__main__":
  _install(sys.argv[1])
  sys.exit(cli.main(sys.argv[2:]))
