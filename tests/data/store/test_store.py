"""The prepared store: lazy memory-mapped splits that pickle as their path; grouping and sorting
(data.prepare.partition: partition by probe hash, sort a bucket)."""

import dataclasses
import json
import multiprocessing
import os
import pickle
import shutil

import numpy as np
import pyarrow as pa
import pytest

from maxtext_netdata.data.prepare import bucket_sort, local_runner, partition, probes, row_kernels
from maxtext_netdata.data.raw import schema
from maxtext_netdata.data.store import dst_table, shared_arrays, store
from maxtext_netdata.errors import DataError


def raw_columns(src, version, dst, seconds, rtt, dictionary=False):
  """Validated columns of a small table of address texts (dictionary-encoded, as parquet
  files' usually are, with `dictionary`)."""
  texts = [pa.array(t, pa.string()) for t in (src, dst)]
  if dictionary:
    texts = [t.dictionary_encode() for t in texts]
  table = pa.table(
    {
      "event_time": pa.array(np.asarray(seconds), pa.timestamp("s")),
      "src_addr": texts[0],
      "dst_addr": texts[1],
      "ip_version": pa.array(version, pa.int8()),
      "rtt": pa.array(rtt, pa.float64()),
    }
  )
  return schema.validate_table(table, source="test")[0]


ROWS = {
  "src": ["192.0.2.9", "2001:db8::1", "192.0.2.9", "192.0.2.1", "192.0.2.9", "", "192.0.2.9"],
  "version": [4, 6, 4, 4, 4, 6, 4],
  "dst": ["8.8.8.8", "2001:db8::53", "1.1.1.1", "8.8.8.8", "9.9.9.9", "::1", "1.1.1.1"],
  "seconds": [30, 10, 20, 5, 20, 7, 20],
  "rtt": [1.5, 20.0, 3.0, -1.0, 2.0, 4.0, 2.5],
}


def build(order, chunks=1, hashed=False):
  """The rows of `order`, partitioned batch by batch into one bucket and sorted."""
  parts = []
  for part in np.array_split(np.asarray(order), chunks):
    columns = raw_columns(*[[ROWS[k][i] for i in part] for k in ROWS])
    parts += [chunk for _, chunk in partition.partition(columns, 1, hashed)]
  return bucket_sort.sort_bucket(parts)


def key_hash(version, address_bytes):
  return probes.probe_hashes(np.array([[version, *address_bytes]], np.uint8))[0]


def test_rows_are_grouped_by_probe_and_sorted_whatever_the_input_order():
  rows = build(range(7))
  # Probes by hash of (version, address): 192.0.2.1, 192.0.2.9, ::, 2001:db8::1 in some order.
  v6 = [0x20, 0x01, 0x0D, 0xB8, *[0] * 11, 1]
  probes = {
    (4, (192, 0, 2, 1, *[0] * 12)): [5],
    (4, (192, 0, 2, 9, *[0] * 12)): [20, 20, 20, 30],
    (6, (0,) * 16): [7],
    (6, tuple(v6)): [10],
  }
  order = sorted(probes, key=lambda p: key_hash(*p))
  np.testing.assert_array_equal(rows.probe_version, [v for v, _ in order])
  np.testing.assert_array_equal(rows.probe_src, [a for _, a in order])
  np.testing.assert_array_equal(rows.probe_hash, [key_hash(*p) for p in order])
  np.testing.assert_array_equal(
    rows.probe_offsets, np.cumsum([0, *(len(probes[p]) for p in order)])
  )
  np.testing.assert_array_equal(rows.seconds, sum((probes[p] for p in order), []))
  failed = np.array([r < 0 for r in ROWS["rtt"]])
  assert sorted(store.failed_of(rows.rtt_bytes)) == sorted(failed)  # 0, 0 only when failed
  for order, chunks in (
    ([6, 5, 4, 3, 2, 1, 0], 1),
    ([2, 4, 6, 0, 1, 3, 5], 3),
    ([4, 6, 2, 0, 5, 1, 3], 7),
  ):
    other = build(order, chunks)
    for name in (*store.PROBE_ARRAYS, *store.ROW_ARRAYS, "probe_hash"):
      a, b = getattr(rows, name), getattr(other, name)
      if a is None:
        assert b is None
      else:
        np.testing.assert_array_equal(a, b, err_msg=f"{name} for order {order}")


def test_the_probe_hash_is_the_probe_split_hash_and_buckets_keep_its_order():
  # docs/spec.md §3: the first 8 bytes of blake2b(version byte + 16 address bytes), big-endian.
  key = bytes([4, 192, 0, 2, 9]) + bytes(12)
  expected = int.from_bytes(__import__("hashlib").blake2b(key, digest_size=8).digest(), "big")
  assert key_hash(4, key[1:]) == expected
  hashes = np.sort(np.random.default_rng(0).integers(0, 2**64, 1000, dtype=np.uint64))
  for buckets in (1, 2, 7, 64):
    bucket = partition.bucket_of(hashes, buckets)
    assert bucket.min() >= 0 and bucket.max() < buckets
    assert (np.diff(bucket) >= 0).all()


def test_a_batch_split_into_records_keeps_every_row_in_its_probes_bucket():
  # Times at both ends of what a store keeps: records carry the seconds as uint32. Two
  # spellings of one destination: one address, two entries of a batch's dictionary; a null
  # destination (the all-zero address).
  dst = [*ROWS["dst"][:5], "2001:DB8:0::53", None]
  rows = {**ROWS, "dst": dst, "seconds": [0, 2**32 - 1, 20, 5, 2**32 - 2, 7, 20]}
  for dictionary in (False, True):
    _check_records(rows, raw_columns(*[rows[k] for k in rows], dictionary=dictionary))


def _check_records(rows, columns):
  dictionary = pa.types.is_dictionary(columns.dst_text.type)
  key_of = {
    (v, s): (v, *(socket_bytes(v, s) if s else bytes(16)))
    for v, s in zip(rows["version"], rows["src"], strict=True)
  }
  for hashed in (False, True):
    whole = partition.batch_chunk(columns, hashed)
    expected = sorted(_rows_of(whole))
    for buckets, indexed in ((1, False), (3, False), (64, False), (3, True), (64, True)):
      got = []
      table = dst_table.DstEncoder() if indexed else None
      assert (partition.batch_chunk(columns, hashed).dst_text is None) != dictionary
      records = partition.split_chunks([partition.batch_chunk(columns, hashed)], buckets, table)
      assert bool(records.flags & row_kernels.DST_INDEXED) == indexed
      for bucket, chunk in records.chunks(None if table is None else table.table()):
        assert (partition.bucket_of(chunk.hashes, buckets) == bucket).all()
        np.testing.assert_array_equal(chunk.hashes, probes.probe_hashes(chunk.keys))
        assert chunk.columns.keys() == whole.columns.keys()
        got += _rows_of(chunk)
      assert sorted(got) == expected, (hashed, buckets, indexed)
  assert sorted(r[2] for r in expected) == sorted(rows["seconds"])
  assert len({r[1] for r in expected}) == 5  # the two spellings are one address
  assert bytes(16) in {r[1] for r in expected}
  assert {r[0] for r in expected} == set(key_of.values())


def test_a_spill_file_cut_short_is_an_error_naming_it(tmp_path):
  # A bucket's file read back whole (`read`) or a block at a time (`stream`, the slices'
  # passes): a record cut in two, or a whole record missing, is an error, not fewer rows.
  writer = local_runner.SpillWriter(str(tmp_path), 2)
  columns = raw_columns(*[ROWS[k] for k in ROWS])
  for _ in range(2):  # two records a bucket
    batch = partition.batch_chunk(columns, False)
    writer.add(partition.split_chunks([batch], 2, writer.dst_table))
  writer.close()
  bucket = int(np.argmax(writer.rows))
  path = writer.path(bucket)
  assert sum(len(c) for c in writer.stream(bucket)) == writer.rows[bucket] >= 2
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    whole = f.read()
  # Inside the last record; one record of two; every record and 3 bytes of another.
  for data in (whole[: size - 3], whole[: size // 2], whole + whole[:3]):
    with open(path, "wb") as f:
      f.write(data)
    with pytest.raises(OSError, match=f"{path}: spill file cut short"):
      list(writer.stream(bucket))
    with pytest.raises(OSError, match=f"{path}: spill file cut short"):
      writer.read(bucket)


def socket_bytes(version: int, text: str) -> bytes:
  import socket  # noqa: PLC0415

  family = socket.AF_INET if version == 4 else socket.AF_INET6
  return socket.inet_pton(family, text).ljust(16, b"\0")


def _rows_of(chunk: partition.Chunk) -> list[tuple]:
  """Each row of a chunk as (probe key, dst, seconds, rtt payload, hashed order)."""
  order = chunk.columns.get("hashed_order")
  return [
    (
      tuple(chunk.keys[chunk.probe[i]].tolist()),
      chunk.columns["dst"][i].tobytes(),
      int(chunk.columns["seconds"][i]),
      chunk.columns["rtt_bytes"][i].tobytes(),
      None if order is None else order[i].tobytes(),
    )
    for i in range(len(chunk))
  ]


def test_take_rows_matches_fancy_indexing():
  rng = np.random.default_rng(0)
  index = rng.permutation(1000)[:700]
  for array in (
    rng.integers(0, 256, (1000, 16), dtype=np.uint8),
    rng.integers(0, 256, (1000, 2), dtype=np.uint8),
    rng.integers(0, 256, (1000, 3), dtype=np.uint8),
    rng.random(1000).astype(np.float32),
    rng.random(1000) < 0.5,
  ):
    np.testing.assert_array_equal(store.take_rows(array, index), array[index])


def written(tmp_path, hashed=False) -> store.PreparedStore:
  path = str(tmp_path / "split")
  counts = build(range(7), hashed=hashed).write(path, {"split": "train"})
  assert counts == {"rows": 7, "probes": 4, "failed": 1}
  return store.PreparedStore(path)


def _sum_seconds(split):
  return int(split.seconds.sum()), type(split.seconds).__name__


def test_store_opens_lazily_memory_maps_and_pickles_as_its_path(tmp_path):
  split = written(tmp_path)
  assert "seconds" not in vars(split)
  assert split.num_rows == 7 and split.num_probes == 4 and split.meta["split"] == "train"
  assert isinstance(split.dst_index, np.memmap) and split.dst_index.shape == (7,)
  # The destinations: the distinct ones in the order of their first row, and an index a row.
  dst = [bytes(d) for d in split.dst]
  assert sorted(dst) == sorted(bytes(d) for d in raw_columns(*ROWS.values()).dst)
  assert [bytes(t) for t in split.dst_table] == list(dict.fromkeys(dst))
  assert split.hashed_order is None
  big = int(np.argmax(np.diff(split.probe_offsets)))  # 192.0.2.9's four rows
  assert split.probe_rows(big) == slice(
    int(split.probe_offsets[big]), int(split.probe_offsets[big]) + 4
  )
  data = pickle.dumps(split)
  assert len(data) < 500  # the path, not the arrays
  assert pickle.loads(data).seconds.tolist() == split.seconds.tolist()
  # A spawned process (as Grain starts its workers) opens the store from the path.
  with multiprocessing.get_context("spawn").Pool(1) as pool:
    assert pool.apply(_sum_seconds, (split,)) == (int(np.sum(ROWS["seconds"])), "memmap")


def _random_read_maps(split) -> dict[str, bool]:
  """For each array `split` has mapped (in this process, read from its smaps): whether the
  kernel reads it at random (VmFlags `rr`: madvise MADV_RANDOM, no read-around)."""
  flags, name = {}, None
  with open("/proc/self/smaps", encoding="utf-8") as f:
    for line in f:
      if "-" in line.split(" ", 1)[0]:  # a mapping's first line: address range ... path
        path = line.split()[-1]
        name = os.path.basename(path)[:-4] if os.path.dirname(path) == split.path else None
      elif line.startswith("VmFlags:") and name:
        flags[name] = flags.get(name, False) or "rr" in line.split()[1:]
  return flags


def _random_in_child(split) -> dict[str, bool]:
  split.dst_index, split.probe_src  # noqa: B018 (mapped)
  return _random_read_maps(split)


def test_a_store_read_at_random_advises_its_row_maps_only_and_keeps_it_when_pickled(
  tmp_path, capsys
):
  normal = written(tmp_path)
  split = normal.with_access("random")
  assert split.access == "random" and split.path == normal.path
  split.dst_index, split.seconds, split.probe_src, split.dst_table, normal.rtt_bytes  # noqa: B018
  flags = _random_read_maps(split)
  assert flags == {
    "dst_index": True,
    "seconds": True,
    "probe_src": False,
    "dst_table": False,
    "rtt_bytes": False,
  }
  # Grain's spawned workers map it the same way.
  assert pickle.loads(pickle.dumps(split)).access == "random"
  with multiprocessing.get_context("spawn").Pool(1) as pool:
    assert pool.apply(_random_in_child, (split,)) == {"dst_index": True, "probe_src": False}
  # auto: at random when the rows take more than the memory.
  rows = normal.row_bytes()
  assert rows == sum(
    os.path.getsize(f"{normal.path}/{n}.npy")
    for n in store.ROW_FILES
    if os.path.exists(f"{normal.path}/{n}.npy")
  )
  assert normal.with_access("auto", memory=rows - 1).access == "random"
  said = capsys.readouterr().err  # and says so, once, with the sizes
  assert said.count("\n") == 1 and "read at random, ahead of the batches" in said
  assert normal.path in said and "network_store_access=auto" in said
  assert normal.with_access("auto", memory=rows).access == "normal"
  assert capsys.readouterr().err == ""
  assert normal.with_access("normal") is normal
  assert 0 < store.usable_memory() <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  assert 0 < store.page_cache_room() <= store.usable_memory()
  with pytest.raises(ValueError, match="access 'fast'"):
    store.PreparedStore(normal.path, "fast")


def test_write_keeps_only_selected_rows_and_their_probes(tmp_path):
  rows = build(range(7))
  sizes = np.diff(rows.probe_offsets)
  big = int(np.argmax(sizes))
  ok = ~store.failed_of(rows.rtt_bytes)
  small = int(np.flatnonzero((sizes == 1) & ok[rows.probe_offsets[:-1]])[0])
  keep = np.zeros(7, dtype=bool)
  keep[rows.probe_offsets[big] : rows.probe_offsets[big] + 2] = True
  keep[rows.probe_offsets[small]] = True
  path = str(tmp_path / "part")
  assert rows.write(path, {}, keep) == {"rows": 3, "probes": 2, "failed": 0}
  split = store.PreparedStore(path)
  np.testing.assert_array_equal(split.probe_offsets, [0, 2, 3] if big < small else [0, 1, 3])
  np.testing.assert_array_equal(split.seconds, rows.seconds[keep])
  np.testing.assert_array_equal(split.dst, rows.dst[keep])  # its own table: kept rows' only
  assert len(split.dst_table) == len(np.unique(rows.dst[keep], axis=0))


def test_hashed_order_is_stored_when_asked(tmp_path):
  split = written(tmp_path, hashed=True)
  assert split.hashed_order.shape == (7, 2) and split.hashed_order.max() < 24


def test_not_a_store_is_an_error(tmp_path):
  with pytest.raises(DataError, match="not a prepared store"):
    store.PreparedStore(str(tmp_path))
  split = written(tmp_path)
  meta_path = os.path.join(split.path, store.META_FILE)
  meta = json.load(open(meta_path))
  np.save(os.path.join(split.path, "seconds.npy"), np.zeros(3, np.int64))
  with pytest.raises(DataError, match=r"seconds.npy: int64\[3\], expected uint32\[7\]"):
    _ = store.PreparedStore(split.path).seconds
  store.write_json(meta_path, {**meta, "format_version": store.FORMAT_VERSION + 1})
  with pytest.raises(DataError, match="run prepare"):
    store.PreparedStore(split.path)


def _counts_by_definition(split) -> tuple[np.ndarray, np.ndarray]:
  """Failed rows and rows > 255 s after the split's previous row, probe by probe."""
  seconds, failed = np.asarray(split.seconds, np.int64), np.asarray(split.failed)
  gap = np.concatenate([[False], np.diff(seconds) > 255])
  bounds = np.asarray(split.probe_offsets)
  return (
    np.array([failed[a:b].sum() for a, b in zip(bounds[:-1], bounds[1:], strict=True)]),
    np.array([gap[a:b].sum() for a, b in zip(bounds[:-1], bounds[1:], strict=True)]),
  )


@pytest.mark.parametrize("buckets_mb", [1024, 256])
def test_prepare_stores_the_probe_statistics(sample_dir, tmp_path, buckets_mb, monkeypatch):
  from maxtext_netdata import config  # noqa: PLC0415
  from maxtext_netdata.data.prepare import prepare  # noqa: PLC0415

  # Small buckets: the counts cross many pieces, each split gets rows of every piece.
  monkeypatch.setattr(partition, "num_buckets", lambda rows, mb: 1 if mb == 1024 else 7)
  cfg = config.load(
    None,
    [
      f"grain_train_files={sample_dir}",
      f"network_prepared_dir={tmp_path}",
      "network_split=time",
      f"network_prepare_memory_mb={buckets_mb}",
    ],
  )
  splits = prepare.prepare(cfg, progress=False)
  long_gaps = 0
  for split in (splits.train, splits.eval):
    stored = split.probe_counts()
    assert all(isinstance(a, np.memmap) for a in stored)  # mapped, not recounted
    expected = _counts_by_definition(split)
    for got, want in zip(stored, expected, strict=True):
      np.testing.assert_array_equal(got, want)
    assert stored[0].sum() == split.meta["num_failed"]
    long_gaps += int(stored[1].sum())
    # The chunked scan (the fallback for stores without them) agrees across chunk edges.
    for got, want in zip(store.probe_counts(split, chunk_rows=997), expected, strict=True):
      np.testing.assert_array_equal(got, want)
  assert long_gaps > 0


def test_the_planner_reads_no_store_rows_for_its_statistics(sample_dir, tmp_path, monkeypatch):
  from maxtext_netdata import config  # noqa: PLC0415
  from maxtext_netdata.data.prepare import prepare  # noqa: PLC0415
  from maxtext_netdata.input_pipeline import epoch_plan  # noqa: PLC0415
  from maxtext_netdata.input_pipeline.sequences import BatchBuilder  # noqa: PLC0415

  cfg = config.load(None, [f"grain_train_files={sample_dir}", f"network_prepared_dir={tmp_path}"])
  train = store.PreparedStore(prepare.prepare(cfg, progress=False).train.path)
  # The scan of a split's rows, counted. (The split's arrays themselves are mapped anyway, by
  # the batch kernel's warm-up on a thread of its own: their use says nothing here.)
  scans, scan = [], store.probe_counts
  monkeypatch.setattr(store, "probe_counts", lambda split, *a: scans.append(1) or scan(split, *a))
  builder = BatchBuilder.from_config(cfg, train, 8)
  assert builder.stats.num_probes == train.num_probes
  assert scans == []  # the counts prepare stored, mapped
  # A split without stored counts (an older store) gets them by a scan: the same plan.
  for name in store.STATS_ARRAYS:
    os.remove(os.path.join(train.path, f"{name}.npy"))
  rescanned = BatchBuilder.from_config(cfg, store.PreparedStore(train.path), 8)
  assert rescanned.stats.num_probes == train.num_probes and scans == [1]
  np.testing.assert_array_equal(rescanned.stats.mean_length, builder.stats.mean_length)
  for field in dataclasses.fields(epoch_plan.EpochPlan):
    a, b = (getattr(x.plan(0), field.name) for x in (rescanned, builder))
    np.testing.assert_array_equal(a, b)


def test_assemble_counts_the_statistics_across_pieces(tmp_path):
  from maxtext_netdata.data.prepare import assemble  # noqa: PLC0415

  rng = np.random.default_rng(5)
  pieces = []
  for index in range(5):
    probes = int(rng.integers(1, 6))
    sizes = rng.integers(1, 30, probes)
    n = int(sizes.sum())
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    # Each probe starts anywhere in a day: gaps across probes and pieces go both ways.
    start = np.repeat(rng.integers(0, 86_400, probes), sizes)
    steps = rng.choice([0, 60, 300], n)
    seconds = start + np.cumsum(steps) - np.repeat(np.cumsum(steps)[offsets[:-1]], sizes)
    failed = rng.random(n) < 0.3
    rows = store.ProbeRows(
      probe_offsets=offsets,
      probe_src=rng.integers(0, 256, (probes, 16), dtype=np.uint8),
      probe_version=np.full(probes, 6, np.uint8),
      dst=rng.integers(0, 256, (n, 16), dtype=np.uint8),
      seconds=seconds.astype(np.int64),
      rtt_bytes=np.where(failed[:, None], 0, np.full((n, 2), 40)).astype(np.uint8),  # 0, 0: failed
      hashed_order=None,
    )
    path = str(tmp_path / f"piece{index}")
    rows.write(path, {})
    pieces.append(path)
  assemble.assemble(pieces, str(tmp_path / "out"), "all", 0.0, {})
  split = store.PreparedStore(str(tmp_path / "out" / "eval"))
  expected = _counts_by_definition(split)
  assert expected[1].sum() > 5  # long gaps inside and across pieces
  for got, want in zip(split.probe_counts(), expected, strict=True):
    np.testing.assert_array_equal(got, want)


def _slow_compute(log: str) -> dict:
  with open(log, "a") as f:
    f.write("computed\n")
  import time  # noqa: PLC0415

  time.sleep(0.5)
  return {"a": np.arange(1000), "b": np.ones((10, 2), np.uint8)}


def _cached_in_child(folder: str, log: str, out: str) -> None:
  arrays = shared_arrays.cached_arrays(folder, "k", lambda: _slow_compute(log))
  np.save(out, arrays["a"])


def test_cached_arrays_are_computed_once_and_mapped_by_every_process(tmp_path):
  folder, log = str(tmp_path / "derived"), str(tmp_path / "log")
  context = multiprocessing.get_context("spawn")
  children = [
    context.Process(target=_cached_in_child, args=(folder, log, str(tmp_path / f"{i}.npy")))
    for i in range(3)
  ]
  for child in children:
    child.start()
  for child in children:
    child.join(60)
    assert child.exitcode == 0
  assert open(log).read() == "computed\n"  # one process computed, the others waited
  for i in range(3):
    np.testing.assert_array_equal(np.load(tmp_path / f"{i}.npy"), np.arange(1000))
  mapped = shared_arrays.cached_arrays(folder, "k", lambda: pytest.fail("computed again"))
  assert isinstance(mapped["a"], np.memmap) and mapped["b"].shape == (10, 2)
  # Writing another key prunes what `prune` names; an unwritable folder computes in place.
  shared_arrays.cached_arrays(
    folder, "k2", lambda: {"a": np.zeros(1)}, prune=lambda name: name == "k"
  )
  assert sorted(n for n in os.listdir(folder) if not n.startswith(".")) == ["k2"]
  (tmp_path / "file").write_text("")
  plain = shared_arrays.cached_arrays(str(tmp_path / "file" / "x"), "k", lambda: {"a": np.ones(3)})
  assert not isinstance(plain["a"], np.memmap) and plain["a"].sum() == 3


def test_epoch_plans_are_kept_beside_the_store_and_mapped(sample_dir, tmp_path):
  import dataclasses  # noqa: PLC0415

  from maxtext_netdata import config  # noqa: PLC0415
  from maxtext_netdata.data.prepare import prepare  # noqa: PLC0415
  from maxtext_netdata.input_pipeline import epoch_plan  # noqa: PLC0415
  from maxtext_netdata.input_pipeline.sequences import BatchBuilder  # noqa: PLC0415

  cfg = config.load(None, [f"grain_train_files={sample_dir}", f"network_prepared_dir={tmp_path}"])
  train = prepare.prepare(cfg, progress=False).train
  builder = BatchBuilder.from_config(cfg, train, 8)
  plan = builder.plan(0)
  plans_dir = os.path.join(train.path, epoch_plan.PLANS_DIR)
  assert len([n for n in os.listdir(plans_dir) if not n.startswith(".")]) == 1
  # A worker's copy of the builder maps the same files instead of planning again.
  worker = pickle.loads(pickle.dumps(builder))
  mapped = worker.plan(0)
  assert isinstance(mapped.long_first.base, np.memmap)
  # The kept plan is the plan computed in memory.
  fresh = epoch_plan.plan_epoch(
    dataclasses.replace(builder.stats, plans_dir=None),
    seq_len=cfg.max_target_length,
    seed=cfg.data_shuffle_seed,
    epoch=0,
    packing=cfg.packing,
    shuffle=cfg.enable_data_shuffling,
  )
  for field in dataclasses.fields(fresh):
    np.testing.assert_array_equal(getattr(mapped, field.name), getattr(fresh, field.name))
    np.testing.assert_array_equal(getattr(plan, field.name), getattr(fresh, field.name))
  # Plans more than one epoch behind go as later ones are written; other seeds stay, and plans
  # of other code go: one of the former layout (arrays of every plan row, named before the
  # code digest led the name) and one of this layout made by another version of the planner.
  former = os.path.join(plans_dir, "0123456789abcdef-e0")
  os.makedirs(former)
  np.save(os.path.join(former, "context_offsets.npy"), np.zeros(3, dtype=np.int64))
  mine = next(n for n in os.listdir(plans_dir) if n.endswith("-e0") and not n.startswith("."))
  other_code = os.path.join(plans_dir, f"{'0' * 8}{mine[8:-1]}1")
  shutil.copytree(os.path.join(plans_dir, mine), other_code)
  open(os.path.join(plans_dir, f".lock-{os.path.basename(other_code)}"), "w").close()
  for epoch in (1, 2, 3):
    builder.plan(epoch)
  other = BatchBuilder.from_config(cfg, train, 8, seed=99)
  other.plan(0)
  names = sorted(n for n in os.listdir(plans_dir) if not n.startswith("."))
  assert len(names) == 3  # epochs 2 and 3 of seed 3, epoch 0 of seed 99
  locks = sorted(n.removeprefix(".lock-") for n in os.listdir(plans_dir) if n.startswith(".lock-"))
  assert locks == names


@pytest.mark.parametrize("hashed", [False, True])
def test_rows_tied_on_probe_and_second_are_ordered_by_rtt_then_destination(hashed):
  """The documented order, written out as one lexsort: (probe, seconds, RTT payload as a
  big-endian word, destination as two big-endian words, hashed order), on rows with many
  ties in shuffled order."""
  rng = np.random.default_rng(3)
  n = 5_000
  probe = rng.integers(0, 40, n).astype(np.int32)
  columns = {
    "seconds": rng.integers(0, 30, n).astype(np.int64),
    "dst": rng.integers(0, 3, (n, 16)).astype(np.uint8),  # equal destinations happen
    "rtt_bytes": rng.choice([0, 1, 9], (n, 2)).astype(np.uint8),
  }
  if hashed:
    columns["hashed_order"] = rng.integers(0, 4, (n, 2)).astype(np.uint8)
  perm = bucket_sort.row_order(probe, columns)
  dst = columns["dst"].view(">u8")
  rtt = columns["rtt_bytes"][:, 0].astype(np.int64) * 256 + columns["rtt_bytes"][:, 1]
  keys = [dst[:, 1], dst[:, 0], rtt, columns["seconds"], probe]
  if hashed:
    keys.insert(0, columns["hashed_order"].view(np.uint16)[:, 0])
  expected = np.lexsort(keys)
  rows = [
    np.stack([np.asarray(k)[p] for k in keys]) for p in (perm, expected)
  ]  # equal rows may swap places: compare the rows, not the indices
  np.testing.assert_array_equal(rows[0], rows[1])


def test_probes_with_colliding_hashes_stay_apart_ordered_by_key():
  """Chunk keys are merged by hash first; two different keys with one hash (forced here) are
  still two probes, ordered by (hash, version, address) like all others."""
  rng = np.random.default_rng(5)
  distinct = rng.integers(0, 256, (50, 17), dtype=np.uint8)
  keys = distinct[rng.integers(0, 50, 2_000)]
  for collide in (False, True):
    hashes = probes.probe_hashes(keys)
    if collide:
      hashes[keys[:, 1] < 128] = hashes[0]
    rank, probe_keys, probe_hash = bucket_sort.probe_ranks(keys, hashes)
    expected = sorted({(int(h), *k.tolist()) for h, k in zip(hashes, keys, strict=True)})
    assert [(int(h), *k.tolist()) for h, k in zip(probe_hash, probe_keys, strict=True)] == expected
    np.testing.assert_array_equal(probe_keys[rank], keys)
    assert len(probe_keys) == 50
