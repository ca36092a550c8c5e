"""A real S3-compatible server (moto's) on a loopback port, for tests of `s3://` inputs and
outputs through the project's storage layer."""

from __future__ import annotations

import contextlib

import pytest


@contextlib.contextmanager
def s3_server(env: pytest.MonkeyPatch, *buckets: str):
  """Yields a boto3 client of a moto S3 server on a free loopback port holding `buckets`.

  `env` (a test's `monkeypatch`) gets the environment boto3 and pyarrow's S3 filesystem read:
  dummy credentials, a region, `AWS_ENDPOINT_URL` pointing at the server, and no profile or
  session of the machine's. moto's buckets outlive its server in the process, so each test
  names buckets of its own. The server stops when the block ends.
  """
  boto3 = pytest.importorskip("boto3")
  moto_server = pytest.importorskip("moto.server")
  for key in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
    env.delenv(key, raising=False)
  env.setenv("AWS_ACCESS_KEY_ID", "testing")
  env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
  env.setenv("AWS_DEFAULT_REGION", "us-east-1")
  server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
  server.start()
  try:
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env.setenv("AWS_ENDPOINT_URL", endpoint)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    for bucket in buckets:
      client.create_bucket(Bucket=bucket)
    yield client
  finally:
    server.stop()
