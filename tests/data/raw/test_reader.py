"""`raw_reader`: each decoded batch is validated once, and a joined table is not validated again."""

import os
import re

import pyarrow as pa
import pyarrow.parquet as pq

from maxtext_netdata import cli
from maxtext_netdata.data.synthetic.generate import generate
from tests.helpers import REPO

ROOT = str(REPO)


def _with_invalid_utf8(tmp_path, row: int) -> str:
  """Generated rows in row groups of 1,500 whose `dst_addr` at `row` is not UTF-8."""
  path = generate(str(tmp_path / "raw"), rows=3_000, shards=1, seed=2, progress=False)[0]
  table = pq.read_table(path)
  texts = [None if t is None else t.encode() for t in table.column("dst_addr").to_pylist()]
  texts[row] = b"\xff" + texts[row][1:]
  column = pa.array(texts, pa.binary()).view(pa.string())  # a view is not checked for UTF-8
  index = table.schema.get_field_index("dst_addr")
  bad = str(tmp_path / "bad.parquet")
  pq.write_table(table.set_column(index, "dst_addr", column), bad, row_group_size=1_500)
  return bad


def test_invalid_text_in_a_joined_row_group_is_one_line_naming_file_and_rows(tmp_path, capsys):
  # Two row groups of 1,500 rows are joined into one table; the damage is in the second, so
  # only the check of each decoded batch (not of the joined table) names its rows.
  path = _with_invalid_utf8(tmp_path, row=2_345)
  argv = [
    "prepare",
    os.path.join(ROOT, "configs", "base.yml"),
    f"grain_train_files={path}",
    f"network_prepared_dir={tmp_path / 'prepared'}",
  ]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  assert "Traceback" not in err, err
  errors = [line for line in re.split(r"[\r\n]", err) if "error:" in line]
  assert errors == [
    f"maxtext-netdata prepare: error: {path}: corrupt data in rows 1500-2999 (In column 2:"
    " Invalid: Dictionary array invalid: Invalid: Invalid UTF8 sequence at string index 37)"
  ], err
