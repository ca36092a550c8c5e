"""The processes patch: MaxText's iterators start and end our loading processes cleanly.

The train iterator's Grain workers start at its first batch; the eval iterator loads
in-process (`SplitBatches.host_batches`), and each MaxText `reset()` closes the iterator it
replaces, which MaxText itself drops without closing. Nothing of MaxText is replaced: the
network_grain iterators (`patch_data`) load through `HostBatches`.

MaxText drops its train iterator without closing it when training ends, and when training is
stopped by an exception (Ctrl-C, our SIGTERM exception) the traceback keeps it alive until the
interpreter tears itself down. Closed then, from MaxText's `__del__`, it meets threads that no
longer run: Grain's unlink pool never answers, and joining the loader's threads can wait for
ever (a run still going two minutes after a SIGTERM). `close_all` closes every open iterator
while the interpreter still runs: `maxtext_train.run` calls it on its way out, and `install`
registers it with `atexit` for MaxText's own entry points.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from maxtext_netdata.maxtext.patch_checkpoints import PositionIterator

if TYPE_CHECKING:
  from maxtext_netdata.input_pipeline.network_splits import SplitBatches


_OPEN: weakref.WeakSet[HostBatches] = weakref.WeakSet()


def close_all() -> None:
  """Closes the current iterator of every `HostBatches` still alive (its workers end, its
  /dev/shm blocks are unlinked); a later `iter()` starts a new one."""
  for batches in list(_OPEN):
    batches.close()


class HostBatches:
  """Iterable of one split's host batches: each `iter()` starts at step 0 and closes the
  previous iterator.

  MaxText's `reset()` re-iterates its dataloader before every eval and drops the old iterator
  without closing it; closing it here ends its read threads (and, for train, its workers).
  """

  def __init__(self, split: SplitBatches, lo: int, hi: int):
    self._split = split
    self._rows = (lo, hi)
    self._current: PositionIterator | None = None
    _OPEN.add(self)

  def __iter__(self):
    self.close()
    self._current = PositionIterator(self._split.host_batches(*self._rows))
    return self._current

  def close(self) -> None:
    if self._current is not None:
      self._current.close()
      self._current = None
