"""numba's on-disk cache of the project's kernels, keyed on every project source they import.

numba keys a cached kernel on the text of its own file alone. Our kernels compile in
functions and constants of other project modules (`json_scan`'s pieces in the ingest
scanner, `format.tokens` and `input_pipeline.rng` in the batch kernel): after an edit there,
or an upgrade of the package that leaves an old `__pycache__` behind (pip removes only the
files it installed), numba would load machine code built from the old text and give
silently different results. `install` puts first in numba's list of cache locators ones
whose stamp hashes the kernel's file and every project module it imports, transitively
(read from the top-level import statements, a handful of small files, once a process).

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


def _file_of(name: str, modules_only: bool = False) -> str | None:
  """The source file of project module `name` (a package's `__init__`, unless
  `modules_only`), or None (not ours, or not a module)."""
  parts = name.split(".")
  if parts[0] != _PACKAGE:
    return None
  base = os.path.join(_ROOT, *parts[1:])
  candidates = (
    (base + ".py",) if modules_only else (base + ".py", os.path.join(base, "__init__.py"))
  )
  for path in candidates:
    if os.path.isfile(path):
      return path
  return None


def _top_level(body: list[ast.stmt]):
  """The statements a module runs when imported: its body, inside `if`/`try`/`with` blocks
  too, but not inside functions or classes (whose imports define no global of the module)."""
  for node in body:
    yield node
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
      for field in ("body", "orelse", "finalbody", "handlers"):
        yield from _top_level(getattr(node, field, []))


@functools.cache
def _imports(path: str) -> tuple[str, ...]:
  """The project source files whose names the file at `path` binds when imported.

  What numba compiles into a kernel comes from its module's globals: the functions and
  values bound by the module's top-level imports, each defined by the top-level code of its
  own module. `from package import module` names the module's file, not the package's
  `__init__` (it binds nothing of it); `from module import name` names the module's file.
  Imports inside functions bind nothing a kernel can see.
  """
  with open(path, "rb") as f:
    tree = ast.parse(f.read(), path)
  names = []
  for node in _top_level(tree.body):
    if isinstance(node, ast.Import):
      names += [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      for alias in node.names:
        submodule = f"{node.module}.{alias.name}"
        names.append(submodule if _file_of(submodule, modules_only=True) else node.module)
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
