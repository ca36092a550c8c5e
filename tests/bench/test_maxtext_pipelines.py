"""`maxtext-netdata bench --maxtext` on MaxText's other text pipelines, offline: `hf` reading
local parquet with a Hugging Face tokenizer, and `grain` reading ArrayRecord (tf.train.Example
records parsed without TensorFlow). Each both ways: as it is, against a 0.5 s step, loading is
not the bottleneck (verdict, loading figures, worker sweep, profile); with a map sleeping
0.25 s a batch, against a 50 ms step, it is, and the verdict names the pipeline's next knob.
`tfds` needs TensorFlow, which is not installed: bench says so in one line.

Nothing is downloaded: the corpus and both tokenizers are made here (`bench.text_corpus`), and
the Hugging Face libraries run with an empty cache and HF_HUB_OFFLINE / HF_DATASETS_OFFLINE.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.helpers.maxtext import bench, ok

pytest.importorskip("maxtext", reason="MaxText is not installed (pip install '.[maxtext]')")
pytest.importorskip("datasets", reason="MaxText's hf pipeline needs datasets ('.[maxtext]')")

from maxtext_netdata.bench import maxtext_bench, text_corpus  # noqa: E402
from maxtext_netdata.bench import report as bench_report  # noqa: E402
from maxtext_netdata.bench.arguments import WARMUP_STEPS  # noqa: E402

# Each test starts MaxText and its training: the full suite runs them, `--fast` does not.
pytestmark = pytest.mark.slow

TEXT = str(Path(__file__).resolve().parents[2] / "configs" / "maxtext" / "bench_text.yml")
# A step loading must beat by far (a mid-size model on an accelerator), and one it cannot.
LONG_STEP = "--target-step-time=0.5"
SHORT_STEP = "--target-step-time=0.05"
# The normal run: in process (the sweep starts the worker), 3 real-data steps profiled.
NORMAL = ["grain_worker_count=0", LONG_STEP, "--steps=3", "--batches=6", "--sweep-workers=0,1"]
NORMAL += ["--profile"]


@pytest.fixture(scope="module")
def offline(tmp_path_factory) -> dict:
  """No download can happen: an empty Hugging Face cache, both libraries offline."""
  home = tmp_path_factory.mktemp("hf_home")
  return {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory) -> str:
  """The tiny model's compiled step, shared by the runs here."""
  return f"jax_cache_dir={tmp_path_factory.mktemp('jax_cache')}"


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> Path:
  return tmp_path_factory.mktemp("corpus")


@pytest.fixture(scope="module")
def hf(corpus_dir) -> list[str]:
  files, tokenizer = text_corpus.make_hf(corpus_dir, rows_per_file=500)
  return [
    "dataset_type=hf",
    "hf_path=parquet",
    f"hf_train_files={files}",
    "tokenizer_type=huggingface",
    f"tokenizer_path={tokenizer}",
  ]


@pytest.fixture(scope="module")
def arrayrecord(corpus_dir) -> list[str]:
  files, tokenizer = text_corpus.make_arrayrecord(corpus_dir, rows_per_file=500)
  return [
    "grain_file_type=arrayrecord",
    f"grain_train_files={files}",
    f"tokenizer_path={tokenizer}",
  ]


def _not_the_bottleneck(report: dict, dataset_type: str, tokenizer_type: str) -> None:
  """A normal run's report: every figure there, and the loader far under the 0.5 s step."""
  assert report["maxtext"] == {"dataset_type": dataset_type, "tokenizer_type": tokenizer_type}
  loading = report["loading"]
  assert loading["workers"] == 0 and loading["batches"] == 6
  assert loading["real_tokens_per_s"] > 0 and 0 < loading["padding_share"] < 0.5
  assert loading["first_batch_s"] > 0 and loading["batch_s"] < 0.25
  assert [s["workers"] for s in report["sweep"]] == [0, 1]
  assert all(s["real_tokens_per_s"] > 0 for s in report["sweep"])
  assert report["recommended_workers"]["workers"] in (0, 1)
  assert report["real"]["step_time"]["n"] == 3
  assert len(report["real"]["data_wait_s"]) == 3 + WARMUP_STEPS
  # Loading alone beats the step; the profile may still find the in-process loader between
  # steps on a busy 2-core host (starved in training): either way the loader is not the
  # bottleneck the verdict names.
  assert report["verdict"]["text"].startswith("Data loading is not the bottleneck: ")
  assert report["verdict"]["kind"] != bench_report.BOTTLENECK
  assert report["profile"]["module"].endswith("train_step")
  assert "Profile (" in report["verdict"]["text"]


def _the_bottleneck(report: dict) -> tuple[str, int]:
  """A sleeping run's report: the loader named; (the verdict, the host's cores)."""
  assert report["loading"]["batch_s"] > 0.2  # the map's sleep
  assert report["verdict"]["kind"] == bench_report.BOTTLENECK
  assert "Data loading IS the bottleneck" in report["verdict"]["text"]
  return report["verdict"]["text"], report["host"]["cpu_cores"]


def test_hf_local_parquet_with_a_hugging_face_tokenizer(tmp_path, hf, offline, jax_cache):
  args = [*hf, jax_cache, *NORMAL]
  report = ok(*bench(tmp_path, TEXT, *args, env=offline))
  _not_the_bottleneck(report, "hf", "huggingface")
  assert not any(Path(offline["HF_HOME"]).rglob("*.parquet"))  # read in place, no copy


def test_hf_with_a_sleeping_map_is_the_bottleneck(tmp_path, hf, offline):
  hook = "--loop-hook=tests.helpers.maxtext_hooks:slow_hf_loader"
  args = [*hf, "grain_worker_count=0", hook, "--steps=0", SHORT_STEP, "--batches=3"]
  text, cores = _the_bottleneck(ok(*bench(tmp_path, TEXT, *args, env=offline)))
  if cores > 1:
    assert "set grain_worker_count=1 (the most MaxText's hf pipeline runs)" in text
  else:
    assert "tokenize offline" in text


def test_grain_arrayrecord_examples(tmp_path, arrayrecord, jax_cache):
  args = [*arrayrecord, jax_cache, *NORMAL]
  report = ok(*bench(tmp_path, TEXT, *args))
  _not_the_bottleneck(report, "grain", "sentencepiece")


def test_grain_arrayrecord_with_a_sleeping_map_is_the_bottleneck(tmp_path, arrayrecord):
  hook = "--loop-hook=tests.helpers.maxtext_hooks:slow_loader"
  args = [*arrayrecord, "grain_worker_count=0", hook, "--steps=0", SHORT_STEP, "--batches=3"]
  text, cores = _the_bottleneck(ok(*bench(tmp_path, TEXT, *args)))
  if cores > 1:
    assert "raise grain_worker_count (now 0" in text
  else:
    assert "tokenize offline" in text


@pytest.mark.parametrize("kind", ["hf", "grain"])
def test_a_starved_verdict_names_only_buffers_the_pipeline_reads(kind):
  loading = {"batch_s": 0.005, "batch_time_s": {"p90": 0.006}, "workers": 1}
  records = [{"step": i, "step_time_s": 0.03, "data_wait_s": 0.015} for i in range(6)]
  real = bench_report.training_summary(records, WARMUP_STEPS)
  verdict = bench_report.decide(0.014, "synthetic", loading, real, 0.014, "unused")
  assert verdict["kind"] == bench_report.STARVED
  advice = maxtext_bench.advice_for_pipeline(verdict, kind)["text"]
  assert advice.startswith("Loading is fast alone but starved in training")
  if kind == "hf":
    assert "grain_per_worker_buffer_size" not in advice and "hf pipeline fixes its" in advice
  else:
    assert advice == verdict["text"] and "grain_per_worker_buffer_size" in advice


@pytest.mark.skipif(
  importlib.util.find_spec("tensorflow") is not None, reason="TensorFlow is installed here"
)
def test_tfds_without_tensorflow_is_one_line_saying_what_bench_cannot_check(tmp_path):
  result, report = bench(tmp_path, TEXT, "dataset_type=tfds", "--steps=0", SHORT_STEP)
  assert result.returncode == 2 and report is None
  err = [line for line in result.stderr.splitlines() if line.startswith("maxtext-netdata")]
  assert len(err) == 1, result.stderr[-2000:]
  assert "MaxText's tfds pipeline runs on TensorFlow" in err[0]
  assert "bench cannot check it" in err[0] and "(tensorflow, " in err[0]


@pytest.mark.parametrize(
  "args, message",
  [
    (["--sweep-workers=0,2"], "--sweep-workers=2: MaxText's hf pipeline runs 1 Grain worker"),
    (
      ["hf_train_files=/nowhere/*.parquet"],
      "its hf pipeline (hf_path=parquet hf_train_files=/nowhere/*.parquet)",
    ),
  ],
)
def test_hf_configs_bench_cannot_run_are_one_line_errors(tmp_path, hf, offline, args, message):
  result, report = bench(tmp_path, TEXT, *hf, *args, "--steps=0", SHORT_STEP, env=offline)
  assert result.returncode == 2 and report is None
  err = [line for line in result.stderr.splitlines() if line.startswith("maxtext-netdata")]
  assert len(err) == 1 and message in err[0], result.stderr[-2000:]
