"""A numba kernel's own Python code, callable in a process where the kernel is compiled too.

`python_function(kernel)` returns the function `kernel` (a numba dispatcher) was made from,
with every dispatcher among its module's globals (the helpers it calls) replaced by theirs,
so that the call runs no compiled code and never waits for a compile. It gives the
compiled kernel's answers where the code is written for both: numpy scalars of fixed width
(`np.int64(...)`, `np.uint64(...)`) where numba's and numpy's type promotions could differ,
e.g. a uint8 store byte plus an int64 constant, not a Python int, which numpy 2 keeps uint8.
Integer overflow wraps in both; numpy's warning of it is silenced, as numba has none. A
kernel reached through a module attribute (`module.kernel(...)`) stays compiled.

Its use: the exact uncompiled stand-in a caller takes while `kernels.warmup` compiles the
kernel on a thread (a machine's first run), ~200-300x slower than the machine code but there at
once. Tests compare the two on the same inputs. Our own code because numba's only Python
mode, NUMBA_DISABLE_JIT, is process-wide and read at import.
"""

from __future__ import annotations

import functools
import types

import numpy as np
from numba.core.dispatcher import Dispatcher


def _rebound(function: types.FunctionType, namespace: dict) -> types.FunctionType:
  return types.FunctionType(
    function.__code__, namespace, function.__name__, function.__defaults__, function.__closure__
  )


def _namespace(globals_: dict, namespaces: dict[int, dict]) -> dict:
  """A copy of a module's globals whose dispatchers are their Python functions, bound to
  the copies (one per module, shared by the functions of that module)."""
  namespace = namespaces.get(id(globals_))
  if namespace is None:
    namespace = namespaces[id(globals_)] = dict(globals_)
    for name, value in globals_.items():
      if isinstance(value, Dispatcher):
        namespace[name] = _rebound(value.py_func, _namespace(value.py_func.__globals__, namespaces))
  return namespace


def python_function(kernel: Dispatcher):
  """`kernel`'s Python code and that of the kernels it calls by name (see the module doc)."""
  function = _rebound(kernel.py_func, _namespace(kernel.py_func.__globals__, {}))

  @functools.wraps(kernel.py_func)
  def call(*args):
    with np.errstate(over="ignore"):
      return function(*args)

  return call
