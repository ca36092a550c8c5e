"""The inputs of `ingest` as blocks of newline-delimited results (`reference.Block`).

Plain JSON lines are read in Arrow buffers straight from the file (a local file is mapped:
no copy at all), each block ending at its last newline (`_plain_line_blocks`); compressed
inputs are decompressed by `decompress.open_stream` (bz2 on every usable core, or
`decompress_threads`; gzip and zstd by Arrow) and read in a thread one block ahead of the
parsing (the decompressors run without the GIL), so decompression and parsing overlap, three
blocks held at most; a JSON array becomes lines through `json_array.ArrayToLines`.
"""

from __future__ import annotations

import queue
import threading

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from maxtext_netdata.data import remote
from maxtext_netdata.data.ripe import decompress, json_array, reference
from maxtext_netdata.errors import DataError


def _read_ahead(stream, block_bytes: int):
  """`stream`'s pieces, read (and decompressed) in a thread one piece ahead of the caller.

  Decompression then runs beside the parsing of the previous piece: at most two pieces are
  held besides the caller's. An error reading is raised in the caller, in order; closing
  the generator stops the thread before it returns.
  """
  pieces = queue.Queue(maxsize=1)
  stop = threading.Event()

  def read() -> None:
    while not stop.is_set():
      try:
        piece = stream.read(block_bytes)
      except BaseException as e:  # handed to the caller, which raises it
        piece = e
      while not stop.is_set():
        try:
          pieces.put(piece, timeout=0.1)
          break
        except queue.Full:
          pass
      if isinstance(piece, BaseException) or not piece:
        return

  thread = threading.Thread(target=read, name="ingest-read-ahead", daemon=True)
  thread.start()
  try:
    while True:
      piece = pieces.get()
      if isinstance(piece, BaseException):
        raise piece
      yield piece
      if not piece:
        return
  finally:
    stop.set()
    thread.join()


def _read_inline(stream, block_bytes: int):
  while True:
    piece = stream.read(block_bytes)
    yield piece
    if not piece:
      return


def _last_newline(view: np.ndarray) -> int:
  """Index of the last newline of `view`, or -1; looks at the end first."""
  end = len(view)
  while end > 0:
    start = max(0, end - (1 << 16))
    found = np.flatnonzero(view[start:end] == 10)
    if len(found):
      return start + int(found[-1])
    end = start
  return -1


def _plain_line_blocks(uri: str, raw, block_bytes: int, progress, remap=None):
  """Blocks of a plain JSON-lines input: Arrow buffers read straight from the file.

  Each block ends after its last newline and the next read starts there (a seek back), so
  no partial line is carried and copied into the next block: one copy from the file (none
  from a memory map), none after (2x the speed of reading and joining at 16 MB blocks).
  With `remap` (a memory-mapped `raw`), each block is read from a fresh map, unmapped once
  the block is dropped: one map over the whole run kept every page read in the process's
  resident memory, the file's size at the end.
  """
  line, position, size = 1, 0, block_bytes
  try:
    while True:
      try:
        if remap is not None and position:
          raw.close()  # the map stays until the last block read from it is dropped
          raw = remap()
          raw.seek(position)
        piece = raw.read_buffer(size)
      except (OSError, pa.ArrowException) as e:
        raise DataError(f"{uri}: read error {_after(line)} ({e})") from None
      if len(piece) == 0:
        return
      data = piece
      if len(piece) == size:
        cut = _last_newline(np.frombuffer(piece, np.uint8)) + 1
        if cut == 0:  # a line longer than the block: read it whole
          raw.seek(position)
          size *= 2
          continue
        data = piece.slice(0, cut)
        raw.seek(position + cut)
      position, size = position + len(data), block_bytes
      if progress is not None:
        progress.update(len(data))
      head = bytes(memoryview(data)[:256])
      if head.strip() or not bytes(memoryview(data)).isspace():
        block = reference.Block(data, line, reference.count_newlines(data), "line")
        yield block
        line += block.newlines
  finally:
    raw.close()  # the last map (the caller closes the first)


def iter_blocks(
  entry: remote.FileEntry, options, block_bytes: int, progress, decompress_threads: int = 0
):
  """The newline-delimited results of one input as `reference.Block`s, block by block.

  Compressed inputs are decompressed a piece ahead in a thread (`_read_ahead`), a bz2 input
  in `decompress_threads` threads (0: every usable core; `decompress.open_stream`); plain
  JSON lines are read by `_plain_line_blocks`.
  """
  codec = decompress.codec_of(entry.uri)
  fs, path = remote.filesystem(entry.uri, options)
  if not codec and isinstance(fs, pafs.LocalFileSystem):
    # Mapped, a local file's blocks are views of the page cache: no copy at all (a read
    # copied every byte once: ~10% of ingest's time on plain JSON lines).
    def remap():
      return remote.storage_call(lambda: pa.memory_map(path), uri=entry.uri, what="open")

    raw = remap()
  else:
    raw, remap = remote.open_input_file(entry, options), None
  if not codec:
    try:
      head = raw.read(4096)
      raw.seek(0)
    except (OSError, pa.ArrowException) as e:
      raw.close()
      raise DataError(f"{entry.uri}: read error ({e})") from None
    if head.removeprefix(json_array.BOM).lstrip()[:1] not in (b"[", b""):
      blocks = _plain_line_blocks(entry.uri, raw, block_bytes, progress, remap)
      try:
        yield from blocks
      finally:
        blocks.close()
        raw.close()
      return
  stream = decompress.open_stream(raw, codec, decompress_threads) if codec else raw
  pieces = (_read_ahead if codec else _read_inline)(stream, block_bytes)
  array, carry, line, position, unit = None, b"", 1, 0, "line"
  try:
    while True:
      try:
        piece = next(pieces)
      except (OSError, pa.ArrowException) as e:
        what = f"corrupt or truncated {codec} data" if codec else "read error"
        raise DataError(f"{entry.uri}: {what} {_after(line)} ({e})") from None
      last = not piece
      if array is None and (piece.lstrip() or last):
        array = (carry + piece).removeprefix(json_array.BOM).lstrip()[:1] == b"["
        if array:
          converter, unit = json_array.ArrayToLines(entry.uri), "array element"
      if progress is not None:
        done = stream.position() if codec else raw.tell()
        progress.update(max(0, done - position))
        position = max(position, done)
      if array:
        data = converter.feed(piece, last)  # b"", or whole elements: never blank
      elif last:
        data, carry = carry, b""
      else:
        cut = piece.rfind(b"\n") + 1
        if cut == 0:  # a line longer than a block
          data, carry = b"", carry + piece
        else:  # one copy at most: the carry and the piece up to its last newline
          whole = not carry and cut == len(piece)
          data = piece if whole else b"".join((carry, memoryview(piece)[:cut]))
          carry = piece[cut:]
      if len(data) and (array or not data.isspace()):
        block = reference.Block(data, line, reference.count_newlines(data), unit)
        yield block
        line += block.newlines
      if last:
        return
  finally:
    pieces.close()  # joins the read-ahead thread first: then the decompressor is idle
    if codec:
      stream.close()
    raw.close()


def _after(line: int) -> str:
  """Where a read broke off, for its error: after the last line of the blocks read whole,
  `line - 1` (the whole lines of the block that failed, if any, are not known)."""
  return "before its first line" if line <= 1 else f"after line {line - 1}"
