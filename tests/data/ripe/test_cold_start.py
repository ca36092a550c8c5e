"""`ingest`'s first run on a machine (an empty numba cache): the blocks mapped while the
kernels compile on a thread give the same output as a run with every kernel compiled.

- a handover from the reference path to the scanner at any block gives the same shards,
  marker and first error (the real scanner and reference; only the block where the scanner
  takes over is forced);
- the uncompiled stand-ins used while the kernels compile (`ip_text._parse_python`, numpy's
  gather, `json_scan._object_lines_python`) answer as the kernels do where it matters; a JSON
  array split by `json_array._split_numpy` up to any piece gives the same output;
- `maxtext-netdata ingest` in a fresh process with an empty NUMBA_CACHE_DIR writes the same
  bytes as with the kernels compiled, and names the same bad line.
"""

import glob
import os
import signal
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from maxtext_netdata.data.raw import addresses, ip_text
from maxtext_netdata.data.ripe import json_array, reference, scan
from maxtext_netdata.data.ripe.ingest import ingest
from maxtext_netdata.data.ripe.scanner import json_scan
from maxtext_netdata.errors import DataError
from maxtext_netdata.kernels import warmup
from tests.data.raw.test_ip_text import _corpus as address_corpus
from tests.data.ripe.test_differential import _corpus as results_corpus
from tests.helpers.processes import with_sigint_default

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


@pytest.fixture(scope="module")
def lines():
  """Mutated results with bad, blank and broken lines between them (test_differential's)."""
  return results_corpus(seed=11, results=600)[0]


def _outputs(out_dir) -> dict[str, bytes]:
  names = sorted(glob.glob(os.path.join(out_dir, "*.parquet"))) + [
    os.path.join(out_dir, ".complete")
  ]
  return {os.path.basename(n): open(n, "rb").read() for n in names}


def _run(path, out, skip_bad, **kwargs):
  try:
    ingest([path], out, skip_bad=skip_bad, progress=False, block_bytes=4096, **kwargs)
  except DataError as e:
    return str(e).replace(out, "OUT")
  return _outputs(out)


@pytest.mark.parametrize("skip_bad", [True, False])
def test_handover_at_any_block_gives_the_same_output(tmp_path, monkeypatch, lines, skip_bad):
  path = str(tmp_path / "results.json")
  with open(path, "wb") as f:
    f.write(b"\n".join(lines) + b"\n")
  expected = _run(path, str(tmp_path / "reference"), skip_bad, scan=False)
  if skip_bad:
    assert isinstance(expected, dict) and len(expected) > 1
  else:
    assert isinstance(expected, str) and "line" in expected
  total = len(lines)
  for k, first_line in enumerate([0, 1, total // 5, total // 2, total - 3, total + 1]):
    monkeypatch.setattr(scan, "_takes", lambda block, at=first_line: block.first_line >= at)
    got = _run(path, str(tmp_path / f"handover-{k}"), skip_bad, readers=3)
    assert got == expected, f"handover at line {first_line}"


@pytest.fixture(scope="module")
def arrays():
  """A JSON array of test_differential's mutated results and non-objects, and the same array
  with a comma and no element near its end (an error of the file, even with --skip-bad)."""
  elements = results_corpus(seed=12, results=600)[1]
  at = len(elements) - 5
  good, broken = (
    b"[\n" + b",\n".join(elements[:at]) + comma + b",\n".join(elements[at:]) + b"\n]\n"
    for comma in (b",\n", b",,\n")
  )
  return good, broken


@pytest.mark.parametrize("skip_bad", [pytest.param(True, marks=pytest.mark.slow), False])
@pytest.mark.parametrize("broken", [False, True])
def test_array_split_by_the_stand_in_then_the_kernel_gives_the_same_output(
  tmp_path, monkeypatch, arrays, skip_bad, broken
):
  """A JSON array's pieces split by `json_array._split_numpy` until its compile ends, at any
  piece, then by `_split`: the same shards, marker and error as with `_split` throughout."""
  path = str(tmp_path / "results.json")
  with open(path, "wb") as f:
    f.write(arrays[broken])
  expected = _run(path, str(tmp_path / "kernel"), skip_bad)
  if broken and skip_bad:
    assert isinstance(expected, str) and "array element" in expected and "no value" in expected
  elif skip_bad:
    assert isinstance(expected, dict) and len(expected) > 1
  else:
    assert isinstance(expected, str) and "array element" in expected
  pending = warmup.pending
  for k, pieces in enumerate([1, 7, 40, 10**6]):
    splits = []  # `split`'s calls so far: the first `pieces` of them take the stand-in

    def compiling(name, pieces=pieces, splits=splits):
      if name != json_array.WARMUP:
        return pending(name)
      splits.append(name)
      return len(splits) <= pieces

    monkeypatch.setattr(warmup, "pending", compiling)
    got = _run(path, str(tmp_path / f"handover-{k}"), skip_bad, readers=2)
    monkeypatch.setattr(warmup, "pending", pending)
    assert got == expected, f"handover after {pieces} pieces"
    assert len(splits) > min(pieces, 3)


def test_address_parser_stand_in_is_the_compiled_parser():
  texts = address_corpus(4000, seed=3) + ["", "1.2.3.4\x00", "::ffff:1.2.3.4", "é"]
  array = pa.array(texts)
  offsets, data = ip_text.string_buffers(array)
  compiled = np.empty((len(texts), 16), np.uint8), np.empty(len(texts), np.int8)
  python = np.empty((len(texts), 16), np.uint8), np.empty(len(texts), np.int8)
  ip_text._parse_all(offsets, data, *compiled)
  ip_text._parse_python(offsets, data, *python)
  assert (compiled[1] == python[1]).all()
  assert (compiled[0] == python[0]).all()
  assert {4, 6, ip_text.EMPTY, ip_text.INVALID} <= set(python[1].tolist())


def test_address_checks_while_the_parser_compiles_are_the_same(monkeypatch):
  texts = address_corpus(3000, seed=5) + [None, ""]
  column = pa.array(texts)
  versions = np.random.default_rng(0).choice([4, 6], len(texts))
  compiled = addresses.parse_addresses(column, versions, source="t", column_name="a")
  monkeypatch.setattr(ip_text.warmup, "pending", lambda name: name == ip_text.WARMUP)
  python = addresses.parse_addresses(column, versions, source="t", column_name="a")
  assert (compiled[0] == python[0]).all() and (compiled[1] == python[1]).all()
  assert compiled[1].any() and not compiled[1].all()
  bad_index = np.array([0, len(texts)], np.int32)
  parsed, family = ip_text.parse(pa.array(["10.0.0.1"]), spare=1)
  assert ip_text.gather_rows(bad_index, parsed, family, np.full(2, 4)) is None


def test_line_screen_stand_in_gives_the_references_verdicts(lines):
  for line in lines:
    buf = np.frombuffer(line + b"\n", np.uint8)
    stand_in = bool(json_scan._object_lines_python(buf)[0])
    if stand_in and line.strip(b" \t\r"):  # left unscreened: the screen accepts it
      assert reference._screen(line)[0] is None, line
    if json_scan._object_lines(buf)[0]:
      assert stand_in, line
  data = b"\n".join(lines) + b"\n"
  with_kernel = reference._screen_refuses_a_line(data)
  pieces = [b"\n".join(lines[i : i + 4]) + b"\n" for i in range(0, len(lines), 4)]
  verdicts = [reference._screen_refuses_a_line(p) for p in pieces]
  with pytest.MonkeyPatch.context() as m:
    m.setattr(json_scan.warmup, "pending", lambda name: name == json_scan.WARMUP)
    assert reference._screen_refuses_a_line(data) == with_kernel
    assert [reference._screen_refuses_a_line(p) for p in pieces] == verdicts
  assert any(verdicts) and not all(verdicts)


def _cold_ingest(path, out, cache, *flags):
  env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
  return subprocess.run(
    [sys.executable, "-m", "maxtext_netdata", "ingest", path, "--out", out, *flags],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )


def test_first_run_on_a_machine_writes_what_a_warm_run_writes(tmp_path, lines):
  path = str(tmp_path / "results.json")
  with open(path, "wb") as f:
    f.write(b"\n".join(lines) + b"\n")
  warm = str(tmp_path / "warm")
  ingest([path], warm, skip_bad=True, progress=False)
  cold = _cold_ingest(path, str(tmp_path / "cold"), tmp_path / "cache", "--skip-bad")
  assert cold.returncode == 0, cold.stderr
  assert _outputs(str(tmp_path / "cold")) == _outputs(warm)
  with pytest.raises(DataError) as error:
    ingest([path], str(tmp_path / "warm-error"), progress=False)
  cold = _cold_ingest(path, str(tmp_path / "cold-error"), tmp_path / "cache-2")
  assert cold.returncode != 0
  assert str(error.value).replace("warm-error", "cold-error") in cold.stderr


_WAITS_AT_EXIT = """
import atexit, sys, time
from maxtext_netdata.data.ripe import scan
from maxtext_netdata.kernels import warmup
# The scanner's compile, still running when the run's output is written: a step that ends late.
warmup.start([(scan._SCANNER, lambda: time.sleep(120), None)])
atexit.register(scan._finish_scanner, scan._Loading(0, 2.0))
"""


def test_ctrl_c_ends_the_wait_for_the_scanner_compile_at_exit():
  """A first run whose output is written waits at exit for the scanner's compile; Ctrl-C there
  ends the process at once with one line, not a traceback (nor after the compile)."""
  process = subprocess.Popen(
    # Ctrl-C's default disposition: a child of a process that ignores SIGINT (a background
    # job, some pytest workers) inherits the ignore, and Python then never raises
    # KeyboardInterrupt.
    with_sigint_default([sys.executable, "-c", _WAITS_AT_EXIT]),
    stderr=subprocess.PIPE,
    text=True,
    env={**os.environ, "PYTHONPATH": ROOT},
  )
  try:
    assert "Ctrl-C skips it" in process.stderr.readline()
    process.send_signal(signal.SIGINT)
    _, rest = process.communicate(timeout=30)
  finally:
    process.kill()
  assert rest.strip() == "ingest: compile skipped; the next run compiles it"
  assert process.returncode == 0
