"""How much memory page cache may take (`page_cache_room`), which `network_store_access=auto`
compares a split with: a process's own memory is not room for the store's pages."""

import os
import subprocess
import sys

import pytest

from maxtext_netdata.data.store import memory

CHILD = """
import numpy as np
from maxtext_netdata.data.store import memory
before = memory.page_cache_room()
held = np.ones(HELD_MIB << 17)  # float64: HELD_MIB MiB, written, so resident
print(before, memory.page_cache_room(), memory.usable_memory())
"""


def _memory_cgroup(tmp_name: str, limit: int):
  """A new memory cgroup limited to `limit` bytes: (its folder, its procs file), or None
  where none can be made here (not root, no writable cgroup)."""
  for base, limit_file in memory.memory_cgroups():
    folder = os.path.join(base, tmp_name)
    try:
      os.mkdir(folder)
      with open(os.path.join(folder, limit_file), "w") as f:
        f.write(str(limit))
    except OSError:
      if os.path.isdir(folder):
        os.rmdir(folder)
      continue
    return folder, os.path.join(folder, "cgroup.procs")
  return None


def test_room_in_a_cgroup_is_its_limit_less_the_memory_its_processes_hold():
  limit, held_mib = 512 << 20, 200
  made = _memory_cgroup(f"netdata_test_memory_{os.getpid()}", limit)
  if made is None:
    pytest.skip("no memory cgroup can be made here (root and a writable cgroup needed)")
  folder, procs = made
  try:
    code = f"import os; open({procs!r}, 'w').write(str(os.getpid()))\n"
    code += CHILD.replace("HELD_MIB", str(held_mib))
    out = subprocess.run(
      [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    before, after, usable = (int(x) for x in out.stdout.split())
  finally:
    os.rmdir(folder)
  assert usable == limit  # the cgroup's limit is the memory this process may use...
  assert before < limit  # ...but what it holds already (Python, numpy) is no room for cache
  assert before - after >= (held_mib - 8) << 20  # nor what it holds after
  assert after <= limit - (held_mib << 20)


def test_room_is_at_most_the_usable_memory():
  assert 0 < memory.page_cache_room() <= memory.usable_memory()
