"""One store for every process: real `jax.distributed` processes on 127.0.0.1, a moto S3 server
as the shared bucket, each process with its own local cache (a host's disk)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import boto3
import numpy as np
import portpicker
import pytest
from moto.server import ThreadedMotoServer

from maxtext_netdata import config
from maxtext_netdata.data.prepare import prepare
from maxtext_netdata.data.synthetic.generate import generate
from maxtext_netdata.input_pipeline import shared_store

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300  # a bound on a hang, not a speed
STEPS = 3

WORKER = textwrap.dedent(
  """
    import json, os, sys
    from maxtext_netdata import config
    from maxtext_netdata.errors import ConfigError
    from maxtext_netdata.distributed import multihost
    from maxtext_netdata.distributed import mesh as mesh_lib
    from maxtext_netdata.errors import DataError, UserError
    from maxtext_netdata.input_pipeline import create_data_iterator
    from maxtext_netdata.input_pipeline.batches_cli import digest

    overrides = json.loads(sys.argv[1])[int(os.environ.get("JAX_PROCESS_ID", "0"))]
    cfg = config.load(None, overrides)
    multihost.initialize_distributed(cfg)
    try:
      train, _ = create_data_iterator(cfg, mesh_lib.make_mesh(cfg))
    except (DataError, ConfigError, UserError) as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)
    digests = [digest(multihost.gather_to_host(next(train))) for _ in range(int(sys.argv[2]))]
    train.close()
    print(json.dumps(digests))
  """
)


def run_processes(
  per_process: list[list[str]], extra_env=None
) -> list[subprocess.CompletedProcess]:
  """The worker as processes 0..n-1 of one jax.distributed job; all killed on timeout."""
  port = portpicker.pick_unused_port()
  procs = []
  for process_id in range(len(per_process)):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), **(extra_env or {}))
    env.pop("XLA_FLAGS", None)
    if len(per_process) > 1:
      env.update(
        JAX_NUM_PROCESSES=str(len(per_process)),
        JAX_PROCESS_ID=str(process_id),
        JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
      )
    argv = [sys.executable, "-c", WORKER, json.dumps(per_process), str(STEPS)]
    procs.append(
      subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
      )
    )  # fmt: skip
  results = []
  try:
    for proc in procs:
      out, err = proc.communicate(timeout=TIMEOUT_S)
      results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
  finally:
    for proc in procs:
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
  assert len(results) == len(procs), "a process outlived the timeout"
  return results


@pytest.fixture(scope="module")
def raw_dir(tmp_path_factory) -> Path:
  out = tmp_path_factory.mktemp("raw")
  generate(str(out), rows=20_000, shards=4, seed=7, progress=False)
  return out


@pytest.fixture(scope="module")
def s3_env():
  """A moto S3 server with an empty bucket `stores`; the environment that reaches it."""
  env = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
  }
  with pytest.MonkeyPatch.context() as patch:
    for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
      patch.delenv(key, raising=False)
    for key, value in env.items():
      patch.setenv(key, value)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
      host, port = server.get_host_and_port()
      env["AWS_ENDPOINT_URL_S3"] = f"http://{host}:{port}"
      boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL_S3"]).create_bucket(Bucket="stores")
      yield env
    finally:
      server.stop()


def overrides(raw: str, **extra) -> list[str]:
  values = {
    "grain_train_files": raw,
    "max_target_length": 256,
    "global_batch_size_to_load": 8,
    "grain_worker_count": 0,
    "data_shuffle_seed": 3,
    **extra,
  }
  return [f"{key}={value}" for key, value in values.items()]


def ok(results) -> list:
  for process_id, result in enumerate(results):
    assert result.returncode == 0, f"process {process_id}:\n{result.stderr[-3000:]}"
  return [json.loads(result.stdout.strip().splitlines()[-1]) for result in results]


@pytest.mark.slow
def test_two_hosts_share_one_store_through_s3(raw_dir, s3_env, tmp_path):
  raw = f"{raw_dir}/*.parquet"
  shared = overrides(raw, network_prepared_dir="s3://stores/prepared")
  per_host = [
    [*shared, f"network_store_cache_dir={tmp_path}/host{p}", f"base_output_directory={tmp_path}"]
    for p in range(2)
  ]
  digests = ok(run_processes(per_host, s3_env))
  # The batches of one process preparing from the raw files itself, into a private folder.
  alone = ok(run_processes([overrides(raw, network_prepared_dir=f"{tmp_path}/alone")]))[0]
  assert len(alone) == STEPS and digests == [alone, alone]
  # One builder: host 1 holds a copy of host 0's store (the summary's timings and peak RSS
  # are the builder's), and the bucket holds the same store.
  (fp,) = os.listdir(tmp_path / "alone")
  meta = [(tmp_path / f"host{p}" / fp / "meta.json").read_bytes() for p in range(2)]
  assert meta[0] == meta[1]
  assert (
    json.loads(meta[0])["rows"]
    == json.loads((tmp_path / "alone" / fp / "meta.json").read_bytes())["rows"]
  )
  s3 = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL_S3"])
  assert s3.get_object(Bucket="stores", Key=f"prepared/{fp}/meta.json")["Body"].read() == meta[0]
  for name in ("train/seconds.npy", "test/dst_index.npy", "test/dst_table.npy"):
    local = (tmp_path / "alone" / fp / name).read_bytes()
    assert s3.get_object(Bucket="stores", Key=f"prepared/{fp}/{name}")["Body"].read() == local


@pytest.mark.slow
def test_a_host_with_other_files_stops_every_host(raw_dir, tmp_path):
  files = sorted(str(p) for p in raw_dir.glob("*.parquet"))
  common = [f"network_prepared_dir={tmp_path}/prepared"]
  per_host = [
    overrides(",".join(files)) + common,
    overrides(",".join(files[:3])) + common,  # this host's listing lacks a file
  ]
  results = run_processes(per_host)
  for process_id, result in enumerate(results):
    assert result.returncode == 2, f"process {process_id}:\n{result.stderr[-3000:]}"
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: store check: 1 process(es) hold another store than process 0")
    assert "process 1 holds store" in last and "same raw files" in last


def test_mismatch_names_what_differs(sample_dir, tmp_path):
  splits = prepare.ensure_prepared(
    config.load(None, [f"grain_train_files={sample_dir}", f"network_prepared_dir={tmp_path}"]),
    progress=False,
  )
  own = shared_store.identity(splits)
  assert shared_store.mismatch(np.stack([own, own])) is None
  assert f"store {splits.summary['fingerprint']} (train {splits.train.num_rows:,} rows" in (
    shared_store.describe(own)
  )
  stale = own.copy()
  stale[8] ^= 1  # the same fingerprint, one train row fewer or more
  message = shared_store.mismatch(np.stack([own, own, stale]))
  assert "1 process(es) hold the same fingerprint but other counts" in message
  assert "process 2 holds" in message and "process 1 " not in message
  assert "\n" not in message


def test_a_store_without_its_top_meta_in_the_bucket_is_rebuilt_not_copied(
  raw_dir, s3_env, tmp_path, monkeypatch
):
  for key, value in s3_env.items():
    monkeypatch.setenv(key, value)

  def prepared(cache: str):
    cfg = config.load(
      None,
      overrides(
        f"{raw_dir}/*.parquet",
        network_prepared_dir="s3://stores/partial",
        network_store_cache_dir=str(tmp_path / cache),
      ),
    )
    return prepare.prepare(cfg, progress=False)

  built = prepared("a")
  assert "copied_from" not in built.summary
  fp = built.summary["fingerprint"]
  s3 = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL_S3"])
  # An upload cut short before its last file: every split is there, the top meta.json not.
  s3.delete_object(Bucket="stores", Key=f"partial/{fp}/meta.json")
  rebuilt = prepared("b")
  assert "copied_from" not in rebuilt.summary
  copied = prepared("c")
  assert copied.summary["copied_from"] == f"s3://stores/partial/{fp}"
  assert (tmp_path / "c" / fp / "meta.json").read_bytes() == (
    tmp_path / "b" / fp / "meta.json"
  ).read_bytes()
  np.testing.assert_array_equal(copied.train.seconds, built.train.seconds)


def test_new_files_are_appended_to_the_hosts_cached_store_and_shared(
  raw_dir, s3_env, tmp_path, monkeypatch
):
  for key, value in s3_env.items():
    monkeypatch.setenv(key, value)
  files = sorted(str(path) for path in raw_dir.glob("*.parquet"))

  def prepared(cache: str, files: list[str]):
    cfg = config.load(
      None,
      overrides(
        ",".join(files),
        network_prepared_dir="s3://stores/daily",
        network_store_cache_dir=str(tmp_path / cache),
      ),
    )
    return prepare.prepare(cfg, progress=False)

  base = prepared("a", files[:3])
  appended = prepared("a", files)  # not in the bucket: appended to the cache's store, uploaded
  assert appended.summary["appended"]["base"] == base.summary["path"]
  assert "copied_from" not in appended.summary
  fp = appended.summary["fingerprint"]
  copied = prepared("b", files)  # another host: the appended store, from the bucket
  assert copied.summary["copied_from"] == f"s3://stores/daily/{fp}"
  for split in ("train", "eval"):
    for array in ("probe_offsets", "dst", "seconds", "rtt_bytes"):
      np.testing.assert_array_equal(
        getattr(getattr(copied, split), array), getattr(getattr(appended, split), array)
      )
