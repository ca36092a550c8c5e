"""`ingest`'s compressed inputs, decompressed: bz2 on every usable core.

RIPE Atlas's dumps are bz2, which one core decompresses at ~0.1M results/s, a tenth of the
compiled scanner's rate: on one core a machine ingests a dump at the speed of bz2. Here a bz2
input is read by `indexed_bzip2`'s parallel reader, which finds the blocks of the file (each
starts with a 48-bit magic and holds at most 900 kB of text) and decodes them in `threads`
threads, checking each block's and each stream's CRC; a file of several streams (what
`pbzip2` writes) is one text. The text is the same bytes as one core's, so the shards are too.

Two checks of our own, since the parallel reader lets some damage through without an error
(seen with indexed_bzip2 1.7.0): it stops at bytes after a stream's end that are no stream
(garbage, zeros, a stream cut inside its 4-byte header) and returns what came before, and a
file that is no bz2 at all gives no text. So at the end the streams decoded must end at the
file's end (`Bz2Stream._check_end`), and a non-empty file that gave no text is read again by
the library's one-core reader, which raises for any damage. Arrow's bz2 stream, used before,
rejected all of these too.

The reader reads the file through a seekable Python file object, the pyarrow file that
`data.remote` opens for a local path, s3:// or gs:// alike (reads of 128 KiB; each read of a
remote file is a ranged request that the storage SDK retries). A file that cannot seek is
decompressed by Arrow's one-thread bz2 stream, as before.

gzip and zstd stay with Arrow's one-thread decompressors (zlib gives 1.5-2.2M results/s a
core, above the scanner's rate). rapidgzip, the same author's parallel gzip reader, was left out: 0.16.1
returns a gzip file cut inside its deflate stream without an error, its text cut short
(rapidgzip issue #71, open), and on 2 cores it was slower than zlib.
"""

from __future__ import annotations

import io
import os

import indexed_bzip2
import pyarrow as pa

_ARROW_CODECS = {".bz2": "bz2", ".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}


def codec_of(uri: str) -> str | None:
  """Arrow's name of `uri`'s compression (by its extension), or None for plain text."""
  return _ARROW_CODECS.get(os.path.splitext(uri)[1].lower())


def usable_cores() -> int:
  """The cores this process may run on (its affinity: a container's or `taskset`'s share)."""
  return len(os.sched_getaffinity(0))


def thread_count(threads: int) -> int:
  """`threads`, or every usable core for 0."""
  if threads < 0:
    raise ValueError(f"decompression threads must be >= 0, got {threads}")
  return threads or usable_cores()


class _Source:
  """`raw` as the Python file object `indexed_bzip2` reads, noting how far it was read.

  The reader reads from its own threads, one call at a time (it holds a lock and the GIL),
  and restores the position on closing; closing `raw` is its owner's business.
  """

  def __init__(self, raw: pa.NativeFile):
    self.raw, self.furthest = raw, 0

  def read(self, size: int = -1) -> bytes:
    data = self.raw.read(size if size >= 0 else None)
    self.furthest = max(self.furthest, self.raw.tell())
    return data

  def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
    return self.raw.seek(offset, whence)

  def tell(self) -> int:
    return self.raw.tell()

  def seekable(self) -> bool:
    return True

  def write(self, data) -> int:
    raise io.UnsupportedOperation("an input is read only")

  def close(self) -> None:
    pass


def _os_error(error: Exception) -> OSError:
  """The library's error as the OSError a read raises (it says `std::exception` for a cut)."""
  text = " ".join(str(error).split())
  if text in ("", "std::exception"):
    text = "the data ends or breaks inside a block"
  return OSError(text)


class Bz2Stream:
  """The text of a bz2 file, decoded in `threads` threads: `read(n)` like a file's.

  `position()` is how far into the compressed file the reader has read (ahead of the text
  returned by the blocks it decodes in advance): the progress bar's measure. `close()` stops
  and joins the reader's threads; reading again then raises OSError.
  """

  def __init__(self, raw: pa.NativeFile, threads: int):
    self._raw, self._threads = raw, threads
    self._source = _Source(raw)
    self._file, self._text, self._ended = None, 0, False

  def read(self, size: int) -> bytes:
    if self._ended:
      return b""
    try:
      if self._file is None:  # opened here: the library reads the file's head on opening
        self._file = indexed_bzip2.open(self._source, parallelization=self._threads)
      data = self._file.read(size)
    except (RuntimeError, ValueError) as e:
      raise _os_error(e) from None
    self._text += len(data)
    if not data and size:
      self._ended = True
      self._check_end()
    return data

  def _check_end(self) -> None:
    """Raises OSError unless the bz2 streams decoded end where the file ends."""
    size = self._raw.size()
    try:
      if self._threads == 1:
        end = self._file.tell_compressed()
      elif self._text == 0 and size > 0:
        # Nothing decoded from a non-empty file: only empty streams, or no bz2 at all (the
        # parallel reader tells the two apart by neither output nor offsets).
        self._file.close()
        with indexed_bzip2.open(_Source(self._raw), parallelization=1) as single:
          if single.read(1 << 20):
            raise OSError("the parallel reader gave no text where there is some")
          end = single.tell_compressed()
      else:  # the offsets of its blocks, in bits, end with the end of the last stream
        end = max(self._file.block_offsets(), default=0)
    except (RuntimeError, ValueError) as e:
      raise _os_error(e) from None
    if -(-end // 8) != size:
      raise OSError(
        f"the bz2 streams end at byte {-(-end // 8):,} of {size:,}; the rest is no bz2 stream"
      )

  def position(self) -> int:
    return self._source.furthest

  def close(self) -> None:
    if self._file is not None:
      self._file.close()


class _ArrowStream:
  """Arrow's one-thread decompressor over `raw`, with the same `position()`."""

  def __init__(self, raw: pa.NativeFile, codec: str):
    self._raw, self._stream = raw, pa.CompressedInputStream(raw, codec)

  def read(self, size: int) -> bytes:
    return self._stream.read(size)

  def position(self) -> int:
    return self._raw.tell()

  def close(self) -> None:
    self._stream.close()


def open_stream(raw: pa.NativeFile, codec: str, threads: int = 0):
  """The decompressed text of `raw` (compressed with Arrow's `codec`), with `read(n)`,
  `position()` (compressed bytes read so far) and `close()`.

  bz2 from a seekable file is decoded in `thread_count(threads)` threads; the rest by Arrow.
  Reads raise OSError (or pyarrow's error) for corrupt or truncated data.
  """
  if codec == "bz2" and raw.seekable():
    return Bz2Stream(raw, thread_count(threads))
  return _ArrowStream(raw, codec)
