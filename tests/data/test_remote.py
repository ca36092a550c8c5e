"""Remote storage: glob listing, the SDKs' retries, and prepare from s3:// (a local moto S3 server)."""

import dataclasses
import http.client
import http.server
import os
import socket
import threading
import time
import urllib.parse

import boto3
import numpy as np
import pytest
from moto.server import ThreadedMotoServer

from maxtext_netdata import config
from maxtext_netdata.data import remote
from maxtext_netdata.data.prepare import prepare
from maxtext_netdata.data.store import store
from maxtext_netdata.data.synthetic.generate import generate
from maxtext_netdata.errors import DataError

BUCKET = "pings"


@pytest.fixture(scope="module")
def raw_files(tmp_path_factory):
  return generate(str(tmp_path_factory.mktemp("raw")), rows=8_000, shards=3, seed=3, progress=False)


@pytest.fixture(scope="module")
def s3(raw_files):
  """A moto S3 server on a free loopback port holding the raw files under `s3://pings/raw/`."""
  with pytest.MonkeyPatch.context() as env:
    for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
      env.delenv(key, raising=False)
    env.setenv("AWS_ACCESS_KEY_ID", "testing")
    env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    env.setenv("AWS_DEFAULT_REGION", "us-east-1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
      host, port = server.get_host_and_port()
      endpoint = f"http://{host}:{port}"
      client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
      client.create_bucket(Bucket=BUCKET)
      for path in raw_files:
        client.upload_file(path, BUCKET, f"raw/{os.path.basename(path)}")
      yield endpoint
    finally:
      server.stop()


class FlakyProxy:
  """A loopback HTTP proxy in front of `target` that answers 503 to every `nth` request.

  `lists` records the query of every bucket listing (ListObjects) that passes through.
  """

  def __init__(self, target: str, nth: int):
    self.target = target.removeprefix("http://")
    self.nth = nth
    self.requests = 0
    self.failed = 0
    self.failed_reads = 0  # ranged GETs: reads of parquet data, after the file was opened
    self.lists: list[dict[str, str]] = []
    lock = threading.Lock()
    proxy = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = "HTTP/1.1"

      def log_message(self, *args):
        pass

      def _handle(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
        with lock:
          if self.command == "GET" and "list-type" in query:
            proxy.lists.append(query)
          proxy.requests += 1
          fail = proxy.nth and proxy.requests % proxy.nth == 0
          proxy.failed += bool(fail)
          proxy.failed_reads += bool(fail and self.command == "GET" and "Range" in self.headers)
        if fail:
          error = b"<Error><Code>ServiceUnavailable</Code><Message>busy</Message></Error>"
          self.send_response(503)
          self.send_header("Content-Type", "application/xml")
          self.send_header("Content-Length", str(len(error)))
          self.end_headers()
          self.wfile.write(error)
          return
        connection = http.client.HTTPConnection(proxy.target, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
        connection.request(self.command, self.path, body=body or None, headers=headers)
        response = connection.getresponse()
        data = response.read()
        self.send_response(response.status)
        for key, value in response.getheaders():
          if key.lower() not in ("content-length", "connection", "transfer-encoding"):
            self.send_header(key, value)
        # A HEAD answer has no body but the length of the object it describes.
        length = response.getheader("Content-Length") if self.command == "HEAD" else len(data)
        self.send_header("Content-Length", str(length or 0))
        self.end_headers()
        if self.command != "HEAD":
          self.wfile.write(data)
        connection.close()

      do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

    self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

  @property
  def endpoint(self) -> str:
    return f"http://127.0.0.1:{self.server.server_address[1]}"

  def __enter__(self):
    self.thread.start()
    return self

  def __exit__(self, *exc):
    self.server.shutdown()
    self.server.server_close()
    self.thread.join()


def s3_config(prepared_dir, files, endpoint, *overrides):
  return config.load(
    None,
    [
      f"grain_train_files={files}",
      f"network_prepared_dir={prepared_dir}",
      f"network_s3_endpoint={endpoint}",
      "network_remote_backoff_s=0.01",
      *overrides,
    ],
  )


def assert_same_store(a: store.PreparedStore, b: store.PreparedStore):
  assert a.num_rows == b.num_rows and a.num_probes == b.num_probes
  for name in (*store.PROBE_ARRAYS, *store.ROW_FILES, *store.TABLE_ARRAYS):
    np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def test_store_from_s3_equals_store_from_local_files(tmp_path, raw_files, s3):
  local = prepare.prepare(
    config.load(
      None, [f"grain_train_files={','.join(raw_files)}", f"network_prepared_dir={tmp_path / 'l'}"]
    ),
    progress=False,
  )
  cfg = s3_config(tmp_path / "s", f"s3://{BUCKET}/raw/*.parquet", s3)
  remote_splits = prepare.prepare(cfg, progress=False)
  assert_same_store(local.train, remote_splits.train)
  assert_same_store(local.eval, remote_splits.eval)
  assert remote_splits.summary["train_files"] == [
    f"s3://{BUCKET}/raw/{os.path.basename(p)}" for p in raw_files
  ]
  assert prepare.ensure_prepared(cfg, progress=False).cached


def test_endpoint_and_region_come_from_the_environment(tmp_path, s3, monkeypatch):
  monkeypatch.setenv("AWS_ENDPOINT_URL", s3)
  options = remote.StorageOptions.from_config(config.load(None, []))
  assert options.s3_endpoint == s3 and options.s3_region == "us-east-1"
  assert len(remote.expand(f"s3://{BUCKET}/raw", options)) == 3  # a prefix: its parquet files


def test_flaky_server_is_survived_by_retries(tmp_path, raw_files, s3):
  with FlakyProxy(s3, nth=3) as proxy:
    cfg = s3_config(tmp_path / "f", f"s3://{BUCKET}/raw/*.parquet", proxy.endpoint)
    splits = prepare.prepare(cfg, progress=False)
  assert proxy.failed_reads > 0  # failures in the middle of reading a file were survived
  direct = prepare.prepare(s3_config(tmp_path / "d", f"s3://{BUCKET}/raw/*.parquet", s3))
  assert_same_store(splits.train, direct.train)


def test_persistent_server_errors_fail_after_the_configured_attempts(tmp_path, s3):
  with FlakyProxy(s3, nth=1) as proxy:
    cfg = s3_config(
      tmp_path, f"s3://{BUCKET}/raw/*.parquet", proxy.endpoint, "network_remote_retries=3"
    )
    with pytest.raises(DataError, match="cannot list files: .*SERVICE_UNAVAILABLE") as error:
      prepare.prepare(cfg, progress=False)
  assert proxy.requests == 3  # the AWS SDK's attempts, all of them listings
  assert len(proxy.lists) == 3
  assert f"s3://{BUCKET}/raw/*.parquet" in str(error.value)
  assert len(str(error.value).splitlines()) == 1


@pytest.mark.parametrize(
  ("uri", "message"),
  [
    ("s3://no-such-bucket/raw/*.parquet", "NO_SUCH_BUCKET"),
    (f"s3://{BUCKET}/raw/missing.parquet", "no such file"),
    (f"s3://{BUCKET}/raw/*.csv", "no file matches"),
  ],
)
def test_missing_bucket_or_object_fails_at_once_naming_the_uri(tmp_path, s3, uri, message):
  with FlakyProxy(s3, nth=0) as proxy:
    start = time.perf_counter()
    with pytest.raises(DataError, match=message) as error:
      prepare.prepare(s3_config(tmp_path, uri, proxy.endpoint), progress=False)
  assert time.perf_counter() - start < 30  # no retries with back-off, no hang (a busy machine)
  assert uri in str(error.value) and len(str(error.value).splitlines()) == 1
  assert proxy.requests <= 2  # no retries


def test_local_globs(tmp_path):
  for name in ("a/x.parquet", "a/y.parquet", "a/b/z.parquet", "a/notes.txt"):
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_bytes(b"")
  options = remote.StorageOptions()

  def names(pattern):
    return [
      os.path.relpath(e.uri, tmp_path) for e in remote.expand(str(tmp_path / pattern), options)
    ]

  assert names("a/*.parquet") == ["a/x.parquet", "a/y.parquet"]
  assert names("a/**/*.parquet") == ["a/b/z.parquet", "a/x.parquet", "a/y.parquet"]
  assert names("*/b/*.parquet") == ["a/b/z.parquet"]
  assert names("a/[xz].parquet") == ["a/x.parquet"]
  assert names("a") == ["a/b/z.parquet", "a/x.parquet", "a/y.parquet"]
  assert names("a/x.parquet") == ["a/x.parquet"]
  both = remote.expand_all(f"{tmp_path}/a/y.parquet, {tmp_path}/a/*.parquet", options)
  assert [os.path.basename(e.uri) for e in both] == ["x.parquet", "y.parquet"]
  with pytest.raises(DataError, match="no file matches"):
    remote.expand(str(tmp_path / "a/*.csv"), options)
  with pytest.raises(DataError, match="no file matches"):  # a folder that is not there
    remote.expand(str(tmp_path / "nowhere/*.parquet"), options)
  with pytest.raises(DataError, match="unsupported storage scheme"):
    remote.expand("ftp://host/x.parquet", options)
  with pytest.raises(DataError, match="'\\*\\*' can only be an entire path component"):
    remote.expand(str(tmp_path / "a/**.parquet"), options)


def test_a_folder_a_glob_matches_gives_its_files_and_a_dangling_link_is_an_error(tmp_path):
  # Spark writes a table as a folder named like a file; an unfetched git-annex or DVC file
  # is a link to nothing, which pyarrow's listing leaves out.
  for name in ("d/day0.parquet/part-0.parquet", "d/day0.parquet/_SUCCESS", "d/x.parquet"):
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_bytes(b"")
  (tmp_path / "d/empty.parquet").mkdir()
  options = remote.StorageOptions()

  def names(pattern):
    return [
      os.path.relpath(e.uri, tmp_path) for e in remote.expand(str(tmp_path / pattern), options)
    ]

  assert names("d/*.parquet") == ["d/day0.parquet/part-0.parquet", "d/x.parquet"]
  assert names("d/**/*.parquet") == ["d/day0.parquet/part-0.parquet", "d/x.parquet"]
  os.symlink(tmp_path / "annex/missing", tmp_path / "d/day0.parquet/part-1.parquet")
  for pattern in ("d/*.parquet", "d/day0.parquet", "d/**/*.parquet"):
    with pytest.raises(DataError, match=r"d/day0.parquet/part-1.parquet: a link to .*annex/"):
      remote.expand(str(tmp_path / pattern), options)
  assert names("d/x.parquet") == ["d/x.parquet"]


@pytest.mark.parametrize(
  ("pattern", "more"), [("t/*.dump", []), ("t/**/*.dump", ["t/b/z.dump"])], ids=["flat", "deep"]
)
def test_a_matched_folder_gives_the_files_a_folder_input_gives(tmp_path, pattern, more):
  # A recursive listing holds the folder's files already; a flat one lists the folder again.
  for name in ("t/a.dump/x", "t/a.dump/sub/y", "t/a.dump/.hidden", "t/b/z.dump", "t/c.dump"):
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_bytes(b"")
  found = remote.expand(str(tmp_path / pattern), remote.StorageOptions(), remote.VISIBLE_FILES)
  names = [os.path.relpath(e.uri, tmp_path) for e in found]
  assert names == sorted(["t/a.dump/sub/y", "t/a.dump/x", "t/c.dump", *more])


def test_unreachable_gcs_endpoint_fails_in_seconds_naming_the_uri(tmp_path, monkeypatch):
  with socket.socket() as closed:  # a port nothing listens on
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
  cfg = config.load(
    None,
    [
      "grain_train_files=gs://pings/raw/x.parquet",
      f"network_prepared_dir={tmp_path}",
      "network_remote_retries=2",
      "network_remote_backoff_s=0.01",
    ],
  )
  start = time.perf_counter()
  with pytest.raises(DataError, match="gs://pings/raw/x.parquet: cannot look up: ") as error:
    prepare.prepare(cfg, progress=False)
  assert time.perf_counter() - start < 30  # refused, retried twice after 0.01 s: no hang
  assert len(str(error.value).splitlines()) == 1


def test_a_glob_lists_only_its_literal_prefix(tmp_path, raw_files, s3):
  client = boto3.client("s3", endpoint_url=s3, region_name="us-east-1")
  client.create_bucket(Bucket="deep")
  keys = ["a/b/x.parquet", "a/b/y.parquet", "a/b/notes.txt", "a/b/c/z.parquet", "a/bb/w.parquet"]
  keys += [f"a/other/{i}.parquet" for i in range(30)] + ["top.parquet"]
  for key in keys:
    client.put_object(Bucket="deep", Key=key, Body=b"x")
  options = remote.StorageOptions.from_config(s3_config(tmp_path, "", s3))
  with FlakyProxy(s3, nth=0) as proxy:
    found = remote.expand(
      "s3://deep/a/b/*.parquet", dataclasses.replace(options, s3_endpoint=proxy.endpoint)
    )
  assert [e.uri for e in found] == ["s3://deep/a/b/x.parquet", "s3://deep/a/b/y.parquet"]
  assert len(proxy.lists) == 1  # one page: the folder's own entries, not the tree below
  assert proxy.lists[0]["prefix"] == "a/b/" and proxy.lists[0].get("delimiter") == "/"
  with FlakyProxy(s3, nth=0) as proxy:
    found = remote.expand(
      "s3://deep/a/*/*.parquet", dataclasses.replace(options, s3_endpoint=proxy.endpoint)
    )
  assert [e.uri for e in found] == [
    "s3://deep/a/b/x.parquet",
    "s3://deep/a/b/y.parquet",
    "s3://deep/a/bb/w.parquet",
  ] + sorted(f"s3://deep/a/other/{i}.parquet" for i in range(30))
  assert {q["prefix"] for q in proxy.lists} == {"a/"}  # a folder wildcard: the tree under a/
