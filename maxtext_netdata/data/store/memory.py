"""How much memory this process may use: the machine's, or its memory cgroup's limit when
lower (`usable_memory`), and how much of it page cache may take now (`page_cache_room`:
`network_store_access=auto` compares a split's row files with it)."""

from __future__ import annotations

import os


def memory_cgroups():
  """(folder, limit file name) of each memory cgroup this process is in (v2, v1) whose limit
  file exists: at its path under the usual mount point, or, in a container that mounts its
  own cgroup as the root, at the root."""
  try:
    with open("/proc/self/cgroup", encoding="utf-8") as f:
      lines = f.read().splitlines()
  except OSError:
    return
  for line in lines:
    _, controllers, group = line.split(":", 2)
    if controllers == "":
      root, limit = "/sys/fs/cgroup", "memory.max"
    elif "memory" in controllers.split(","):
      root, limit = "/sys/fs/cgroup/memory", "memory.limit_in_bytes"
    else:
      continue
    for folder in dict.fromkeys((root + group.rstrip("/"), root)):
      if os.path.exists(os.path.join(folder, limit)):
        yield folder, limit
        break


def usable_memory() -> int:
  """Bytes of memory this process may fill with page cache: the machine's, or the limit of
  its cgroup when lower, as in a container. Our own code: psutil reads the machine's alone."""
  total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  for folder, limit in memory_cgroups():
    try:
      with open(os.path.join(folder, limit), encoding="utf-8") as f:
        total = min(total, int(f.read().strip()))
    except (OSError, ValueError):  # v2's "max": no limit
      continue
  return total


# The lines of a cgroup's memory.stat that count memory page cache cannot take: anonymous
# memory and shared memory (/dev/shm, such as Grain's batches), v2 then v1 (hierarchical).
_HELD = {"memory.max": ("anon", "shmem"), "memory.limit_in_bytes": ("total_rss", "total_shmem")}


def page_cache_room() -> int:
  """Bytes of memory page cache may take now: the machine's available memory (MemAvailable,
  its free and reclaimable memory), or, in a memory cgroup whose limit is lower, that limit
  less the cgroup's anonymous and shared memory (`memory.stat`). A split that takes more than
  this cannot stay in page cache while the processes beside it keep their memory: measured,
  a 515 MiB split under a 600 MiB limit read 62 batches/s through the read-around, 784 read at
  random (docs/prepare.md, "Seconds in four bytes")."""
  room = usable_memory()
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      available = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    room = min(room, available * 1024)
  except (OSError, StopIteration, ValueError):
    pass
  for folder, limit_name in memory_cgroups():
    try:
      with open(os.path.join(folder, limit_name), encoding="utf-8") as f:
        limit = int(f.read().strip())
      with open(os.path.join(folder, "memory.stat"), encoding="utf-8") as f:
        stat = dict(line.split() for line in f if line.strip())
      held = sum(int(stat.get(name, 0)) for name in _HELD[limit_name])
    except (OSError, ValueError):  # v2's "max": no limit
      continue
    room = min(room, max(limit - held, 0))
  return room
