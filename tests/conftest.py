"""Fixtures shared by the test modules."""

import glob
import os

import pytest

from maxtext_netdata.data.synthetic.generate import generate


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
