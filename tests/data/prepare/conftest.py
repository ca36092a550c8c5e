"""Fixtures of the prepare tests."""

import pytest

from maxtext_netdata.data.synthetic.generate import generate


@pytest.fixture(scope="module")
def days(tmp_path_factory):
  """Four time-ordered files ("days") of 200,000 rows in all."""
  return generate(
    str(tmp_path_factory.mktemp("days")), rows=200_000, shards=4, seed=3, progress=False
  )
