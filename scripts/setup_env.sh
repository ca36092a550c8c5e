#!/usr/bin/env bash
# Creates .venv with Python 3.12 and installs the project through constraints.txt.
# Idempotent: installs only when setup.py or constraints.txt change, or an extra is missing.
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

# The stamp holds a hash of setup.py and constraints.txt, then one installed extra per line:
# asking for extras already installed (run.sh's after test.sh's) installs nothing.
stamp="$VENV/.netdata-installed"
want_hash="$(cat "$ROOT/setup.py" "$ROOT/constraints.txt" | sha256sum | cut -c1-16)"
installed=""
if [ "$(head -n 1 "$stamp" 2>/dev/null)" = "$want_hash" ]; then
  installed="$(tail -n +2 "$stamp")"
else
  rm -f "$stamp"
fi
extras="$installed"
for extra in ${EXTRAS//,/ }; do
  grep -qx -- "$extra" <<<"$installed" || extras="$(printf '%s\n%s' "$extras" "$extra")"
done
extras="$(sed '/^$/d' <<<"$extras")"
if [ ! -f "$stamp" ] || [ "$extras" != "$installed" ]; then
  joined="$(paste -sd, - <<<"$extras")"
  echo "setup_env: installing maxtext_netdata${joined:+[$joined]} (pinned by constraints.txt)" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    -c "$ROOT/constraints.txt" -e "${ROOT}${joined:+[${joined}]}" >&2
  printf '%s\n%s\n' "$want_hash" "$extras" | sed '/^$/d' >"$stamp"
fi

export PATH="$VENV/bin:$PATH"
export VIRTUAL_ENV="$VENV"
