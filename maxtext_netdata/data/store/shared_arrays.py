"""Arrays computed once and shared by every process through files (`cached_arrays`): the
epoch plans kept in a store's `plans/` folder."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import uuid
from collections.abc import Callable

import numpy as np


def cached_arrays(
  folder: str,
  key: str,
  compute: Callable[[], dict[str, np.ndarray]],
  prune: Callable[[str], bool] | None = None,
) -> dict[str, np.ndarray]:
  """The arrays of `key`, computed once and kept as `.npy` files in `<folder>/<key>/`.

  Every process (and Grain worker) that asks maps the same files read-only, so the arrays sit
  once in page cache instead of once per process; one process computes them while the others
  wait on a lock file (`flock`), and the folder appears by an atomic rename, complete or not
  at all. After writing, the entries whose name `prune` accepts are deleted (a process that
  still maps them keeps its pages). Where `folder` cannot be written (a read-only mount), the
  arrays are computed in this process and not kept. `key` must name everything the arrays
  depend on.
  """
  final = os.path.join(folder, key)
  try:
    os.makedirs(folder, exist_ok=True)
    lock = open(os.path.join(folder, f".lock-{key}"), "a")  # noqa: SIM115 (closed below)
  except OSError:
    return compute()
  with contextlib.closing(lock):
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not os.path.isdir(final):
      arrays = compute()
      tmp = os.path.join(folder, f".tmp-{key}-{uuid.uuid4().hex[:8]}")
      try:
        os.makedirs(tmp)
        for name, array in arrays.items():
          np.save(os.path.join(tmp, f"{name}.npy"), np.ascontiguousarray(array))
        os.rename(tmp, final)
      except OSError:
        return arrays  # not kept: this process uses what it computed
      finally:
        shutil.rmtree(tmp, ignore_errors=True)
      for name in os.listdir(folder):
        entry = name.removeprefix(".lock-")
        if entry != key and not entry.startswith(".tmp-") and prune is not None and prune(entry):
          path = os.path.join(folder, name)
          if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
          else:
            with contextlib.suppress(OSError):
              os.remove(path)
  return {
    name[: -len(".npy")]: np.load(os.path.join(final, name), mmap_mode="r")
    for name in sorted(os.listdir(final))
  }
