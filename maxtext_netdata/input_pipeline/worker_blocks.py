"""The /dev/shm blocks of an iterator's Grain workers, named so that it can find what a dead
worker left behind (docs/training.md, "How a run ends").

A Grain worker copies each batch into /dev/shm blocks (`SharedMemoryArray`, Python's
`SharedMemory(create=True)`, named `psm_<random>`) and queues their names; the main process
opens and unlinks them. A worker killed between creating a block and handing its name over
(SIGKILL, the kernel's OOM killer) leaves that block behind with no one to unlink it: only
Python's resource tracker would, when the main process exits, and only when the tracker itself
is not killed. So the workers of a `HostBatchIterator` name their blocks
`psm_<prefix>_<random>` (`name_blocks`, from Grain's `worker_init_fn`), and once its workers
have ended the iterator unlinks what is left of that prefix (`unlink_left`).

Python has no public hook for the names it gives `SharedMemory` blocks, so `name_blocks`
replaces `multiprocessing.shared_memory._make_filename` in the worker process (and only
there); where that private function is missing, the blocks keep Python's names and nothing is
found to unlink. Blocks are listed from /dev/shm, Linux's folder of POSIX shared memory.
"""

from __future__ import annotations

import secrets
from multiprocessing import shared_memory
from pathlib import Path

SHM_DIR = Path("/dev/shm")
# Python's own names are `psm_` and 8 hex digits; ours `psm_nd<8 hex>_<8 hex>`, 23 characters
# (Linux allows 255; macOS, which has no /dev/shm to sweep, 31).
_PREFIX_HEAD = "nd"


def new_prefix() -> str:
  """A prefix of block names no other iterator uses: `nd` and 8 random hex digits."""
  return _PREFIX_HEAD + secrets.token_hex(4)


def name_blocks(prefix: str) -> None:
  """Names the shared-memory blocks this process creates from now on `psm_<prefix>_<random>`."""
  if not hasattr(shared_memory, "_make_filename"):
    return
  head = f"{shared_memory._SHM_NAME_PREFIX}{prefix}_"

  def make_filename() -> str:
    return head + secrets.token_hex(4)

  shared_memory._make_filename = make_filename


def left(prefix: str) -> list[str]:
  """The names of the blocks of `prefix` in /dev/shm now."""
  if not SHM_DIR.is_dir():
    return []
  return sorted(path.name for path in SHM_DIR.glob(f"psm_{prefix}_*"))


def mapped() -> frozenset[str]:
  """The names of the /dev/shm blocks this process maps now (from /proc/self/maps; empty
  where there is none): blocks under arrays still alive here."""
  try:
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
      return frozenset(line.rsplit("/", 1)[1].strip() for line in f if f" {SHM_DIR}/psm_" in line)
  except OSError:
    return frozenset()


def unlink_left(prefix: str, keep_mapped: bool = False) -> list[str]:
  """Unlinks the blocks of `prefix` still in /dev/shm and takes them off the resource tracker's
  list (`SharedMemory.unlink` does both); returns their names. Only for blocks no process will
  still open or unlink: call it once the workers have ended, with `keep_mapped` where arrays
  over some may still be alive here (those this process maps, `mapped()`, are kept: Grain
  unlinks them when the arrays are garbage). `mapped()` is read only when a block is left."""
  names = left(prefix)
  keep = mapped() if keep_mapped and names else frozenset()
  unlinked = []
  for name in names:
    if name in keep:
      continue
    try:
      block = shared_memory.SharedMemory(name)
    except FileNotFoundError:  # unlinked meanwhile
      continue
    block.close()
    try:
      block.unlink()
    except FileNotFoundError:
      continue
    unlinked.append(name)
  return unlinked
