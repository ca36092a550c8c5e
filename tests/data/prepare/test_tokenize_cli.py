"""`tokenize` and `decode` on generated files: oracle-checked output and one-line errors."""

import datetime
import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from maxtext_netdata import cli
from maxtext_netdata.format import tokenizer
from tests.helpers import REPO
from tests.helpers import reference_tokenizer as ref

ROOT = str(REPO)
LIMIT = 400


def _tokenize(capsys, path, *options):
  assert cli.main(["tokenize", path, "--limit", str(LIMIT), *options]) == 0
  return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _plain_rows(path, limit=LIMIT):
  """The file's rows read with pyarrow alone: (src, dst, version, rtt, Unix seconds)."""
  table = pq.read_table(path).slice(0, limit)
  seconds = [
    int(t.replace(tzinfo=datetime.UTC).timestamp()) if t.tzinfo is None else int(t.timestamp())
    for t in table.column("event_time").to_pylist()
  ]
  return list(
    zip(
      table.column("src_addr").to_pylist(),
      table.column("dst_addr").to_pylist(),
      table.column("ip_version").to_pylist(),
      table.column("rtt").to_pylist(),
      seconds,
      strict=True,
    )
  )


@pytest.mark.parametrize("timestamps", ["abs", "delta", "none"])
@pytest.mark.parametrize("field_order", ["fixed", "hashed"])
def test_tokenize_matches_reference(capsys, sample_files, field_order, timestamps):
  path = sample_files[1]
  lines = _tokenize(capsys, path, "--field-order", field_order, "--timestamps", timestamps)
  rows = _plain_rows(path)
  assert len(lines) == LIMIT
  plan = ref.timestamp_plan(
    [r[4] for r in rows], [timestamps != "none"] * LIMIT, [timestamps == "abs"] * LIMIT
  )
  for line, (src, dst, version, rtt, seconds), (kind, value) in zip(lines, rows, plan, strict=True):
    if field_order == "fixed":
      order = ref.FIXED_ORDER
    else:
      order = ref.hashed_order(src, dst, seconds, timestamps != "none")
    assert line == ref.encode_measurement(src, dst, version, rtt, kind, value, order)


def test_random_order_is_seeded_and_tokens_match_reference(capsys, sample_files):
  path = sample_files[0]
  lines = _tokenize(capsys, path, "--field-order", "random", "--seed", "1")
  assert _tokenize(capsys, path, "--field-order", "random", "--seed", "1") == lines
  assert _tokenize(capsys, path, "--field-order", "random", "--seed", "2") != lines
  rows = _plain_rows(path)
  plan = ref.timestamp_plan([r[4] for r in rows], [True] * LIMIT, [False] * LIMIT)
  orders = set()
  for line, (src, dst, version, rtt, _), (kind, value) in zip(lines, rows, plan, strict=True):
    order = _decoded([line])[0]["order"]
    orders.add(tuple(order))
    assert line == ref.encode_measurement(src, dst, version, rtt, kind, value, order)
  assert len(orders) == 24


def _decoded(lines):
  return [m for line in lines for m in tokenizer.decode(line)]


def test_tokenize_then_decode(tmp_path, sample_files):
  path = sample_files[2]
  tokenized = subprocess.run(
    [sys.executable, "-m", "maxtext_netdata", "tokenize", path, "--limit", "50"],
    capture_output=True,
    text=True,
    check=True,
    cwd=ROOT,
  ).stdout
  decoded = subprocess.run(
    [sys.executable, "-m", "maxtext_netdata", "decode", "-"],
    input=tokenized,
    capture_output=True,
    text=True,
    check=True,
    cwd=ROOT,
  ).stdout.splitlines()
  rows = _plain_rows(path, 50)
  assert len(decoded) == 50
  for line, (src, dst, version, rtt, _) in zip(decoded, rows, strict=True):
    m = json.loads(line)
    assert m["ip_version"] == version and m["failed"] == (rtt < 0)
    assert m["src"] == (src or ("0.0.0.0" if version == 4 else "::"))
    assert m["dst"] == (dst or ("0.0.0.0" if version == 4 else "::"))
    if rtt >= 0:
      assert abs(m["rtt_ms"] - max(rtt, 0.001)) <= max(0.001, rtt / 1024)
  assert json.loads(decoded[0])["timestamp"] == rows[0][4]
  text_file = tmp_path / "tokens.txt"
  text_file.write_text(tokenized)
  as_text = subprocess.run(
    [sys.executable, "-m", "maxtext_netdata", "decode", str(text_file), "--format", "text"],
    capture_output=True,
    text=True,
    check=True,
    cwd=ROOT,
  ).stdout.splitlines()
  assert len(as_text) == 50 and " -> " in as_text[0] and "[src,dst,result,timestamp]" in as_text[0]


def _valid_table(n=20):
  rng = np.random.default_rng(0)
  return pa.table(
    {
      "msm_id": pa.array(np.arange(n), pa.int64()),
      "event_time": pa.array(1_751_328_000 + np.arange(n) * 60, pa.timestamp("s")),
      "src_addr": pa.array([f"10.0.0.{i}" for i in range(n)]),
      "dst_addr": pa.array(["192.0.2.1"] * n),
      "ip_version": pa.array([4] * n, pa.int8()),
      "rtt": pa.array(rng.uniform(1, 100, n)),
    }
  )


def _with_column(table, name, values, type_=None):
  index = table.schema.get_field_index(name)
  return table.set_column(index, name, pa.array(values, type_))


def _bad_inputs(tmp_path):
  """name -> (path, text the error must contain)."""
  table = _valid_table()
  cases = {
    "missing_column": (table.drop_columns(["rtt"]), "missing column(s) rtt"),
    "wrong_type": (_with_column(table, "rtt", ["1.0"] * 20), "column 'rtt' has type string"),
    "bad_address": (
      _with_column(table, "src_addr", [f"10.0.0.{i}" for i in range(5)] + ["10.0.0.999"] * 15),
      "row 5",
    ),
    "version_mismatch": (
      _with_column(table, "ip_version", [4] * 7 + [6] + [4] * 12, pa.int8()),
      "row 7",
    ),
    "nan_rtt": (_with_column(table, "rtt", [1.0] * 3 + [float("nan")] + [1.0] * 16), "row 3"),
    "bad_version": (
      _with_column(table, "ip_version", [4, 4, 5] + [4] * 17, pa.int8()),
      "row 2: ip_version is not 4 or 6 (value 5)",
    ),
  }
  out = {}
  for name, (bad_table, expected) in cases.items():
    path = str(tmp_path / f"{name}.parquet")
    pq.write_table(bad_table, path)
    out[name] = (path, expected)
  good = str(tmp_path / "good.parquet")
  pq.write_table(table, good)
  data = open(good, "rb").read()
  (tmp_path / "corrupt.parquet").write_bytes(b"not parquet at all" * 10)
  (tmp_path / "truncated.parquet").write_bytes(data[: len(data) // 2])
  out["corrupt"] = (str(tmp_path / "corrupt.parquet"), "corrupt.parquet")
  out["truncated"] = (str(tmp_path / "truncated.parquet"), "truncated.parquet")
  out["missing_file"] = (str(tmp_path / "absent.parquet"), "no such file")
  return out


@pytest.mark.parametrize(
  "case",
  [
    "missing_column",
    "wrong_type",
    "bad_address",
    "version_mismatch",
    "nan_rtt",
    "bad_version",
    "corrupt",
    "truncated",
    "missing_file",
  ],
)
def test_bad_input_gives_one_line(tmp_path, case):
  path, expected = _bad_inputs(tmp_path)[case]
  result = subprocess.run(
    [sys.executable, "-m", "maxtext_netdata", "tokenize", path],
    capture_output=True,
    text=True,
    cwd=ROOT,
    timeout=120,
  )
  assert result.returncode == 2
  assert result.stdout == ""
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1, result.stderr
  assert path in lines[0] and expected in lines[0]
  assert "Traceback" not in result.stderr


def test_limit_reads_a_prefix(capsys, sample_files):
  whole = _tokenize(capsys, sample_files[3])
  assert cli.main(["tokenize", sample_files[3], "--limit", "7"]) == 0
  assert [json.loads(x) for x in capsys.readouterr().out.splitlines()] == whole[:7]


@pytest.mark.parametrize(
  "line, expected",
  [
    ("[0, 1, 2]", "line 2: token 2: expected a byte"),
    ("not json", "line 2: expected a JSON list of token ids"),
    ("[0, true]", "line 2: expected a JSON list of token ids"),
  ],
)
def test_decode_bad_line_names_it(tmp_path, capsys, line, expected):
  path = tmp_path / "tokens.txt"
  path.write_text("[0, 1, 11, 11, 11, 11, 3, 11, 11, 11, 11, 10]\n" + line + "\n")
  assert cli.main(["decode", str(path)]) == 2
  captured = capsys.readouterr()
  assert expected in captured.err and captured.err.count(str(path)) == 1  # named once
  assert len(captured.out.splitlines()) == 1
