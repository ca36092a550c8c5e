"""A store of format 3 (seconds as int64) converted to format 4 instead of built again: the
store a full build gives, byte for byte, without reading a raw file (docs/prepare.md,
"Seconds in four bytes")."""

import json
import os
import shutil

import numpy as np
import pytest

from maxtext_netdata.data.prepare import naming, prepare, summary_text, upgrade
from maxtext_netdata.data.store import store
from tests.data.prepare.test_append import assert_same_store
from tests.data.prepare.test_prepare import make_config
from tests.helpers.pipeline import store_files


def as_format_3(splits, prepared_dir, config, seconds=None) -> str:
  """The store of `splits` as format-3 code wrote it, in `prepared_dir`: the same files but
  `seconds.npy`, int64 there (`seconds(split, array)` may change a split's), and a summary and
  split metadata of format 3, under the fingerprint format 3 gave it. Its folder."""
  summary = splits.summary
  content = {**naming.description(config, []), "format_version": upgrade.FORMER}  # no eval files
  fp = naming.fingerprint_of(content, summary["train_file_entries"], summary["time_bounds"])
  root = os.path.join(prepared_dir, fp)
  shutil.copytree(summary["path"], root, ignore=shutil.ignore_patterns("plans"))
  for name in ("train", "test", "eval"):
    split = os.path.join(root, name)
    if not os.path.isdir(split):
      continue
    array = np.load(os.path.join(split, "seconds.npy")).astype(np.int64)
    if seconds is not None:
      array = seconds(name, array)
    np.save(os.path.join(split, "seconds.npy"), array)
    meta = json.load(open(os.path.join(split, store.META_FILE)))
    meta.update(format_version=upgrade.FORMER, fingerprint=fp)
    store.write_json(os.path.join(split, store.META_FILE), meta)
  top = {k: v for k, v in summary.items() if k not in ("path", "cached")}
  top.update(format_version=upgrade.FORMER, fingerprint=fp, content_key=naming.digest(content))
  store.write_json(os.path.join(root, store.META_FILE), top)
  return root


def scrambled(files) -> None:
  """Each file's bytes replaced by others of the same size and time: a store that reads one
  of them fails, one that only lists them (size, time) does not."""
  for path in files:
    stat = os.stat(path)
    with open(path, "wb") as f:
      f.write(b"\0" * stat.st_size)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.fixture
def copies(days, tmp_path):
  """The days copied, so that they can be scrambled."""
  folder = tmp_path / "raw"
  folder.mkdir()
  out = []
  for path in days:
    out.append(str(folder / os.path.basename(path)))
    shutil.copy2(path, out[-1])
  return out


def test_a_format_3_store_of_the_same_files_is_converted_not_built(copies, tmp_path, capsys):
  full = prepare.prepare(make_config(tmp_path / "full", copies), progress=False)
  cfg = make_config(tmp_path / "prep", copies)
  old = as_format_3(full, tmp_path / "prep", cfg)
  scrambled(copies)  # a build would read them and fail
  converted = prepare.prepare(cfg, progress=True)
  assert not converted.cached
  assert converted.summary["converted_from"]["path"] == old
  assert_same_store(converted, full)
  assert converted.train.seconds.dtype == np.uint32
  # The old store stays as it was (an older checkout reads it), sharing every file but one.
  assert json.load(open(os.path.join(old, store.META_FILE)))["format_version"] == 3
  assert np.load(os.path.join(old, "train", "seconds.npy")).dtype == np.int64
  new_train = os.path.join(converted.summary["path"], "train")
  for name in ("rtt_bytes.npy", "dst_index.npy", "probe_offsets.npy"):
    assert os.path.samefile(os.path.join(old, "train", name), os.path.join(new_train, name))
  lines = summary_text.format_summary(converted.summary)
  assert f"converted from {old} (store format 3)" in lines
  assert "converting store format 3" in capsys.readouterr().err
  again = prepare.prepare(cfg, progress=False)
  assert again.cached and again.summary["path"] == converted.summary["path"]


def test_a_format_3_base_is_converted_then_appended_to(days, tmp_path):
  cfg = make_config(tmp_path / "prep", days[:3])
  base = prepare.prepare(make_config(tmp_path / "base", days[:2]), progress=False)
  old = as_format_3(base, tmp_path / "prep", cfg)
  fp = base.summary["fingerprint"]  # the base's name in format 4
  stale = tmp_path / "prep" / f".tmp-{fp}-killed"  # a conversion killed midway
  stale.mkdir()
  appended = prepare.prepare(cfg, progress=False)
  made_from = appended.summary["appended"]["base"]
  assert made_from == str(tmp_path / "prep" / fp)  # the converted base, beside the old
  assert not stale.exists() and not os.path.exists(tmp_path / "prep" / f".lock-{fp}")
  assert json.load(open(os.path.join(made_from, store.META_FILE)))["converted_from"]["path"] == old
  full = prepare.prepare(make_config(tmp_path / "full", days[:3]), progress=False)
  assert_same_store(appended, full)


def test_a_format_3_store_with_a_time_format_4_does_not_keep_is_built_anew(
  copies, tmp_path, capsys
):
  full = prepare.prepare(make_config(tmp_path / "full", copies), progress=False)
  cfg = make_config(tmp_path / "prep", copies)

  def before_1970(name, array):
    array[:3] = -1 if name == "train" else array[:3]
    return array

  old = as_format_3(full, tmp_path / "prep", cfg, seconds=before_1970)
  kept = {name: os.stat(os.path.join(old, name)).st_mtime_ns for name in store_files(old)}
  built = prepare.prepare(cfg, progress=True)  # the raw files, read again: their rows
  # Nothing written into the old store's files (through a link the conversion left).
  assert {name: os.stat(os.path.join(old, name)).st_mtime_ns for name in store_files(old)} == kept
  assert "converted_from" not in built.summary
  assert_same_store(built, full)
  err = capsys.readouterr().err
  assert f"prepare: {old} (store format 3) holds a time before 1970" in err
  left = sorted(os.listdir(tmp_path / "prep"))  # no half-converted store left behind
  assert left == sorted(os.path.basename(p) for p in (old, built.summary["path"]))
