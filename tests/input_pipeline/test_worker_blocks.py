"""`worker_blocks`: blocks named after their iterator, and what a killed process left unlinked."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from multiprocessing import shared_memory

from maxtext_netdata.input_pipeline import worker_blocks

# A spawned process names its blocks, creates two and is SIGKILLed holding them (as a Grain
# worker killed before handing a batch over); the parent finds them by the prefix, unlinks
# them, and exits: Python's resource tracker, which the child registered them with, must find
# nothing left to clean up ("leaked shared_memory objects").
SCRIPT = textwrap.dedent(
  """
  import multiprocessing, os, signal, sys
  from multiprocessing import shared_memory
  from maxtext_netdata.input_pipeline import worker_blocks

  def child(prefix):
    worker_blocks.name_blocks(prefix)
    blocks = [shared_memory.SharedMemory(create=True, size=4096) for _ in range(2)]
    print(" ".join(b.name for b in blocks), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

  if __name__ == "__main__":
    prefix = worker_blocks.new_prefix()
    process = multiprocessing.get_context("spawn").Process(target=child, args=(prefix,))
    process.start()
    process.join()
    assert process.exitcode == -signal.SIGKILL, process.exitcode
    left = worker_blocks.left(prefix)
    print(prefix, len(left), flush=True)
    print(len(worker_blocks.unlink_left(prefix)), len(worker_blocks.left(prefix)), flush=True)
  """
)


def test_a_killed_process_blocks_are_found_by_prefix_and_unlinked(tmp_path):
  script = tmp_path / "kill.py"
  script.write_text(SCRIPT)
  done = subprocess.run(
    [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True
  )
  names, found, after = done.stdout.split("\n")[:3]
  prefix, count = found.split()
  assert all(name.startswith(f"psm_{prefix}_") for name in names.split()), names
  assert count == "2"  # both blocks outlived their process
  assert after == "2 0"  # both unlinked, none left
  assert "leaked shared_memory" not in done.stderr, done.stderr
  assert worker_blocks.left(prefix) == []


def test_prefixes_differ_and_nothing_is_found_for_an_unused_one():
  first, second = worker_blocks.new_prefix(), worker_blocks.new_prefix()
  assert first != second and first.startswith("nd") and len(first) == 10
  assert worker_blocks.left(first) == [] and worker_blocks.unlink_left(first) == []


def test_blocks_this_process_maps_are_kept_and_the_others_unlinked():
  """`unlink_left(prefix, keep_mapped=True)`, as an iterator's close calls it: a block under an
  array still alive here stays (Grain unlinks it when the array goes), one nobody maps goes."""
  prefix = worker_blocks.new_prefix()
  held, dropped = (
    shared_memory.SharedMemory(f"psm_{prefix}_{i}", create=True, size=4096) for i in range(2)
  )
  dropped.close()  # no longer mapped here, still in /dev/shm
  try:
    assert {held.name} <= worker_blocks.mapped() and dropped.name not in worker_blocks.mapped()
    assert worker_blocks.unlink_left(prefix, keep_mapped=True) == [dropped.name]
    assert worker_blocks.left(prefix) == [held.name]
  finally:
    held.close()
    held.unlink()
  assert worker_blocks.left(prefix) == []
