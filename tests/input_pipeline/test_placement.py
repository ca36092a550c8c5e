"""`placement.place` / `interface.to_global`: the arrays of `jax.make_array_from_process_local_data`.

Across processes: tests/distributed/test_multihost.py (2 and 4 processes, an interleaved mesh).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from maxtext_netdata.input_pipeline import interface

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Runs with 4 CPU devices; prints OK when every sharding gives the public function's arrays.
_FOUR_DEVICES = textwrap.dedent(
  """
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from maxtext_netdata.input_pipeline import placement
    devices = jax.devices()
    for order in ([0, 1, 2, 3], [2, 0, 3, 1]):
      mesh = Mesh(np.array([devices[i] for i in order]), ("data",))
      for spec in (P("data"), P(), P(None, "data")):
        sharding = NamedSharding(mesh, spec)
        batch = {"a": np.arange(8 * 16, dtype=np.int32).reshape(8, 16),
                 "b": np.arange(8 * 16, dtype=np.float32).reshape(8, 16) / 7}
        shapes = {key: value.shape for key, value in batch.items()}
        got = placement.place(batch, sharding, shapes)
        want = jax.make_array_from_process_local_data({k: sharding for k in batch}, batch, shapes)
        for key in batch:
          g, w = got[key], want[key]
          assert (g.sharding, g.shape, g.dtype, g.aval, g.committed) == (
              w.sharding, w.shape, w.dtype, w.aval, w.committed), (order, spec, key)
          for a, b in zip(g.addressable_shards, w.addressable_shards, strict=True):
            assert a.device == b.device and a.index == b.index, (order, spec, key)
            assert np.array_equal(a.data, b.data), (order, spec, key)
    print("OK")
  """
)


def test_four_devices_get_the_shards_of_the_public_function():
  env = dict(
    os.environ,
    XLA_FLAGS="--xla_force_host_platform_device_count=4",
    JAX_PLATFORMS="cpu",
    PYTHONPATH=REPO,
  )
  result = subprocess.run(
    [sys.executable, "-c", _FOUR_DEVICES], env=env, capture_output=True, text=True, timeout=120
  )
  assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]


def _sharding():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))


def test_to_global_holds_the_host_rows_and_they_outlive_the_host_arrays():
  sharding = _sharding()
  host = {"inputs": np.arange(4 * 8, dtype=np.int32).reshape(4, 8)}
  expected = host["inputs"].copy()
  placed = interface.to_global(host, sharding, 4)["inputs"]
  assert placed.sharding == sharding and placed.shape == (4, 8)
  del host
  assert np.array_equal(np.asarray(placed), expected)


@pytest.mark.parametrize(
  "batch, shapes",
  [
    ({"x": np.zeros((4, 8), np.int64)}, {"x": (4, 8)}),  # converted to int32 without x64
    ({"x": np.zeros((4, 8), np.int32)[:, ::2]}, {"x": (4, 4)}),  # a strided view: fine
  ],
)
def test_what_the_fast_path_leaves_to_jax_still_matches_it(batch, shapes):
  sharding = _sharding()
  got = interface.to_global(batch, sharding, 4)["x"]
  want = jax.make_array_from_process_local_data(sharding, batch["x"], shapes["x"])
  assert got.dtype == want.dtype and got.shape == want.shape
  assert np.array_equal(np.asarray(got), np.asarray(want))


def test_a_global_shape_this_process_cannot_hold_is_jax_s_error():
  with pytest.raises(ValueError, match="global_shape"):
    interface.to_global({"x": np.zeros((4, 8), np.int32)}, _sharding(), 8)
