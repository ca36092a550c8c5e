"""Corrupted raw parquet through `prepare` and `tokenize`: the original rows, or one line naming it.

A seeded corpus of damaged copies (bit flips, truncations, zeroed ranges) of one generated
file. With page checksums in the file (`write_page_checksum`), every copy must either give
exactly the original's rows (the damage hit nothing read, e.g. statistics) or fail with exit
status 2 and one error line naming the file: never a traceback, a crash, or other rows.
Without checksums a flipped bit inside a value cannot be told from data, so there the rule is
only: no traceback and no crash.
"""

import glob
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from maxtext_netdata import cli
from maxtext_netdata.data.store import store
from maxtext_netdata.data.synthetic.generate import generate
from tests.helpers import REPO

ROOT = str(REPO)
COPIES = 60
TOKENIZE = ["--field-order", "hashed", "--timestamps", "abs"]


def _corrupt(data: bytes, rng: np.random.Generator, kind: int) -> bytes:
  out = bytearray(data)
  if kind == 0:  # a few flipped bits
    for _ in range(int(rng.integers(1, 4))):
      out[int(rng.integers(0, len(out)))] ^= 1 << int(rng.integers(0, 8))
  elif kind == 1:  # cut short
    out = out[: int(rng.integers(0, len(out)))]
  else:  # a zeroed range
    start = int(rng.integers(0, len(out)))
    stop = min(start + int(rng.integers(1, 65)), len(out))
    out[start:stop] = bytes(stop - start)
  return bytes(out)


def _corpus(base: str, folder: str, seed: int) -> list[str]:
  with open(base, "rb") as f:
    data = f.read()
  rng = np.random.default_rng(seed)
  os.makedirs(folder)
  paths = []
  for i in range(COPIES):
    damaged = _corrupt(data, rng, i % 3)
    assert damaged != data
    path = os.path.join(folder, f"copy-{i:02d}.parquet")
    with open(path, "wb") as f:
      f.write(damaged)
    paths.append(path)
  return paths


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> str:
  """The generated rows as written by a writer without page checksums (generate writes them)."""
  folder = str(tmp_path_factory.mktemp("generated"))
  path = generate(folder, rows=6_000, shards=1, seed=3, progress=False)[0]
  pq.write_table(pq.read_table(path), path, write_page_checksum=False)
  return path


@pytest.fixture(scope="module")
def checksummed(generated, tmp_path_factory) -> str:
  """The generated rows rewritten with page checksums, in four row groups."""
  path = str(tmp_path_factory.mktemp("checksummed") / "pings.parquet")
  pq.write_table(pq.read_table(generated), path, row_group_size=1_500, write_page_checksum=True)
  return path


def _run(capsys, argv) -> tuple[int, str, str]:
  code = cli.main(argv)
  captured = capsys.readouterr()
  return code, captured.out, captured.err


def _assert_one_error_line(command: str, path: str, err: str) -> None:
  assert "Traceback" not in err, err
  # `prepare` draws its progress on stderr with carriage returns; the error is its own line.
  errors = [line for line in re.split(r"[\r\n]", err) if "error:" in line]
  assert len(errors) == 1, err
  assert errors[0].startswith(f"maxtext-netdata {command}: error: {path}"), err


def _prepare(capsys, path: str, prepared_dir: str) -> tuple[int, dict | None, str]:
  """(exit status, {split/array: bytes} of the store or None, stderr)."""
  argv = [
    "prepare",
    os.path.join(ROOT, "configs", "base.yml"),
    f"grain_train_files={path}",
    f"network_prepared_dir={prepared_dir}",
    "network_field_order=hashed",
  ]
  code, _, err = _run(capsys, argv)
  arrays = None
  if code == 0:
    (root,) = glob.glob(os.path.join(prepared_dir, "*"))
    arrays = {}
    for split in ("train", "test"):
      opened = store.PreparedStore(os.path.join(root, split))
      for name in (*store.PROBE_ARRAYS, *store.ROW_ARRAYS):
        arrays[f"{split}/{name}"] = np.asarray(getattr(opened, name)).tobytes()
  shutil.rmtree(prepared_dir, ignore_errors=True)
  return code, arrays, err


def test_checksummed_copies_give_the_original_rows_or_one_line(capsys, tmp_path, checksummed):
  expected_tokens = _run(capsys, ["tokenize", checksummed, *TOKENIZE])
  assert expected_tokens[0] == 0 and len(expected_tokens[1].splitlines()) == 6_000
  code, expected_store, _ = _prepare(capsys, checksummed, str(tmp_path / "prepared-original"))
  assert code == 0
  outcomes = {"same": 0, "error": 0}
  for i, path in enumerate(_corpus(checksummed, str(tmp_path / "corpus"), seed=0)):
    code, out, err = _run(capsys, ["tokenize", path, *TOKENIZE])
    if code == 0:
      assert out == expected_tokens[1], f"{path}: tokenize gave other rows without an error"
    else:
      assert code == 2 and out == "", (path, code, err)
      _assert_one_error_line("tokenize", path, err)
    outcomes["same" if code == 0 else "error"] += 1

    code, arrays, err = _prepare(capsys, path, str(tmp_path / f"prepared-{i}"))
    if code == 0:
      assert arrays == expected_store, f"{path}: prepare stored other rows without an error"
    else:
      assert code == 2, (path, code, err)
      _assert_one_error_line("prepare", path, err)
  # The corpus reaches both outcomes: most copies are damaged where it matters.
  assert outcomes["error"] >= COPIES // 2 and outcomes["same"] >= 1, outcomes


def test_copies_without_checksums_never_end_in_a_traceback(capsys, tmp_path, generated):
  for i, path in enumerate(_corpus(generated, str(tmp_path / "corpus"), seed=1)):
    code, _, err = _run(capsys, ["tokenize", path, *TOKENIZE])
    assert code in (0, 2), (path, code, err)
    if code == 2:
      _assert_one_error_line("tokenize", path, err)
    code, _, err = _prepare(capsys, path, str(tmp_path / f"prepared-{i}"))
    assert code in (0, 2), (path, code, err)
    if code == 2:
      _assert_one_error_line("prepare", path, err)


@pytest.mark.parametrize("copy", [0, 1, 2, 4])
def test_a_separate_process_exits_with_one_line(tmp_path, checksummed, copy):
  path = _corpus(checksummed, str(tmp_path / "corpus"), seed=0)[copy]
  for argv in (
    ["tokenize", path],
    [
      "prepare",
      "configs/base.yml",
      f"grain_train_files={path}",
      f"network_prepared_dir={tmp_path / 'prepared'}",
    ],
  ):
    result = subprocess.run(
      [sys.executable, "-m", "maxtext_netdata", *argv],
      capture_output=True,
      text=True,
      cwd=ROOT,
      timeout=120,
    )
    assert result.returncode in (0, 2), result.stderr
    assert "Traceback" not in result.stderr
    if result.returncode == 2:
      _assert_one_error_line(argv[0], path, result.stderr)


def test_dictionary_indices_past_the_dictionary_are_one_line(capsys, tmp_path, generated):
  """The damage that once ended in an IndexError: bit-packed indices overwritten with ones.

  Uncompressed and without checksums, nothing but the index check can catch it.
  """
  path = str(tmp_path / "plain.parquet")
  pq.write_table(pq.read_table(generated), path, compression="none", row_group_size=6_000)
  group = pq.ParquetFile(path).metadata.row_group(0)
  (chunk,) = [
    group.column(c)
    for c in range(group.num_columns)
    if group.column(c).path_in_schema == "src_addr"
  ]
  end = chunk.dictionary_page_offset + chunk.total_compressed_size
  with open(path, "r+b") as f:
    f.seek(end - 40)
    f.write(b"\xff" * 40)  # the tail of the index page: every index is 2^bit_width - 1
  code, out, err = _run(capsys, ["tokenize", path])
  assert (code, out) == (2, "")
  _assert_one_error_line("tokenize", path, err)
  assert "out of bounds" in err or "dictionary indices past" in err
  code, _, err = _prepare(capsys, path, str(tmp_path / "prepared"))
  assert code == 2
  _assert_one_error_line("prepare", path, err)
  assert "out of bounds" in err or "dictionary indices past" in err
