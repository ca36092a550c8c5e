#!/usr/bin/env bash
# Creates .venv with Python 3.12 and installs the project through constraints.txt.
# Idempotent: re-installs only when setup.py, constraints.txt or the extras change.
# Usage: source scripts/setup_env.sh [EXTRAS]   (EXTRAS default: test; "" for none)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EXTRAS="${1-test}"
VENV="${NETDATA_VENV:-$ROOT/.venv}"

find_python() {
  local candidate
  for candidate in "${PYTHON:-}" python3.12 "$HOME/.pyenv/versions/"3.12*/bin/python3.12 \
    /usr/bin/python3.12 /usr/local/bin/python3.12; do
    [ -n "$candidate" ] || continue
    if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

if [ ! -x "$VENV/bin/python" ]; then
  PY="$(find_python)" || { echo "setup_env: python3.12 not found (set PYTHON=/path/to/python3.12)" >&2; exit 1; }
  echo "setup_env: creating $VENV with $PY" >&2
  "$PY" -m venv "$VENV"
fi

stamp="$VENV/.netdata-installed"
want="$(cat "$ROOT/setup.py" "$ROOT/constraints.txt" | sha256sum | cut -c1-16)-$EXTRAS"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup_env: installing maxtext_netdata[$EXTRAS] (pinned by constraints.txt)" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    -c "$ROOT/constraints.txt" -e "${ROOT}${EXTRAS:+[${EXTRAS}]}" >&2
  echo "$want" >"$stamp"
fi

export PATH="$VENV/bin:$PATH"
export VIRTUAL_ENV="$VENV"
