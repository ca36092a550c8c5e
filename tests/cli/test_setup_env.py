"""scripts/setup_env.sh sourced into a user's shell: PATH set, the shell's options left as
they were, and a failure returned as a status instead of ending the shell."""

from __future__ import annotations

import os
import subprocess

from tests.helpers import REPO


def _shell(script: str, **env: str) -> subprocess.CompletedProcess:
  return subprocess.run(
    ["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120, env=env
  )


def test_sourced_it_puts_the_venv_first_and_leaves_the_shells_options():
  # Extras "" install nothing into the suite's own .venv; its stamp is current.
  result = _shell(
    'opts="$-"; source scripts/setup_env.sh ""; echo "status $?"; echo "path ${PATH%%:*}";'
    ' [ "$-" = "$opts" ] && echo "options kept"; false; echo "still here"',
    PATH="/usr/bin:/bin",
    HOME=os.environ.get("HOME", "/"),
  )
  lines = result.stdout.splitlines()
  assert lines == ["status 0", f"path {REPO}/.venv/bin", "options kept", "still here"], (
    result.stdout + result.stderr
  )


def test_a_failure_returns_to_the_shell_instead_of_closing_it():
  result = _shell(
    'source scripts/setup_env.sh ""; echo "status $?"; echo "$-"; echo "still here"',
    PATH="/usr/bin:/bin",
    HOME=os.environ.get("HOME", "/"),
    NETDATA_VENV="/proc/no-such-venv",
  )
  status, options, last = result.stdout.splitlines()
  assert status == "status 1" and last == "still here", result.stdout + result.stderr
  assert "e" not in options and "u" not in options  # no errexit, no nounset left behind
