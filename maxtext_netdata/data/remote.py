"""Local, `s3://` and `gs://` files through `pyarrow.fs`: glob expansion and opening.

Every raw file is listed and opened here, whatever its location, so the same code path (and
the same errors) serve a laptop and a bucket. Retrying is the storage SDK's own: S3 requests
follow the AWS SDK's standard retry strategy (5xx, throttling and dropped connections, with
jittered exponential backoff) for `network_remote_retries` attempts, and GCS requests the
Google client's policy within a time window derived from the same keys. A failure that
outlasts them, or that no retry can fix (no such bucket or object, access denied, no file
matching a pattern), becomes a `DataError` naming the URI. Each read of an open file is its
own retried request, so a read resumes part-way without help from here.

A glob is listed under its literal folder prefix only: `s3://bucket/a/b/*.parquet` is one
listing of `a/b/` (one level, delimited), and only a pattern with a folder wildcard lists
the folders below the prefix. Matching is CPython's `glob.translate` as shipped by fsspec.

Configuration (see `StorageOptions.from_config`):
- S3: endpoint from `network_s3_endpoint`, else `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL`;
  region from `network_s3_region`, else `AWS_REGION` / `AWS_DEFAULT_REGION`; credentials
  from the AWS SDK's usual chain (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, profiles...).
- GCS: `STORAGE_EMULATOR_HOST` (e.g. `http://localhost:4443`) selects an emulator, reached
  anonymously; otherwise Google's default credentials.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import os
import re
from collections.abc import Callable, Iterable

import pyarrow as pa
import pyarrow.fs as pafs
from fsspec.utils import glob_translate

from maxtext_netdata.errors import DataError

_REMOTE_SCHEMES = ("s3", "gs")
_GLOB_CHARS = re.compile(r"[*?\[]")


@dataclasses.dataclass(frozen=True)
class StorageOptions:
  """How to reach remote storage and how hard the SDKs retry.

  `retries` is the S3 attempts per request; GCS retries for as long as `retries` attempts
  backing off from `backoff_s` and doubling would take (`gcs_retry_window_s`).
  """

  s3_endpoint: str = ""
  s3_region: str = ""
  gcs_emulator: str = ""
  retries: int = 5
  backoff_s: float = 0.5

  @classmethod
  def from_config(cls, config) -> StorageOptions:
    """Options from the `network_s3_*` / `network_remote_*` keys, then the environment."""
    env = os.environ
    return cls(
      s3_endpoint=config.network_s3_endpoint
      or env.get("AWS_ENDPOINT_URL_S3", "")
      or env.get("AWS_ENDPOINT_URL", ""),
      s3_region=config.network_s3_region
      or env.get("AWS_REGION", "")
      or env.get("AWS_DEFAULT_REGION", ""),
      gcs_emulator=env.get("STORAGE_EMULATOR_HOST", ""),
      retries=max(1, config.network_remote_retries),
      backoff_s=max(0.0, config.network_remote_backoff_s),
    )

  @property
  def gcs_retry_window_s(self) -> float:
    return self.backoff_s * (2**self.retries - 1)


@dataclasses.dataclass(frozen=True)
class FileEntry:
  """One listed file: its URI (absolute path for local files), size and modification time."""

  uri: str
  size: int
  mtime_ns: int


def scheme_of(uri: str) -> str:
  """`s3`, `gs`, or `` for a local path."""
  match = re.match(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://", uri)
  return match.group(1).lower() if match else ""


def is_remote(uri: str) -> bool:
  return scheme_of(uri) in _REMOTE_SCHEMES


_FILESYSTEMS: dict[tuple[str, StorageOptions], pafs.FileSystem] = {}


def filesystem(uri: str, options: StorageOptions) -> tuple[pafs.FileSystem, str]:
  """The filesystem serving `uri` and the path of `uri` inside it."""
  scheme = scheme_of(uri)
  if scheme == "":
    return pafs.LocalFileSystem(), os.path.abspath(uri)
  if scheme == "file":
    return pafs.LocalFileSystem(), uri[len("file://") :]
  if scheme not in _REMOTE_SCHEMES:
    raise DataError(f"{uri}: unsupported storage scheme {scheme!r} (use a path, s3:// or gs://)")
  key = (scheme, options)
  if key not in _FILESYSTEMS:
    _FILESYSTEMS[key] = _make_filesystem(scheme, options)
  return _FILESYSTEMS[key], uri[len(scheme) + 3 :]


def _split_endpoint(url: str) -> tuple[str | None, str]:
  """`http://host:port` → ("http", "host:port"); a bare `host:port` keeps the default scheme."""
  match = re.match(r"^(https?)://(.*?)/?$", url)
  if match:
    return match.group(1), match.group(2)
  return None, url


def _make_filesystem(scheme: str, options: StorageOptions) -> pafs.FileSystem:
  try:
    if scheme == "s3":
      kwargs = {
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=options.retries),
        "connect_timeout": 10.0,
        "request_timeout": 60.0,
      }
      if options.s3_endpoint:
        endpoint_scheme, endpoint = _split_endpoint(options.s3_endpoint)
        kwargs["endpoint_override"] = endpoint
        if endpoint_scheme:
          kwargs["scheme"] = endpoint_scheme
      if options.s3_region:
        kwargs["region"] = options.s3_region
      return pafs.S3FileSystem(**kwargs)
    # The Google client retries transient errors itself, for 15 minutes by default.
    gcs_kwargs = {"retry_time_limit": datetime.timedelta(seconds=options.gcs_retry_window_s)}
    if options.gcs_emulator:
      endpoint_scheme, endpoint = _split_endpoint(options.gcs_emulator)
      gcs_kwargs.update(
        anonymous=True, endpoint_override=endpoint, scheme=endpoint_scheme or "http"
      )
    return pafs.GcsFileSystem(**gcs_kwargs)
  except (OSError, pa.ArrowException) as e:
    raise DataError(f"{scheme}://: cannot set up storage access ({e})") from None


def storage_call[T](call: Callable[[], T], *, uri: str, what: str) -> T:
  """`call()` once (the SDK beneath retries what is transient); an OSError becomes a
  DataError naming `uri`."""
  try:
    return call()
  except OSError as e:
    raise DataError(f"{uri}: cannot {what}: {_short(e)}") from None


def _short(error: BaseException) -> str:
  if isinstance(error, FileNotFoundError):
    return "no such file, bucket or object"
  if isinstance(error, PermissionError):
    return "access denied"
  return " ".join(str(error).split())


def _entry(uri_prefix: str, info: pafs.FileInfo) -> FileEntry:
  mtime_ns = info.mtime_ns if info.mtime_ns is not None else 0
  return FileEntry(uri=uri_prefix + info.path, size=int(info.size or 0), mtime_ns=int(mtime_ns))


# The files of a folder named as an input, below it at any depth (`expand`'s `folder_files`):
PARQUET_FILES = r".*\.parquet"  # prepare's raw parquet
VISIBLE_FILES = r"(?:.*/)?[^./][^/]*"  # every file whose name does not start with "." (ingest's)


def expand(
  pattern: str, options: StorageOptions, folder_files: str = PARQUET_FILES, empty_ok=False
) -> list[FileEntry]:
  """Files matching one path, directory (its files at any depth whose path matches regular
  expression `folder_files`: `*.parquet` by default) or glob, sorted. A folder a glob
  matches gives its files as a folder does.

  `*`, `?` and `[...]` stay within a folder; `**` as a whole folder name crosses folders.
  Raises DataError naming `pattern` when nothing matches, unless `empty_ok`.
  """
  fs, path = filesystem(pattern, options)
  scheme = scheme_of(pattern)
  uri_prefix = f"{scheme}://" if scheme in _REMOTE_SCHEMES else ""
  glob = _GLOB_CHARS.search(path)
  if glob is None:
    info = storage_call(lambda: fs.get_file_info(path), uri=pattern, what="look up")
    if info.type == pafs.FileType.File:
      return [_entry(uri_prefix, info)]
    if info.type != pafs.FileType.Directory:
      raise DataError(f"{pattern}: no such file, bucket or object")
    selector = pafs.FileSelector(path.rstrip("/"), recursive=True)
    regex = re.compile(folder_files + r"\Z", re.DOTALL)
  else:
    base = path[: glob.start()].rpartition("/")[0]
    if not base and uri_prefix:
      raise DataError(f"{pattern}: a bucket name cannot be a pattern")
    try:
      regex = re.compile(glob_translate(path))
    except ValueError as e:
      raise DataError(f"{pattern}: {e}") from None
    # A wildcard in the last component only: one delimited listing of the prefix folder.
    below = path[len(base) + 1 :]
    selector = pafs.FileSelector(base or "/", recursive="/" in below)

  def listing() -> list[pafs.FileInfo]:
    try:
      return fs.get_file_info(selector)
    except FileNotFoundError:
      return []  # the folder is missing (a missing bucket is an error of its own)

  infos = storage_call(listing, uri=pattern, what="list files")
  if not uri_prefix:
    _check_links(selector, regex)
  found = {
    info.path: _entry(uri_prefix, info)
    for info in infos
    if info.type == pafs.FileType.File and regex.match(info.path)
  }
  if glob is not None:  # a folder the pattern matches (Spark writes `day.parquet/part-*`)
    folders = {
      info.path for info in infos if info.type == pafs.FileType.Directory and regex.match(info.path)
    }
    if folders and selector.recursive:  # their files are in the listing already
      inside = re.compile(folder_files + r"\Z", re.DOTALL)
      for info in infos:
        if info.type != pafs.FileType.File or not inside.match(info.path):
          continue
        parents = itertools.accumulate(info.path.split("/")[:-1], lambda a, b: f"{a}/{b}")
        if not folders.isdisjoint(parents):
          found[info.path] = _entry(uri_prefix, info)
    else:
      for folder in sorted(folders):
        for entry in expand(uri_prefix + folder, options, folder_files, empty_ok=True):
          found[entry.uri.removeprefix(uri_prefix)] = entry
  if not found and not empty_ok:
    raise DataError(f"{pattern}: no file matches this pattern")
  return sorted(found.values(), key=lambda e: e.uri)


def _check_links(selector: pafs.FileSelector, regex: re.Pattern) -> None:
  """Raises DataError naming the first local symbolic link of the listing that `regex`
  matches and whose target is missing (an unfetched git-annex or DVC file): pyarrow's listing
  leaves such a link out, so its file would be dropped without a word. Entries are told by
  their directory entry's type: a look-up (`stat`) is paid for links alone."""
  dangling, folders = [], [selector.base_dir]
  while folders:
    try:
      entries = os.scandir(folders.pop())
    except (FileNotFoundError, NotADirectoryError):  # as the listing: a missing folder is empty
      continue
    with entries:
      for entry in entries:
        if entry.is_symlink():
          if regex.match(entry.path) and not os.path.exists(entry.path):
            dangling.append(entry.path)
        elif selector.recursive and entry.is_dir():
          folders.append(entry.path)
  if dangling:
    path = min(dangling)
    raise DataError(f"{path}: a link to {os.readlink(path)}, which does not exist")


def expand_all(
  patterns: str | Iterable[str], options: StorageOptions, folder_files: str = PARQUET_FILES
) -> list[FileEntry]:
  """Files of comma-separated (or listed) patterns (`expand`'s): sorted, each once."""
  if isinstance(patterns, str):
    patterns = patterns.split(",")
  found: dict[str, FileEntry] = {}
  for pattern in (p.strip() for p in patterns):
    if pattern:
      for entry in expand(pattern, options, folder_files):
        found[entry.uri] = entry
  return [found[uri] for uri in sorted(found)]


def open_input_file(entry: FileEntry, options: StorageOptions) -> pa.NativeFile:
  """A random-access handle on a listed file (each read a request the SDK retries)."""
  fs, path = filesystem(entry.uri, options)
  return storage_call(lambda: fs.open_input_file(path), uri=entry.uri, what="open")
