"""The flat modules of `data/` before its split by stage stay importable, with a warning."""

import importlib

import pytest

from maxtext_netdata import data


@pytest.mark.parametrize("old", sorted(data._MOVED))
def test_an_old_module_name_gives_the_moved_module_and_says_where(old):
  new = importlib.import_module(f"maxtext_netdata.data.{data._MOVED[old]}")
  with pytest.warns(
    DeprecationWarning, match=f"maxtext_netdata.data.{old} moved to {new.__name__}"
  ):
    assert getattr(data, old) is new


def test_the_documented_entry_point_of_prepare_is_where_it_was():
  from maxtext_netdata.data.prepare import ensure_prepared  # noqa: PLC0415
  from maxtext_netdata.data.prepare.prepare import ensure_prepared as moved  # noqa: PLC0415

  assert ensure_prepared is moved


def test_an_unknown_name_is_an_attribute_error():
  with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
    data.nothing_here  # noqa: B018
