"""Local, `s3://` and `gs://` files through `pyarrow.fs`: glob expansion, opening, retries.

Every raw file is listed and opened here, whatever its location, so the same code path (and
the same errors) serve a laptop and a bucket. Remote calls that fail transiently (a 503,
a dropped connection, throttling) are retried with exponential backoff; permanent failures
(no such bucket or object, access denied, no file matching a pattern) become a `DataError`
naming the URI at once.

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
import os
import re
import time
from collections.abc import Callable, Iterable

import pyarrow as pa
import pyarrow.fs as pafs

from maxtext_netdata.errors import DataError

_REMOTE_SCHEMES = ("s3", "gs")
_GLOB_CHARS = re.compile(r"[*?\[]")
# Failures no retry can fix. pyarrow reports AWS and GCS errors as OSError with the
# service's error name in the text; FileNotFoundError / PermissionError are its own mapping.
_PERMANENT_MARKERS = (
  "NO_SUCH_BUCKET",
  "NO_SUCH_KEY",
  "ACCESS_DENIED",
  "AccessDenied",
  "INVALID_ACCESS_KEY_ID",
  "SIGNATURE_DOES_NOT_MATCH",
  "NoSuchBucket",
  "NoSuchKey",
  "does not exist",
  "Forbidden",
  "PERMISSION_DENIED",
  "NOT_FOUND",
  "UNAUTHENTICATED",
)


@dataclasses.dataclass(frozen=True)
class StorageOptions:
  """How to reach remote storage and how hard to retry."""

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
        # One attempt per call: retries are ours (StorageOptions), so they are counted and
        # backed off the same way for every backend.
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=1),
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
    # The GCS client retries for up to 15 minutes by default; a short window leaves the
    # policy to StorageOptions, as for S3.
    gcs_kwargs = {"retry_time_limit": datetime.timedelta(seconds=1)}
    if options.gcs_emulator:
      endpoint_scheme, endpoint = _split_endpoint(options.gcs_emulator)
      gcs_kwargs.update(
        anonymous=True, endpoint_override=endpoint, scheme=endpoint_scheme or "http"
      )
    return pafs.GcsFileSystem(**gcs_kwargs)
  except (OSError, pa.ArrowException) as e:
    raise DataError(f"{scheme}://: cannot set up storage access ({e})") from None


def is_permanent(error: BaseException) -> bool:
  """Whether retrying `error` is pointless."""
  if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError)):
    return True
  if not isinstance(error, OSError):
    return True
  text = str(error)
  return any(marker in text for marker in _PERMANENT_MARKERS)


def with_retries[T](
  call: Callable[[], T],
  *,
  uri: str,
  what: str,
  options: StorageOptions,
) -> T:
  """`call()`, retried on transient OSErrors; a failure becomes a DataError naming `uri`.

  Local files are tried once: their OSErrors do not heal by waiting.
  """
  attempts = options.retries if is_remote(uri) else 1
  for attempt in range(attempts):
    try:
      return call()
    except OSError as e:
      if is_permanent(e) or attempt == attempts - 1:
        tries = f" after {attempt + 1} attempts" if attempt else ""
        raise DataError(f"{uri}: cannot {what}{tries}: {_short(e)}") from None
      time.sleep(options.backoff_s * 2**attempt)
  raise AssertionError("unreachable")


def _short(error: BaseException) -> str:
  if isinstance(error, FileNotFoundError):
    return "no such file, bucket or object"
  if isinstance(error, PermissionError):
    return "access denied"
  return " ".join(str(error).split())


def _glob_regex(pattern: str) -> re.Pattern:
  """Glob → regex: `*` and `?` stay within one path component, `**` crosses them."""
  out, i = [], 0
  while i < len(pattern):
    c = pattern[i]
    if pattern.startswith("**", i):
      out.append(".*")
      i += 2
    elif c == "*":
      out.append("[^/]*")
      i += 1
    elif c == "?":
      out.append("[^/]")
      i += 1
    elif c == "[" and "]" in pattern[i + 2 :]:
      end = pattern.index("]", i + 2)
      body = pattern[i + 1 : end]
      out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
      i = end + 1
    else:
      out.append(re.escape(c))
      i += 1
  return re.compile("".join(out) + r"\Z")


def _entry(uri_prefix: str, info: pafs.FileInfo) -> FileEntry:
  mtime_ns = info.mtime_ns if info.mtime_ns is not None else 0
  return FileEntry(uri=uri_prefix + info.path, size=int(info.size or 0), mtime_ns=int(mtime_ns))


def expand(pattern: str, options: StorageOptions) -> list[FileEntry]:
  """Files matching one path, directory (its `*.parquet` files, recursively) or glob, sorted.

  Raises DataError naming `pattern` when nothing matches.
  """
  fs, path = filesystem(pattern, options)
  scheme = scheme_of(pattern)
  uri_prefix = f"{scheme}://" if scheme in _REMOTE_SCHEMES else ""
  glob = _GLOB_CHARS.search(path)
  if glob is None:
    info = with_retries(
      lambda: fs.get_file_info(path), uri=pattern, what="look up", options=options
    )
    if info.type == pafs.FileType.File:
      return [_entry(uri_prefix, info)]
    if info.type == pafs.FileType.Directory:
      base, regex = path.rstrip("/"), re.compile(r".*\.parquet\Z")
    else:
      raise DataError(f"{pattern}: no such file, bucket or object")
  else:
    base = path[: glob.start()].rsplit("/", 1)[0]
    if not base and uri_prefix:
      raise DataError(f"{pattern}: a bucket name cannot be a pattern")
    base = base or "/"
    regex = _glob_regex(path)

  def list_base():
    try:
      return fs.get_file_info(pafs.FileSelector(base, recursive=True))
    except FileNotFoundError:
      return []  # the folder is missing (a missing bucket is an error of its own)

  infos = with_retries(list_base, uri=pattern, what="list files", options=options)
  entries = [
    _entry(uri_prefix, info)
    for info in infos
    if info.type == pafs.FileType.File and regex.match(info.path)
  ]
  if not entries:
    raise DataError(f"{pattern}: no file matches this pattern")
  return sorted(entries, key=lambda e: e.uri)


def expand_all(patterns: str | Iterable[str], options: StorageOptions) -> list[FileEntry]:
  """Files of comma-separated (or listed) patterns: sorted, each once."""
  if isinstance(patterns, str):
    patterns = patterns.split(",")
  found: dict[str, FileEntry] = {}
  for pattern in (p.strip() for p in patterns):
    if pattern:
      for entry in expand(pattern, options):
        found[entry.uri] = entry
  return [found[uri] for uri in sorted(found)]


def open_input_file(entry: FileEntry, options: StorageOptions) -> pa.NativeFile:
  """A random-access handle on a listed file, with retries."""
  fs, path = filesystem(entry.uri, options)
  return with_retries(lambda: fs.open_input_file(path), uri=entry.uri, what="open", options=options)
