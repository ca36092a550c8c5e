"""numba's on-disk cache of the project's kernels, keyed on every project source they import.

numba keys a cached kernel on the text of its own file alone. Our kernels compile in
functions and constants of other project modules (`json_scan`'s pieces in the ingest
scanner, `format.tokens` and `input_pipeline.rng` in the batch kernel): after an edit there,
or an upgrade of the package that leaves an old `__pycache__` behind (pip removes only the
files it installed), numba would load machine code built from the old text and give
silently different results. `install` puts first in numba's list of cache locators ones
whose stamp hashes the kernel's file and every project module it imports, transitively
(read from the import statements, at most a few dozen small files, once a process).

Every module with a `cache=True` kernel calls `install()` before its first decorator
(tests/data/test_kernel_cache.py checks this). Our own code because numba has no way to name
what else a cached function depends on.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os

from numba.core import caching

_PACKAGE = "maxtext_netdata"
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package's folder


def _file_of(name: str) -> str | None:
  """The source file of project module `name`, or None (not ours, or not a module)."""
  parts = name.split(".")
  if parts[0] != _PACKAGE:
    return None
  base = os.path.join(_ROOT, *parts[1:])
  for path in (base + ".py", os.path.join(base, "__init__.py")):
    if os.path.isfile(path):
      return path
  return None


@functools.cache
def _imports(path: str) -> tuple[str, ...]:
  """The project source files that the file at `path` imports (anywhere in it)."""
  with open(path, "rb") as f:
    tree = ast.parse(f.read(), path)
  names = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names += [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
  return tuple(sorted({f for f in map(_file_of, names) if f}))


@functools.cache
def stamp(path: str) -> str:
  """SHA-256 over the text of `path` and of every project file it imports, transitively."""
  seen, todo = set(), [path]
  while todo:
    current = todo.pop()
    if current not in seen:
      seen.add(current)
      todo += _imports(current)
  digest = hashlib.sha256()
  for current in sorted(seen):
    with open(current, "rb") as f:
      text = f.read()
    digest.update(f"{os.path.relpath(current, _ROOT)}\0{len(text)}\0".encode())
    digest.update(text)
  return digest.hexdigest()


class _ProjectStamp:
  """A numba locator that takes only the project's functions and stamps them with `stamp`."""

  def get_source_stamp(self):
    return stamp(self._py_file)

  @classmethod
  def from_function(cls, py_func, py_file):
    if not py_func.__module__.startswith(_PACKAGE + "."):
      return None
    return super().from_function(py_func, py_file)


_LOCATORS = [
  type(f"Project{base.__name__}", (_ProjectStamp, base), {})
  for base in (
    caching.UserProvidedCacheLocator,  # NUMBA_CACHE_DIR set
    caching.InTreeCacheLocator,  # `__pycache__` beside the source, when writable
    caching.UserWideCacheLocator,  # else the user's cache folder
  )
]


def install() -> None:
  """Make numba stamp the project's cached kernels with `stamp` (idempotent)."""
  classes = caching.CacheImpl._locator_classes
  if classes[: len(_LOCATORS)] != _LOCATORS:
    classes[:0] = _LOCATORS
