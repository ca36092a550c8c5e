"""Fixtures shared by the test modules."""

import glob
import os

import pytest

from maxtext_netdata.data.synthetic.generate import generate
from maxtext_netdata.kernels import warmup

# Every child process prints its threads' stacks on SIGABRT: a test whose run hangs sends one
# before killing it (tests/helpers/processes.py), so the failure says where the run was.
os.environ.setdefault("PYTHONFAULTHANDLER", "1")


@pytest.fixture(scope="session")
def sample_dir(tmp_path_factory) -> str:
  """A folder of 4 time-sorted raw parquet shards, 80,000 rows in all (`generate`, seed 0)."""
  out = str(tmp_path_factory.mktemp("sample"))
  generate(out, rows=80_000, shards=4, seed=0, progress=False)
  return out


@pytest.fixture(scope="session")
def sample_files(sample_dir) -> list[str]:
  """The parquet files of `sample_dir`, in time order."""
  return sorted(glob.glob(os.path.join(sample_dir, "*.parquet")))


@pytest.fixture(autouse=True, scope="module")
def _shm_entries_by_module(request):
  """With NETDATA_SHM_LOG set (scripts/test.sh sets it), appends `<entry> <module>` for each
  /dev/shm entry that appeared while the module ran and is still there after it: the lines
  scripts/test.sh reads to name the module behind an entry the suite left behind (in-process
  Grain segments are unlinked only when pytest exits, so an entry here is not yet a leak).
  With the suite on several worker processes, a module that ran at the same time on another
  worker can be named beside the one that left the entry."""
  log = os.environ.get("NETDATA_SHM_LOG")
  before = set(os.listdir("/dev/shm")) if log else set()
  yield
  if log:
    new = sorted(set(os.listdir("/dev/shm")) - before)
    if new:
      with open(log, "a") as f:
        f.writelines(f"{entry} {request.module.__name__}\n" for entry in new)


@pytest.fixture(autouse=True)
def _kernel_warmups_end_in_their_test():
  """Waits, after each test, for the kernel warm-up threads it started (`kernels.warmup`): a
  compile on a machine's first run takes seconds and says so on stderr when it ends, and
  that line belongs to the test that started it, not to a later one that checks its own
  stderr line by line."""
  yield
  warmup.join(timeout=300)
