"""generate's writer options: row groups as long as prepare's batches, addresses kept as written."""

import pyarrow.parquet as pq

from maxtext_netdata.data.raw import reader, schema
from maxtext_netdata.data.synthetic import generate as generate_module
from maxtext_netdata.data.synthetic.generate import generate


def test_row_groups_are_prepares_batches_and_address_dictionaries_hold_each_text_once(tmp_path):
  assert generate_module.WRITE_ROW_GROUP_ROWS == reader.BATCH_ROWS
  rows = reader.BATCH_ROWS + 5_000
  (path,) = generate(str(tmp_path), rows=rows, shards=1, seed=4, progress=False)
  parquet = pq.ParquetFile(path, read_dictionary=list(schema.ADDRESS_COLUMNS))
  groups = [parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)]
  assert groups == [reader.BATCH_ROWS, 5_000]
  first = parquet.read_row_group(0, columns=["src_addr", "dst_addr"])
  plain = pq.read_table(path, columns=["src_addr", "dst_addr"]).slice(0, groups[0])
  for name in ("src_addr", "dst_addr"):
    column = first.column(name).combine_chunks()
    # One dictionary for the whole row group, each distinct text in it once.
    assert len(column.dictionary) == len(set(plain.column(name).to_pylist()) - {None})
    assert column.dictionary_decode().to_pylist() == plain.column(name).to_pylist()
