"""Bucketed prepare: the bucket count does not change the store; killed and concurrent prepares.

The crash and concurrency tests run `maxtext-netdata prepare` as real processes: a prepare
stopped at a stage (`tests/helpers/paused_prepare.py`) is killed there with SIGKILL.
"""

import glob
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from maxtext_netdata.data.prepare import (
  assemble,
  bucket_sort,
  local_runner,
  partition,
  prepare,
  probes,
)
from maxtext_netdata.data.store import store
from maxtext_netdata.data.synthetic.generate import generate
from tests.helpers import REPO
from tests.helpers.pipeline import store_config, store_files


@pytest.fixture(scope="module")
def raw_files(tmp_path_factory):
  return generate(
    str(tmp_path_factory.mktemp("raw")), rows=30_000, shards=3, seed=1, progress=False
  )


@pytest.mark.parametrize(
  "overrides",
  [(), ("network_split=time", "network_test_fraction=0.3"), ("network_test_fraction=0",)],
  ids=["probe split", "time split", "no test split"],
)
def test_bucket_count_does_not_change_the_store(tmp_path, raw_files, monkeypatch, overrides):
  one = prepare.prepare(store_config(tmp_path / "one", raw_files, *overrides), progress=False)
  # 15 buckets instead of 1, rows gathered 2,000 at a time: several records a spill file, read
  # back 64 bytes at a time (less than a record: the block grows; records cross blocks).
  monkeypatch.setattr(partition, "MAX_BUCKET_ROWS", 2_000)
  monkeypatch.setattr(partition, "gather_rows", lambda buckets, memory_mb: 2_000)
  monkeypatch.setattr(local_runner, "SPILL_BLOCK", 64)
  many = prepare.prepare(
    store_config(tmp_path / "many", raw_files[::-1], *overrides), progress=False
  )
  a, b = (
    store_files(one.summary["path"]),
    store_files(many.summary["path"]),
  )
  assert a.keys() == b.keys() and "train/dst_index.npy" in a and "train/dst_table.npy" in a
  for name in a:
    assert a[name] == b[name], name
  assert one.train.num_rows + one.eval.num_rows == 30_000
  if "network_test_fraction=0" in overrides:
    assert one.eval.num_rows == 0 and one.eval.num_probes == 0
  # Probes follow their hash through the buckets: the store is in one global order.
  keys = np.concatenate([one.train.probe_version[:, None], one.train.probe_src], axis=1)
  assert (np.diff(probes.probe_hashes(keys).astype(np.float64)) >= 0).all()
  assert not glob.glob(str(tmp_path / "*" / ".*"))  # no spill, pieces or lock left


@pytest.mark.parametrize(
  "overrides",
  [(), ("network_split=time", "network_test_fraction=0.3"), ("network_field_order=hashed",)],
  ids=["probe split", "time split", "hashed order"],
)
def test_buckets_larger_than_one_sort_are_sorted_in_slices_into_the_same_store(
  tmp_path, raw_files, monkeypatch, overrides
):
  # A bucket holds whole probes, and probes differ in size (here up to ~3,900 rows, at
  # RIPE Atlas's scale an anchor's ~9M rows a month): 15 buckets of ~2,000 rows, where one
  # sort may hold 700, are cut into slices of the store order, probes running on across them.
  one = prepare.prepare(store_config(tmp_path / "one", raw_files, *overrides), progress=False)
  monkeypatch.setattr(partition, "num_buckets", lambda rows, memory_mb: 15)
  monkeypatch.setattr(partition, "sort_rows", lambda memory_mb: 700)
  monkeypatch.setattr(partition, "gather_rows", lambda buckets, memory_mb: 2_000)
  monkeypatch.setattr(local_runner, "SPILL_BLOCK", 64)
  sorts = []
  order_bucket = bucket_sort.order_bucket

  def counted(chunks):  # the real sort, its rows noted
    ordered = order_bucket(chunks)
    sorts.append(ordered.num_rows)
    return ordered

  monkeypatch.setattr(bucket_sort, "order_bucket", counted)
  sliced = prepare.prepare(
    store_config(tmp_path / "sliced", raw_files[::-1], *overrides), progress=False
  )
  assert max(sorts) <= 700 and len(sorts) > 30, sorts
  a, b = store_files(one.summary["path"]), store_files(sliced.summary["path"])
  assert a.keys() == b.keys()
  for name in a:
    assert a[name] == b[name], name
  assert sliced.summary["probes"] == one.summary["probes"]
  assert not glob.glob(str(tmp_path / "*" / ".*"))  # no spill, slices or pieces left


def test_a_slice_plan_cuts_the_store_order_into_slices_that_fit():
  rng = np.random.default_rng(3)
  keys = rng.integers(0, 256, (6, 17), dtype=np.uint8)
  hashes = probes.probe_hashes(keys)
  chunks = []
  for n in (500, 3_000, 40):  # a probe table per chunk, each probe's key seen in several
    probe = rng.integers(0, 6, n).astype(np.int32)
    seconds = rng.integers(1_700_000_000, 1_700_000_000 + 40 * 3600, n).astype(np.uint32)
    chunks.append(partition.Chunk(keys, hashes, probe, {"seconds": seconds}))
  slicer = bucket_sort.Slicer(target=400)
  for chunk in chunks:
    slicer.count(chunk)
  count = slicer.plan()
  order = np.argsort(hashes)  # the probes' store order (hashes differ)
  rank = np.empty(6, np.int64)
  rank[order] = np.arange(6)
  row_key, row_slice = [], []
  for chunk in chunks:
    cut, key_slice = slicer.cut(chunk)
    assert (cut.keys[cut.probe] == chunk.keys[chunk.probe]).all()  # each row keeps its probe
    row_slice.append(key_slice[cut.probe])
    row_key.append(rank[chunk.probe] * 2**32 + chunk.columns["seconds"])
  row_key, row_slice = np.concatenate(row_key), np.concatenate(row_slice)
  by_order = row_slice[np.argsort(row_key, kind="stable")]
  assert (np.diff(by_order) >= 0).all()  # consecutive ranges of the store order
  sizes = np.bincount(row_slice, minlength=count)
  assert (sizes <= 400).all() and (sizes > 0).all() and sizes.sum() == 3_540
  assert count == -(-3_540 // 400) or count == -(-3_540 // 400) + 1  # greedy: few slices
  hours = (row_key >> 32) * 2**21 + (row_key & (2**32 - 1)) // 3600  # (probe, hour) bins
  for s in range(count - 1):  # a (probe, hour) never spans two slices
    assert hours[row_slice == s].max() < hours[row_slice == s + 1].min()


LIMITED_PREPARE = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[1])))
from maxtext_netdata.data.prepare import partition, prepare
from tests.helpers.pipeline import store_config
partition.MAX_BUCKET_ROWS = 100  # 300 buckets for 30k rows
prepare.prepare(store_config(sys.argv[2], sys.argv[3:]), progress=False)
"""


def test_more_buckets_than_files_a_process_may_open_build_the_same_store(tmp_path, raw_files):
  # RIPE Atlas's month is ~17,500 buckets; a soft limit of 1024 open files is common. Here a
  # hard limit of 128 leaves no room to keep 300 spill files open: each record's file is
  # opened and closed again.
  one = prepare.prepare(store_config(tmp_path / "one", raw_files), progress=False)
  subprocess.run(
    [sys.executable, "-c", LIMITED_PREPARE, "128", str(tmp_path / "many"), *raw_files],
    check=True, cwd=REPO, timeout=300,
  )  # fmt: skip
  (many,) = glob.glob(str(tmp_path / "many" / "*" / "meta.json"))
  a, b = store_files(one.summary["path"]), store_files(os.path.dirname(many))
  assert a.keys() == b.keys()
  for name in a:
    assert a[name] == b[name], name


@pytest.mark.parametrize("span", [500, 40 * 86400], ids=["one hour", "40 days"])
def test_time_cutoff_is_numpys_higher_quantile(tmp_path, span):
  rng = np.random.default_rng(0)
  pieces = []
  # Pieces of one or several probes, each probe's rows time-sorted, over hours that differ
  # from piece to piece (a piece may start before the pieces before it).
  # The last piece's rows are all at an hour's first or last second, near the middle.
  middle = (1_700_000_000 + span // 2) // 3600
  for k, (n, probes_in) in enumerate(((1, 1), (7, 3), (1000, 1), (333, 5), (2000, 40), (3000, 9))):
    start = int(rng.integers(1_700_000_000, 1_700_000_000 + span))
    probe = np.sort(rng.integers(0, probes_in, n))
    seconds = start - span // 2 + rng.integers(0, span, n)
    if k == 5:
      seconds = (middle + rng.integers(-1, 2, n)) * 3600 + rng.choice([0, 3599], n)
    order = np.lexsort((seconds, probe))
    sizes = np.bincount(probe[order], minlength=probes_in)
    rows = store.ProbeRows(
      probe_offsets=np.concatenate([[0], np.cumsum(sizes[sizes > 0])]),
      probe_src=np.zeros((int((sizes > 0).sum()), 16), np.uint8),
      probe_version=np.full(int((sizes > 0).sum()), 4, np.uint8),
      dst=np.zeros((n, 16), np.uint8),
      seconds=seconds[order],
      rtt_bytes=np.ones((n, 2), np.uint8),
      hashed_order=None,
    )
    rows.write(str(tmp_path / str(k)), {})
    pieces.append(str(tmp_path / str(k)))
  seconds = np.concatenate([np.load(os.path.join(p, "seconds.npy")) for p in pieces])
  for fraction in (0.0001, 0.001, 0.1, 0.25, 0.4, 0.5, 0.6, 0.9, 0.999, 0.9999):
    expected = np.quantile(seconds, 1 - fraction, method="higher")
    assert assemble.time_cutoff(pieces, fraction) == expected, fraction


def _prepare_process(prepared_dir, files, pause_at=None, stderr=subprocess.PIPE):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  if pause_at:  # the CLI with prepare stopping itself at that stage
    command = ["-m", "tests.helpers.paused_prepare", pause_at]
  else:
    command = [
      "-c",
      "import sys; from maxtext_netdata import cli; sys.exit(cli.main(sys.argv[1:]))",
    ]
  return subprocess.Popen(
    [
      sys.executable,
      *command,
      "prepare",
      str(REPO / "configs" / "base.yml"),
      f"grain_train_files={','.join(files)}",
      f"network_prepared_dir={prepared_dir}",
    ],
    env=env,
    stdout=subprocess.PIPE,
    stderr=stderr,
    text=True,
    cwd=REPO,
  )


def _wait_stopped(process: subprocess.Popen, timeout: float = 240) -> None:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    assert process.poll() is None, process.communicate()
    with open(f"/proc/{process.pid}/stat") as f:
      if f.read().rsplit(")", 1)[1].split()[0] == "T":
        return
    time.sleep(0.05)
  raise AssertionError("prepare did not reach its stage")


@pytest.mark.parametrize("stage", ["reading", "partitioned", "sorted", "slicing", "assembled"])
def test_a_prepare_killed_at_any_stage_leaves_no_store_and_a_rerun_completes(
  tmp_path, raw_files, stage
):
  cfg = store_config(tmp_path, raw_files)
  process = _prepare_process(tmp_path, raw_files, pause_at=stage)
  try:
    _wait_stopped(process)
    work = glob.glob(str(tmp_path / ".tmp-*"))
    assert len(work) == 1 and os.listdir(work[0])  # killed with work on disk
    if stage == "slicing":  # a bucket's slices' files among it
      assert glob.glob(os.path.join(work[0], ".*-spill", "bucket-*-slices", "bucket-*.bin"))
  finally:
    process.send_signal(signal.SIGKILL)
    process.wait()
  assert process.returncode == -signal.SIGKILL
  with pytest.raises(Exception, match="not a prepared store"):
    store.PreparedStore(os.path.join(tmp_path, prepare.fingerprint(cfg, *_entries(cfg)), "train"))
  splits = prepare.prepare(cfg, progress=False)  # cached=False: nothing was taken for a store
  assert not splits.cached and splits.train.num_rows + splits.eval.num_rows == 30_000
  assert sorted(os.listdir(tmp_path)) == [os.path.basename(splits.summary["path"])]
  fresh = prepare.prepare(store_config(tmp_path / "fresh", raw_files), progress=False)
  assert store_files(splits.summary["path"]) == store_files(fresh.summary["path"])


def _entries(cfg):
  from maxtext_netdata.data import remote  # noqa: PLC0415

  options = remote.StorageOptions.from_config(cfg)
  return remote.expand_all(cfg.grain_train_files, options), []


def test_two_concurrent_prepares_end_with_one_valid_store(tmp_path, raw_files):
  first = _prepare_process(tmp_path, raw_files, pause_at="partitioned")
  try:
    _wait_stopped(first)  # holds the builder lock
    log = tmp_path.parent / f"{tmp_path.name}-second.log"
    with open(log, "w") as second_err:
      second = _prepare_process(tmp_path, raw_files, stderr=second_err)
    deadline = time.monotonic() + 240  # the second's start-up on a busy machine
    while "waiting" not in log.read_text() and time.monotonic() < deadline:
      assert second.poll() is None
      time.sleep(0.05)
    assert "waiting" in log.read_text(), log.read_text()  # before the first may go on
    first.send_signal(signal.SIGCONT)
    out_first, err_first = first.communicate(timeout=120)
    out_second, _ = second.communicate(timeout=120)
    err_second = log.read_text()
  finally:
    for p in (first, second):
      if p.poll() is None:
        p.kill()
        p.wait()
  assert first.returncode == 0, err_first
  assert second.returncode == 0, err_second
  assert "another process is building" in err_second
  assert "(cached)" in out_second and "(cached)" not in out_first
  entries = os.listdir(tmp_path)
  assert len(entries) == 1  # one store; no second build, temporary folder or lock left
  splits = prepare.prepare(store_config(tmp_path, raw_files), progress=False)
  assert splits.cached and splits.train.num_rows + splits.eval.num_rows == 30_000


def test_two_spellings_of_a_source_address_are_one_probe(tmp_path, raw_files, monkeypatch):
  """A batch's probes come from its source dictionary, where "2001:DB8::1" and "2001:db8::1"
  are two entries: they are still one probe, as in a store of the lowercase rows."""
  table = pa.concat_tables([pq.read_table(f) for f in raw_files])
  src = table.column("src_addr").combine_chunks().cast(pa.string())
  every_other = pa.array(np.arange(table.num_rows) % 2 == 1)
  mixed = pc.if_else(every_other, pc.utf8_upper(src), src)
  assert pc.sum(pc.not_equal(mixed, src)).as_py() > 1000  # IPv6 sources with hex letters
  path = str(tmp_path / "mixed.parquet")
  index = table.schema.get_field_index("src_addr")
  pq.write_table(table.set_column(index, "src_addr", mixed), path, row_group_size=4000)
  one = prepare.prepare(store_config(tmp_path / "one", raw_files), progress=False)
  expected = {k: v for k, v in store_files(one.summary["path"]).items() if k.endswith(".npy")}
  for name in ("in memory", "spilled"):
    if name == "spilled":
      monkeypatch.setattr(partition, "MAX_BUCKET_ROWS", 5_000)
    other = prepare.prepare(store_config(tmp_path / name, [path]), progress=False)
    got = {k: v for k, v in store_files(other.summary["path"]).items() if k.endswith(".npy")}
    assert got.keys() == expected.keys()
    for key in got:
      assert got[key] == expected[key], (name, key)
