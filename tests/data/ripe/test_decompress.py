"""ingest's compressed inputs (data.ripe.decompress): bz2 on every core gives the same shards as
the plain text, and damaged input stops the run with one line naming the file."""

import bz2
import glob
import gzip
import os
import re
import subprocess
import sys

import pyarrow as pa
import pytest

from maxtext_netdata.data import remote
from maxtext_netdata.data.ripe import blocks, decompress
from maxtext_netdata.data.ripe.ingest import ingest, storage_options
from maxtext_netdata.data.synthetic.generate import generate
from maxtext_netdata.errors import DataError
from tests.helpers.s3 import s3_server


@pytest.fixture(scope="module")
def text(tmp_path_factory):
  """20,000 generated results as RIPE Atlas JSON lines (~8 MB: ~80 bz2 blocks at level 1)."""
  root = tmp_path_factory.mktemp("generated")
  paths = generate(str(root), rows=20_000, shards=2, seed=5, progress=False, fmt="ripe-json")
  return b"".join(open(p, "rb").read() for p in paths)


@pytest.fixture(scope="module")
def plain_shards(text, tmp_path_factory):
  """The shards of the plain text: what every compressed form must give, byte for byte."""
  root = tmp_path_factory.mktemp("plain")
  path = _write(root / "dump.json", text)
  ingest([path], str(root / "out"), shards=3, progress=False)
  return _shards(root / "out")


def _write(path, data: bytes) -> str:
  with open(path, "wb") as f:
    f.write(data)
  return str(path)


def _shards(out_dir) -> dict[str, bytes]:
  files = sorted(glob.glob(os.path.join(out_dir, "*.parquet")))
  assert len(files) == 3
  return {os.path.basename(f): open(f, "rb").read() for f in files}


def _threads() -> int:
  """The process's own threads, native ones included (the decompressor's are C++ threads)."""
  return len(os.listdir("/proc/self/task"))


def _streams(text: bytes, pieces: int) -> bytes:
  """`text` as concatenated bz2 streams cut mid-line, as `pbzip2` writes a file."""
  cuts = [len(text) * k // pieces + 7 for k in range(1, pieces)]
  parts = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
  return b"".join(bz2.compress(p, 1) for p in parts)


@pytest.mark.parametrize("threads", [1, 2, 4, 0])
def test_bz2_on_every_thread_count_gives_the_plain_texts_shards(
  tmp_path, text, plain_shards, threads
):
  path = _write(tmp_path / "dump.json.bz2", bz2.compress(text, 1))
  ingest([path], str(tmp_path / "out"), shards=3, progress=False, decompress_threads=threads)
  assert _shards(tmp_path / "out") == plain_shards


@pytest.mark.parametrize("name", ["multi.json.bz2", "level9.json.bz2", "dump.json.gz"])
def test_streams_levels_and_gzip_give_the_plain_texts_shards(tmp_path, text, plain_shards, name):
  data = {
    "multi.json.bz2": lambda: _streams(text, 5),
    "level9.json.bz2": lambda: bz2.compress(text, 9),
    "dump.json.gz": lambda: gzip.compress(text),
  }[name]()
  path = _write(tmp_path / name, data)
  # Blocks of 100 kB: pieces end inside lines, streams and bz2 blocks.
  ingest([path], str(tmp_path / "out"), shards=3, block_bytes=100_000, progress=False)
  assert _shards(tmp_path / "out") == plain_shards


def test_bzip2_tools_file_gives_the_same_text(tmp_path, text):
  source = _write(tmp_path / "dump.json", text)
  subprocess.run(["bzip2", "-k", "-1", source], check=True)
  stream = decompress.open_stream(pa.OSFile(source + ".bz2"), "bz2", 2)
  assert isinstance(stream, decompress.Bz2Stream)
  try:
    assert b"".join(iter(lambda: stream.read(1 << 20), b"")) == text
    assert stream.position() == os.path.getsize(source + ".bz2")
  finally:
    stream.close()


def test_progress_counts_the_compressed_file_once(tmp_path, text):
  path = _write(tmp_path / "dump.json.bz2", _streams(text, 3))

  class Progress:
    done = 0

    def update(self, n):
      assert n >= 0
      Progress.done += n

  entry = remote.expand(path, storage_options())[0]
  lines = sum(b.newlines for b in blocks.iter_blocks(entry, storage_options(), 1 << 20, Progress()))
  assert lines == text.count(b"\n") and Progress.done == os.path.getsize(path)


_DAMAGES = [
  "cut in a block",
  "cut before the end marker",
  "a stream cut in its header",
  "garbage after the streams",
  "garbage between streams",
  "zeros between streams",
  "a header only",
  "no bz2 at all",
  "a flipped bit",
]


@pytest.fixture(scope="module")
def damaged(text) -> dict[str, bytes]:
  packed, small = bz2.compress(text, 1), bz2.compress(text[:50_000], 1)
  return {
    "cut in a block": packed[: len(packed) * 2 // 3],
    "cut before the end marker": packed[:-6],
    "a stream cut in its header": small + b"BZh9",
    "garbage after the streams": small + b"garbage!",
    "garbage between streams": small + b"garbage!" + small,
    "zeros between streams": small + bytes(64) + small,
    "a header only": b"BZh9",
    "no bz2 at all": text[:100_000],
    "a flipped bit": packed[:50_000] + bytes([packed[50_000] ^ 4]) + packed[50_001:],
  }


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("damage", _DAMAGES)
def test_damaged_bz2_is_an_error_naming_the_file(tmp_path, damaged, damage, threads):
  path = _write(tmp_path / "dump.json.bz2", damaged[damage])
  with pytest.raises(DataError) as error:
    ingest([path], str(tmp_path / "out"), progress=False, decompress_threads=threads)
  message = str(error.value)
  where = r"(after line [1-9]\d*|before its first line)"
  assert re.match(rf"{re.escape(path)}: corrupt or truncated bz2 data {where} \(", message), message
  assert "\n" not in message
  assert not os.path.exists(tmp_path / "out" / ".complete")


def test_empty_bz2_streams_are_text_of_nothing(tmp_path):
  for name, data in (("empty.bz2", b""), ("streams.bz2", bz2.compress(b"") * 3)):
    stream = decompress.open_stream(pa.OSFile(_write(tmp_path / name, data)), "bz2", 2)
    try:
      assert stream.read(1 << 20) == b"" and stream.read(1 << 20) == b""
    finally:
      stream.close()


@pytest.mark.parametrize("damage", ["cut", "corrupt"])
def test_damaged_gzip_is_one_error_line_from_the_command(tmp_path, text, damage):
  packed = gzip.compress(text[:2_000_000])
  middle = len(packed) // 2
  data = {
    "cut": packed[:middle],
    "corrupt": packed[:middle] + b"\xff" * 64 + packed[middle + 64 :],
  }[damage]
  path = _write(tmp_path / "dump.json.gz", data)
  done = subprocess.run(
    [sys.executable, "-m", "maxtext_netdata", "ingest", path, "--out", str(tmp_path / "out")],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert done.returncode == 2 and "Traceback" not in done.stderr
  error = done.stderr.strip().splitlines()[-1]
  assert error.startswith(f"maxtext-netdata ingest: error: {path}: corrupt or truncated gzip data")


def test_the_command_takes_decompress_threads(tmp_path, text):
  lines = text[: text.index(b"\n", 400_000) + 1]
  path = _write(tmp_path / "dump.json.bz2", bz2.compress(lines, 1))
  out = str(tmp_path / "out")
  command = [sys.executable, "-m", "maxtext_netdata", "ingest", path, "--out", out]
  done = subprocess.run([*command, "--decompress-threads", "2"], capture_output=True, text=True)
  assert done.returncode == 0, done.stderr
  assert "rows written" in done.stdout and os.path.exists(os.path.join(out, ".complete"))
  bad = subprocess.run([*command, "--decompress-threads", "-1"], capture_output=True, text=True)
  assert bad.returncode == 2 and "--decompress-threads must be >= 0" in bad.stderr
  usage = subprocess.run([*command[:4], "--help"], capture_output=True, text=True)
  assert "--decompress-threads N" in usage.stdout


def test_a_failed_run_leaves_no_decompressing_thread(tmp_path, text):
  packed = bz2.compress(text, 1)
  good = _write(tmp_path / "good.json.bz2", packed)
  ingest([good], str(tmp_path / "warm"), progress=False, decompress_threads=4)  # pools started
  before = _threads()
  # A bad line in the first block: the run stops while the decoder is far from done.
  bad = _write(tmp_path / "bad.json.bz2", bz2.compress(b"not json\n" + text, 1))
  with pytest.raises(DataError, match="line 1: not JSON"):
    ingest([bad], str(tmp_path / "out"), progress=False, decompress_threads=4)
  cut = _write(tmp_path / "cut.json.bz2", packed[: len(packed) // 2])
  with pytest.raises(DataError, match="corrupt or truncated bz2"):
    ingest([cut], str(tmp_path / "out"), progress=False, decompress_threads=4)
  assert _threads() <= before


def test_a_stream_that_cannot_seek_is_read_by_arrow(text):
  raw = pa.BufferedInputStream(pa.BufferReader(bz2.compress(text[:300_000])), 1 << 16)
  assert not raw.seekable()
  stream = decompress.open_stream(raw, "bz2", 2)
  assert not isinstance(stream, decompress.Bz2Stream)
  assert b"".join(iter(lambda: stream.read(1 << 16), b"")) == text[:300_000]
  stream.close()


def test_bz2_on_s3_gives_the_local_shards(tmp_path, monkeypatch, text, plain_shards):
  with s3_server(monkeypatch, "atlas-bz2") as client:
    packed = _streams(text, 2)
    client.put_object(Bucket="atlas-bz2", Key="dumps/ping-2025-07-01T0000.bz2", Body=packed)
    client.put_object(Bucket="atlas-bz2", Key="cut/ping.bz2", Body=packed[: len(packed) // 2])
    [entry] = remote.expand("s3://atlas-bz2/dumps/*.bz2", storage_options())
    stream = decompress.open_stream(remote.open_input_file(entry, storage_options()), "bz2", 2)
    assert isinstance(stream, decompress.Bz2Stream)  # an S3 file seeks: the parallel reader
    try:
      assert b"".join(iter(lambda: stream.read(1 << 20), b"")) == text
    finally:
      stream.close()
    out = str(tmp_path / "out")
    ingest(["s3://atlas-bz2/dumps/*.bz2"], out, shards=3, progress=False, decompress_threads=2)
    with pytest.raises(DataError, match=r"^s3://atlas-bz2/cut/ping.bz2: corrupt or truncated bz2"):
      ingest(["s3://atlas-bz2/cut/ping.bz2"], str(tmp_path / "cut"), progress=False)
  assert _shards(out) == plain_shards
