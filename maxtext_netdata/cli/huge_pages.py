"""Transparent huge pages for glibc's large allocations: `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`.

XLA's CPU backend takes each execution's temporary buffer from malloc and frees it when the
execution ends: 130 MB for the smoke model's train step (`configs/smoke.yml`). glibc serves
and returns a block that size with `mmap` and `munmap`, so every step maps, faults in and
zeroes ~32,000 fresh 4 KiB pages, then unmaps them: 18% of the CPU time of a smoke step
(`perf`). With the tunable, glibc asks the kernel for transparent huge pages on such blocks
(`madvise(MADV_HUGEPAGE)`): ~430 faults a step, and the smoke step runs 1.34x as fast on the
2-core development VM (249.7 -> 186.3 ms, the median of three rounds' medians;
`benchmarks/bench_cpu_step.py` measures it). The process's peak memory stays the same.
Batches are not affected: the loader reuses its buffers (`input_pipeline/buffers.py`).

glibc reads `GLIBC_TUNABLES` once, when a process starts, so the `maxtext-netdata` command
starts itself again, at once, with the tunable added (`os.execve` of `sys.orig_argv`: the same
process id and command line, before the subcommand's modules are imported), where all of these
hold: Linux with glibc 2.35 or later (the first with the tunable), transparent huge pages not
switched off (`/sys/kernel/mm/transparent_hugepage/enabled` is not `[never]`), the environment
not naming `glibc.malloc.hugetlb` already (a user's own value is kept), `NETDATA_HUGE_PAGES` not
`0`, and no restart before (`RESTARTED`).
The project's scripts export the tunable themselves (`scripts/setup_env.sh`), so the runs,
tests and checks they start, and their worker processes, begin with it.

A tunable of the C library rather than a faster allocator (tcmalloc, jemalloc): those come
from the system's packages, not from pip, and would need `LD_PRELOAD` and a start-up of their own.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

TUNABLE = "glibc.malloc.hugetlb"
VALUE = f"{TUNABLE}=1"
SWITCH = "NETDATA_HUGE_PAGES"  # `0`: leave the environment as it is
# Set by the restart: a C library that drops `GLIBC_TUNABLES` from the environment (glibc does
# for set-user-ID programs) must not make the command start itself again and again.
RESTARTED = "NETDATA_HUGE_PAGES_RESTARTED"
_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"
_FIRST_GLIBC = (2, 35)


def glibc_version() -> tuple[int, int] | None:
  """(major, minor) of the running glibc, or None (another C library, or not Linux)."""
  try:
    name, version = os.confstr("CS_GNU_LIBC_VERSION").split()  # "glibc 2.36"
    major, minor = version.split(".")[:2]
    return (int(major), int(minor)) if name == "glibc" else None
  except (AttributeError, OSError, ValueError):
    return None


def thp_enabled(path: str = _THP_MODE) -> bool:
  """Whether the kernel gives transparent huge pages at least where asked (`madvise`)."""
  try:
    with open(path) as mode:
      return "[never]" not in mode.read()
  except OSError:
    return False


def tunables_with_huge_pages(
  environ: Mapping[str, str],
  glibc: tuple[int, int] | None,
  thp: bool,
) -> str | None:
  """The `GLIBC_TUNABLES` value to start with, or None where the environment stays as it is."""
  tunables = environ.get("GLIBC_TUNABLES", "")
  named = {item.split("=", 1)[0] for item in tunables.split(":") if item}
  if environ.get(SWITCH) == "0" or RESTARTED in environ or TUNABLE in named or not thp:
    return None
  if glibc is None or glibc < _FIRST_GLIBC:
    return None
  return ":".join(filter(None, [tunables, VALUE]))


def restart_with_huge_pages() -> None:
  """Starts this process's command line again with the tunable set, where
  `tunables_with_huge_pages` gives a value; returns where it gives None."""
  tunables = tunables_with_huge_pages(os.environ, glibc_version(), thp_enabled())
  if tunables is None or not sys.executable or not sys.orig_argv:  # an embedded interpreter
    return
  environ = {**os.environ, "GLIBC_TUNABLES": tunables, RESTARTED: "1"}
  sys.stdout.flush()
  sys.stderr.flush()
  try:
    os.execve(sys.executable, sys.orig_argv, environ)
  except OSError:  # the interpreter cannot be started again: run on without huge pages
    return
