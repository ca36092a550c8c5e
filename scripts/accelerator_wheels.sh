#!/usr/bin/env bash
# Fetches, on a machine with network, the wheels scripts/accelerator_check.sh installs on a GPU
# VM without network:   bash scripts/accelerator_wheels.sh DIR   (DIR: .whl at the repo root)
# The VM's image (Python 3.12, x86-64) has jax with its CUDA plugin, flax, optax,
# orbax-checkpoint, numba, numpy, pyarrow and the small packages listed in IMAGE below; it
# lacks Grain and its array_record and portpicker, pydantic (with pydantic-core,
# annotated-types, typing-inspection), tensorboardX and indexed_bzip2 (bz2 on every core:
# benchmarks/bench_decompress.py runs there). typing_extensions and protobuf are
# there at versions not known here, below what pydantic (>= 4.16) and Grain (>= 5.28.3) need
# perhaps, so they come too: newer ones serve older users. duckdb, which only `ingest`'s
# reference reader imports, stays behind (24 MiB). Versions are constraints.txt's. Then every
# wheel's Requires-Dist must be met by the wheels or the image, and the total stays <= 40 MiB.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:?usage: bash scripts/accelerator_wheels.sh DIR}"
MAX_BYTES=$((40 * 1024 * 1024))
WHEELS=(
  grain array_record portpicker
  pydantic pydantic_core annotated-types typing-inspection typing_extensions
  tensorboardX protobuf indexed-bzip2
)
# What the image has that those wheels need (the accelerator VM's package list).
IMAGE="absl-py cloudpickle etils fsspec numpy packaging psutil zipp"

if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

# NAME -> NAME==VERSION from constraints.txt (names compared as pip does: case, - and _ alike).
pins=()
for name in "${WHEELS[@]}"; do
  pin="$(NAME="$name" "$PYTHON" - "$ROOT/constraints.txt" <<'EOF'
import os, re, sys
want = re.sub(r"[-_.]+", "-", os.environ["NAME"]).lower()
for line in open(sys.argv[1], encoding="utf-8"):
  name, _, version = line.split("#")[0].strip().partition("==")
  if version and re.sub(r"[-_.]+", "-", name).lower() == want:
    print(f"{name}=={version}")
EOF
)"
  if [ -z "$pin" ]; then
    echo "error: $name is not pinned in constraints.txt" >&2
    exit 2
  fi
  pins+=("$pin")
done

mkdir -p "$DIR"
echo "downloading into $DIR: ${pins[*]}"
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$DIR" "${pins[@]}"

# Each wheel's Requires-Dist (markers evaluated for Linux, CPython 3.12, no extras) against the
# wheels and the image; one version per package, since pip --target refuses two.
IMAGE="$IMAGE" "$PYTHON" - "$DIR" "$MAX_BYTES" "${pins[@]}" <<'EOF'
import collections, os, re, sys, zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

folder, max_bytes, pins = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
def norm(name):
  return re.sub(r"[-_.]+", "-", name).lower()
wanted = {norm(p.partition("==")[0]): p.partition("==")[2] for p in pins}
image = {norm(n) for n in os.environ["IMAGE"].split()}
environment = {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
               "python_version": "3.12", "python_full_version": "3.12.3",
               "implementation_name": "cpython", "platform_machine": "x86_64", "extra": ""}
wheels, found, problems = {}, collections.defaultdict(list), []
for path in sorted(folder.glob("*.whl")):
  with zipfile.ZipFile(path) as archive:
    meta_name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    meta = Parser().parsestr(archive.read(meta_name).decode())
  found[norm(meta["Name"])].append(path.name)
  wheels[norm(meta["Name"])] = (Version(meta["Version"]), meta.get_all("Requires-Dist") or [], path)
for name, files in found.items():
  if len(files) > 1:
    problems.append(f"{name}: {len(files)} wheels in {folder} ({', '.join(files)}); keep one")
for name in wanted:
  if name not in wheels:
    problems.append(f"{name}: no wheel downloaded")
total = 0
print(f"{'wheel':<70} {'MiB':>6}")
for name, (version, requires, path) in sorted(wheels.items()):
  size = path.stat().st_size
  total += size
  print(f"{path.name:<70} {size / 2**20:6.2f}")
  for text in requires:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate(environment):
      continue
    dep = norm(req.name)
    if dep in wheels:
      if not req.specifier.contains(wheels[dep][0], prereleases=True):
        problems.append(f"{name} needs {text}; the wheel is {dep} {wheels[dep][0]}")
    elif dep not in image:
      problems.append(f"{name} needs {text}: neither a wheel here nor in the image")
print(f"{'total':<70} {total / 2**20:6.2f}")
if total > max_bytes:
  problems.append(f"{total / 2**20:.1f} MiB of wheels, over {max_bytes / 2**20:.0f} MiB")
for problem in problems:
  print(f"error: {problem}", file=sys.stderr)
sys.exit(2 if problems else 0)
EOF
