"""Listing globs on S3: `data.remote.expand` against fsspec's glob, by requests and time.

    python benchmarks/bench_remote_listing.py [--folders 40] [--files 50]

A moto S3 server on loopback holds `--folders` folders of `--files` objects each under
`s3://bench/raw/`, plus `raw/target/` with `--files` objects and a subfolder. For each pattern it
prints the ListObjects requests the server saw and the wall time (best of 3) of:
- `remote.expand` (pyarrow.fs: one delimited listing of the literal folder, or one flat
  listing of the tree under it when a folder is a wildcard);
- fsspec's `glob` over the same pyarrow filesystem (`ArrowFSWrapper`): one delimited listing
  per folder walked.
s3fs is not measured: it is not installed (it would add aiobotocore); its glob walks
folders the same way as fsspec's.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

import boto3
from fsspec.implementations.arrow import ArrowFSWrapper
from moto.server import ThreadedMotoServer

from maxtext_netdata.data import remote


class _ListCounter(logging.Handler):
  """Counts the ListObjects requests in the moto server's request log."""

  def __init__(self):
    super().__init__()
    self.count = 0

  def emit(self, record):
    if "list-type=2" in record.getMessage():
      self.count += 1


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--folders", type=int, default=40)
  parser.add_argument("--files", type=int, default=50)
  args = parser.parse_args()
  for key, value in (("AWS_ACCESS_KEY_ID", "x"), ("AWS_SECRET_ACCESS_KEY", "x")):
    os.environ[key] = value
  counter = _ListCounter()
  werkzeug = logging.getLogger("werkzeug")
  werkzeug.setLevel(logging.INFO)
  werkzeug.addHandler(counter)
  werkzeug.propagate = False
  server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
  server.start()
  try:
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="bench")
    keys = [f"raw/f{i:03d}/{j:04d}.parquet" for i in range(args.folders) for j in range(args.files)]
    keys += [f"raw/target/{j:04d}.parquet" for j in range(args.files)]
    keys += [f"raw/target/sub/{j:04d}.parquet" for j in range(args.files)]
    for key in keys:
      client.put_object(Bucket="bench", Key=key, Body=b"x")
    options = remote.StorageOptions(s3_endpoint=endpoint, s3_region="us-east-1")
    arrow_fs, _ = remote.filesystem("s3://bench/x", options)
    wrapped = ArrowFSWrapper(arrow_fs)
    print(f"{len(keys):,} objects in s3://bench/raw/")
    print(f"  {'pattern':<28} {'lister':<16} {'lists':>5} {'matches':>7} {'best s':>7}")
    for pattern in ("raw/target/*.parquet", "raw/*/0001.parquet", "raw/target/**/*.parquet"):
      for name, lister in (
        ("remote.expand", lambda p: remote.expand(f"s3://bench/{p}", options)),
        ("fsspec glob", lambda p: wrapped.glob(f"bench/{p}")),
      ):
        times = []
        for _ in range(3):
          counter.count = 0
          start = time.perf_counter()
          found = lister(pattern)
          times.append(time.perf_counter() - start)
        print(f"  {pattern:<28} {name:<16} {counter.count:>5} {len(found):>7} {min(times):>7.3f}")
  finally:
    server.stop()


if __name__ == "__main__":
  main()
