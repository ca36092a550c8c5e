"""The `maxtext-netdata` command starts itself again, once, with glibc's huge-page tunable where
it is missing (maxtext_netdata/cli/huge_pages.py); scripts/setup_env.sh exports it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from maxtext_netdata.cli import huge_pages
from tests.helpers import REPO

# Prints the tunables this process started with, then runs the command as the console script
# does: a restart prints a second line.
_PROBE = (
  "import os, sys; print(os.environ.get('GLIBC_TUNABLES'), flush=True);"
  " from maxtext_netdata.cli import main; sys.exit(main())"
)
_SUPPORTED = huge_pages.glibc_version() is not None and huge_pages.glibc_version() >= (2, 35)


def _probe(**env: str) -> list[str]:
  names = ("GLIBC_TUNABLES", huge_pages.SWITCH, huge_pages.RESTARTED)
  environ = {k: v for k, v in os.environ.items() if k not in names}
  result = subprocess.run(
    [sys.executable, "-c", _PROBE, "decode"],
    cwd=REPO,
    env={**environ, **env},
    input="",
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert result.returncode == 0, result.stderr
  return result.stdout.splitlines()


@pytest.mark.skipif(
  not (_SUPPORTED and huge_pages.thp_enabled()), reason="needs glibc >= 2.35 and THP"
)
def test_the_command_restarts_once_with_the_tunable_and_keeps_its_command_line():
  assert _probe() == ["None", "glibc.malloc.hugetlb=1"]
  assert _probe(GLIBC_TUNABLES="glibc.malloc.arena_max=2") == [
    "glibc.malloc.arena_max=2",
    "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1",
  ]


def test_a_users_value_and_the_switch_leave_the_environment_alone():
  assert _probe(GLIBC_TUNABLES="glibc.malloc.hugetlb=0") == ["glibc.malloc.hugetlb=0"]
  assert _probe(NETDATA_HUGE_PAGES="0") == ["None"]


@pytest.mark.parametrize(
  ("environ", "glibc", "thp", "expected"),
  [
    ({}, (2, 36), True, "glibc.malloc.hugetlb=1"),
    (
      {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"},
      (2, 35),
      True,
      "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1",
    ),
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=2"}, (2, 36), True, None),
    ({"NETDATA_HUGE_PAGES": "0"}, (2, 36), True, None),
    ({huge_pages.RESTARTED: "1"}, (2, 36), True, None),  # started again once already
    ({}, (2, 34), True, None),  # glibc before the tunable
    ({}, None, True, None),  # another C library
    ({}, (2, 36), False, None),  # THP switched off
  ],
)
def test_when_the_tunable_is_added(environ, glibc, thp, expected):
  assert huge_pages.tunables_with_huge_pages(environ, glibc, thp) == expected


def test_setup_env_exports_the_tunable_and_keeps_a_users_value():
  def exported(**env: str) -> str:
    script = 'source scripts/setup_env.sh ""; echo "[${GLIBC_TUNABLES:-}]"'
    environ = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/"), **env}
    result = subprocess.run(
      ["bash", "-c", script], cwd=REPO, env=environ, capture_output=True, text=True, timeout=120
    )
    return result.stdout.strip().splitlines()[-1]

  assert exported() == "[glibc.malloc.hugetlb=1]"
  assert exported(GLIBC_TUNABLES="glibc.malloc.arena_max=2") == (
    "[glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1]"
  )
  assert exported(GLIBC_TUNABLES="glibc.malloc.hugetlb=0") == "[glibc.malloc.hugetlb=0]"
  assert exported(NETDATA_HUGE_PAGES="0") == "[]"
