"""How much memory this process may use: the machine's, or its memory cgroup's limit when
lower (`network_store_access=auto` compares a split's row files with it)."""

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
