#!/usr/bin/env bash
# Creates .venv with Python 3.12 and installs the project through constraints.txt, then puts
# .venv/bin first on PATH and exports GLIBC_TUNABLES asking for huge pages (below).
# Idempotent: installs only when setup.py or constraints.txt change, or an extra is missing.
# Usage: source scripts/setup_env.sh [EXTRAS]   (EXTRAS default: test; "" for none)
# The work runs in a subshell with errexit: sourced into an interactive shell, it leaves that
# shell's options as they were and returns non-zero on failure instead of closing the shell.

_netdata_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_netdata_venv="${NETDATA_VENV:-$_netdata_root/.venv}"

_netdata_setup() (
  set -euo pipefail
  local_root="$1"
  wanted="$2"
  venv="$3"

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

  if [ ! -x "$venv/bin/python" ]; then
    PY="$(find_python)" || { echo "setup_env: python3.12 not found (set PYTHON=/path/to/python3.12)" >&2; exit 1; }
    echo "setup_env: creating $venv with $PY" >&2
    "$PY" -m venv "$venv"
  fi

  # The stamp holds a hash of setup.py and constraints.txt, then one installed extra per line:
  # asking for extras already installed (run.sh's after test.sh's) installs nothing.
  stamp="$venv/.netdata-installed"
  want_hash="$(cat "$local_root/setup.py" "$local_root/constraints.txt" | sha256sum | cut -c1-16)"
  installed=""
  if [ "$(head -n 1 "$stamp" 2>/dev/null)" = "$want_hash" ]; then
    installed="$(tail -n +2 "$stamp")"
  else
    rm -f "$stamp"
  fi
  extras="$installed"
  for extra in ${wanted//,/ }; do
    grep -qx -- "$extra" <<<"$installed" || extras="$(printf '%s\n%s' "$extras" "$extra")"
  done
  extras="$(sed '/^$/d' <<<"$extras")"
  if [ ! -f "$stamp" ] || [ "$extras" != "$installed" ]; then
    joined="$(paste -sd, - <<<"$extras")"
    echo "setup_env: installing maxtext_netdata${joined:+[$joined]} (pinned by constraints.txt)" >&2
    target="${local_root}${joined:+[${joined}]}"
    pip_install() {
      "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" >&2
    }
    # uv (pinned) downloads and installs the ~190 packages in parallel, where pip takes them
    # one at a time: a fresh .venv in a fraction of pip's time (docs/performance.md, "Set-up").
    # It trusts the system's certificates, as pip does where pip.conf names them; pip's own
    # settings (a private index in pip.conf, say) are pip's alone, so where uv cannot be
    # installed or cannot install, pip does the work.
    if ! {
      pip_install -c "$local_root/constraints.txt" uv &&
        "$venv/bin/uv" pip install --quiet --system-certs --python "$venv/bin/python" \
          --compile-bytecode -c "$local_root/constraints.txt" -e "$target" >&2
    }; then
      echo "setup_env: installing with pip instead of uv" >&2
      pip_install --upgrade pip
      pip_install -c "$local_root/constraints.txt" -e "$target"
    fi
    printf '%s\n%s\n' "$want_hash" "$extras" | sed '/^$/d' >"$stamp"
  fi
)

# Not in a condition: bash ignores errexit inside a function called from one.
_netdata_setup "$_netdata_root" "${1-test}" "$_netdata_venv"
_netdata_status=$?
if [ "$_netdata_status" -eq 0 ]; then
  export PATH="$_netdata_venv/bin:$PATH"
  export VIRTUAL_ENV="$_netdata_venv"
  # Transparent huge pages for glibc's large blocks: XLA's CPU step 1.34x as fast
  # (maxtext_netdata/cli/huge_pages.py says why). A value naming the tunable is kept;
  # NETDATA_HUGE_PAGES=0 leaves the environment alone. Older glibc ignores the name.
  case ":${GLIBC_TUNABLES:-}:" in
  *:glibc.malloc.hugetlb=*) ;;
  *) [ "${NETDATA_HUGE_PAGES:-1}" = 0 ] ||
    export GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.hugetlb=1" ;;
  esac
fi
unset -f _netdata_setup
unset _netdata_root _netdata_venv
if [ "$_netdata_status" -ne 0 ]; then
  unset _netdata_status
  # shellcheck disable=SC2317  # exit: when the script is run, not sourced
  return 1 2>/dev/null || exit 1
fi
unset _netdata_status
