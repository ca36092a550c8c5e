"""numba's cache of the project's kernels follows every project source they import."""

import glob
import os
import re
import shutil
import subprocess
import sys

import maxtext_netdata

PACKAGE = os.path.dirname(maxtext_netdata.__file__)

_KERNEL = """from maxtext_netdata.data import cache_probe_constant as constant
from maxtext_netdata.kernels import kernel_cache
import numba

kernel_cache.install()


@numba.njit(cache=True)
def value():
  return constant.VALUE
"""


def _value(root) -> int:
  """The probe kernel's value in a fresh process; negative when loaded from the cache."""
  run = subprocess.run(
    [
      sys.executable,
      "-c",
      "from maxtext_netdata.data import cache_probe as p; v = p.value();"
      " print(-v if p.value.stats.cache_hits else v)",
    ],
    env={**os.environ, "PYTHONPATH": str(root), "NUMBA_CACHE_DIR": str(root / "numba-cache")},
    cwd=root,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert run.returncode == 0, run.stderr[-2000:]
  return int(run.stdout)


def test_a_cached_kernel_is_compiled_again_when_a_module_it_imports_changes(tmp_path):
  # A copy of the package with a kernel whose result is a constant of another module: numba
  # alone keys the cache on the kernel's file and would give the old constant after the edit.
  shutil.copytree(
    PACKAGE, tmp_path / "maxtext_netdata", ignore=shutil.ignore_patterns("__pycache__")
  )
  data = tmp_path / "maxtext_netdata" / "data"
  (data / "cache_probe.py").write_text(_KERNEL)
  # `prepare` is imported only inside a function: nothing of it is compiled into the kernel.
  constant = "VALUE = {}\n\n\ndef later():\n  from maxtext_netdata.data import prepare\n"
  (data / "cache_probe_constant.py").write_text(constant.format(1))
  assert _value(tmp_path) == 1  # compiled
  assert glob.glob(str(tmp_path / "numba-cache" / "**" / "*.nbi"), recursive=True)
  assert _value(tmp_path) == -1  # loaded
  with open(data / "prepare.py", "a", encoding="utf-8") as f:
    f.write("# edited\n")
  assert _value(tmp_path) == -1  # still loaded: not a source of the kernel
  (data / "cache_probe_constant.py").write_text(constant.format(2))
  assert _value(tmp_path) == 2
  assert _value(tmp_path) == -2  # and from the cache written by the run before


def test_every_module_with_a_cached_kernel_installs_the_project_stamp_first():
  for path in glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True):
    with open(path, encoding="utf-8") as f:
      text = f.read()
    first = re.search(r"^@.*\bcache\s*=\s*True", text, re.MULTILINE)
    if first is None or path.endswith("kernel_cache.py"):
      continue
    install = text.find("kernel_cache.install()")
    assert 0 <= install < first.start(), f"{path}: call kernel_cache.install() before its kernels"
