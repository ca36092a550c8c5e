"""A store shared through `gs://` or `s3://`: built once, copied to each host's disk once.

The store is memory-mapped, so a training host reads it from a local folder. With
`network_prepared_dir` a `gs://` or `s3://` folder, `prepare` looks for
`<network_prepared_dir>/<fingerprint>/meta.json` there: if present, the whole store is copied
(`pyarrow.fs.copy_files`, threaded) into a temporary folder of the local cache
(`network_store_cache_dir`) and renamed into place under the same one-builder lock as a local
build; if absent, the store is built locally and uploaded, the top-level `meta.json` last, so
a store is visible remotely only once all of it is there. Two hosts that upload the same
store at once write the same bytes (a store depends only on its inputs), so the last upload
wins harmlessly; the multi-process pipeline avoids even that by letting process 0 build
first (`input_pipeline.shared_store`).
"""

from __future__ import annotations

import os

import pyarrow.fs as pafs

from maxtext_netdata.data import remote
from maxtext_netdata.data.store import store

DEFAULT_CACHE = os.path.join("~", ".cache", "maxtext_netdata", "stores")


def cache_dir(config) -> str:
  """The local folder holding copies of remote stores."""
  return os.path.expanduser(config.network_store_cache_dir or DEFAULT_CACHE)


def join(uri: str, name: str) -> str:
  return f"{uri.rstrip('/')}/{name}"


def download(uri: str, local: str, options: remote.StorageOptions) -> bool:
  """Copy the complete store at `uri` into the new folder `local`; False if there is none."""
  fs, path = remote.filesystem(uri, options)
  meta = remote.storage_call(
    lambda: fs.get_file_info(join(path, store.META_FILE)), uri=uri, what="look up the store"
  )
  if meta.type != pafs.FileType.File:
    return False
  os.makedirs(local, exist_ok=True)
  remote.storage_call(
    lambda: pafs.copy_files(
      path, local, source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem()
    ),
    uri=uri,
    what="copy the store",
  )
  return True


def upload(local: str, uri: str, options: remote.StorageOptions) -> None:
  """Copy the store folder `local` to `uri`, its top-level `meta.json` last."""
  fs, path = remote.filesystem(uri, options)
  local_fs = pafs.LocalFileSystem()
  names = sorted(os.listdir(local))
  for name in [n for n in names if n != store.META_FILE] + [store.META_FILE]:
    source = os.path.join(local, name)
    remote.storage_call(
      lambda source=source, name=name: pafs.copy_files(
        source, join(path, name), source_filesystem=local_fs, destination_filesystem=fs
      ),
      uri=join(uri, name),
      what="upload the store",
    )
