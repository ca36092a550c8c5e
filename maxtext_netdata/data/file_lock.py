"""One writer at a time: an exclusive `flock` on a lock file, released by the kernel when its
holder dies, even by SIGKILL, so a folder a killed run left is known to be nobody's.

Our own rather than the `filelock` package's: the holder removes the file when done, and a
waiter that wakes holding a removed file opens it again, so no lock file outlives its run;
`filelock` leaves its files in place, which in a dataset's folder would be a file no run of
ours wrote. On a shared mount it works where the filesystem supports `flock` (NFSv4, Lustre;
not GCS FUSE).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Callable, Iterator

# `flock`'s errors where the filesystem has no locks (NFSv3 without lockd, some FUSE mounts).
NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL})


@contextlib.contextmanager
def held(path: str, busy: Callable[[], None]) -> Iterator[None]:
  """Hold the lock of file `path` (created if need be) while the block runs; the file is
  removed after it. When another process holds it, `busy()` is called once: raising refuses,
  returning waits for the holder."""
  told = False
  while True:
    f = open(path, "a")  # noqa: SIM115 (closed below, or after the block)
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      if not isinstance(e, BlockingIOError):
        f.close()
        with contextlib.suppress(OSError):
          os.remove(path)
        raise
      try:
        if not told:
          told = True
          busy()
        fcntl.flock(f, fcntl.LOCK_EX)
      except BaseException:
        f.close()
        raise
    try:
      current = os.stat(path).st_ino == os.fstat(f.fileno()).st_ino
    except FileNotFoundError:
      current = False
    if current:
      break
    f.close()  # the holder removed it as we waited: open the next one
  try:
    yield
  finally:
    os.remove(path)
    f.close()
