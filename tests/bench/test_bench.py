"""Tests of `maxtext-netdata bench`: the verdict on constructed timings, the accelerator estimate,
the report and plot, and end-to-end runs on the smoke config."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

from maxtext_netdata import config
from maxtext_netdata.bench import accelerators, loading, render
from maxtext_netdata.bench import report as bench_report


def _loading(batch_s: float, workers: int = 2, n: int = 20) -> dict:
  times = [batch_s * (0.9 if i % 2 else 1.1) for i in range(n)]
  return bench_report.loading_summary(
    times,
    first_batch_s=0.5,
    elapsed_s=sum(times),
    real_tokens=n * 7000,
    slot_tokens=n * 8192,
    cpu_seconds=sum(times) * 1.5,
    workers=workers,
  )


def _training(step_s: float, wait_s: float, steps: int = 12, warmup: int = 2) -> dict:
  records = [
    {"step": i, "step_time_s": (5.0 if i < warmup else step_s), "data_wait_s": wait_s}
    for i in range(steps)
  ]
  return bench_report.training_summary(records, warmup)


def test_fast_loader_is_not_the_bottleneck():
  verdict = bench_report.decide(
    0.100, "synthetic", _loading(0.010), _training(0.101, 0.0005), 0.100, "knob"
  )
  assert verdict["kind"] == bench_report.NOT_BOTTLENECK
  assert "not the bottleneck" in verdict["text"]
  assert "10.0x faster" in verdict["text"]


def test_slow_loader_is_the_bottleneck_and_names_the_knob():
  loading = _loading(0.300, workers=0)
  knob = bench_report.next_knob(loading, cpu_cores=8, recommendation=None, stages=None)
  assert "grain_worker_count" in knob and "now 0" in knob
  verdict = bench_report.decide(0.100, "synthetic", loading, _training(0.3, 0.2), 0.1, knob)
  assert verdict["kind"] == bench_report.BOTTLENECK
  assert "3.0x slower" in verdict["text"]
  assert knob in verdict["text"]


def test_fast_loader_slow_real_steps_suspects_forced_synchronization():
  verdict = bench_report.decide(
    0.100, "synthetic", _loading(0.010), _training(0.180, 0.001), 0.100, "knob"
  )
  assert verdict["kind"] == bench_report.FORCED_SYNC
  assert "1.80x" in verdict["text"] and "explains little" in verdict["text"]
  assert "print(loss)" in verdict["text"] and "jax.device_get" in verdict["text"]


def test_fast_loader_but_waiting_steps_is_starvation():
  verdict = bench_report.decide(
    0.100, "synthetic", _loading(0.010), _training(0.180, 0.070), 0.100, "knob"
  )
  assert verdict["kind"] == bench_report.STARVED
  assert "70.00 ms" in verdict["text"]


def test_loading_only_gives_verdict_without_training():
  assert (
    bench_report.decide(0.05, "given", _loading(0.01), None, None, "k")["kind"]
    == bench_report.NOT_BOTTLENECK
  )
  assert bench_report.decide(0.05, "given", _loading(0.06), None, None, "k")["kind"] == (
    bench_report.BOTTLENECK
  )


def test_next_knob_uses_sweep_then_cores_then_slowest_stage():
  loading = _loading(0.3, workers=1)
  rec = {"workers": 4, "reason": "fastest"}
  assert "grain_worker_count=4" in bench_report.next_knob(loading, 2, rec, None)
  stages = {"read": 0.001, "build": 0.2, "batch": 0.01, "device": 0.002}
  assert bench_report.slowest_stage(stages) == "build"
  advice = bench_report.next_knob(loading, 2, {"workers": 1, "reason": ""}, stages)
  assert advice == bench_report.STAGE_ADVICE["build"]


def test_recommend_workers_prefers_fewest_meeting_target():
  sweep = [
    dict(_loading(0.200, workers=0)),
    dict(_loading(0.070, workers=1)),
    dict(_loading(0.040, workers=2)),
    dict(_loading(0.039, workers=4)),
  ]
  assert bench_report.recommend_workers(sweep, 0.1)["workers"] == 1
  assert bench_report.recommend_workers(sweep, 0.05)["workers"] == 2
  # No count meets 10 ms: the fewest near the fastest.
  assert bench_report.recommend_workers(sweep, 0.01)["workers"] == 2
  assert bench_report.recommend_workers(sweep, None)["workers"] == 2


def test_loading_summary_figures():
  s = bench_report.loading_summary([0.1, 0.2, 0.3, 0.4], 1.0, 1.0, 3000, 4000, 2.0, 2)
  assert s["batch_s"] == pytest.approx(0.25)
  assert s["batch_time_s"]["median"] == pytest.approx(0.25)
  assert s["batch_time_s"]["max"] == pytest.approx(0.4)
  assert s["real_tokens_per_s"] == pytest.approx(3000)
  assert s["cpu_cores_busy"] == pytest.approx(2.0)
  assert s["real_tokens_per_s_per_core"] == pytest.approx(1500)
  assert s["padding_share"] == pytest.approx(0.25)


# A worker that burns CPU for as long as it is told, then prints its own count of what it burnt.
_BURNER = """
import sys, time
print("ready", flush=True)
for line in sys.stdin:
  start = time.process_time()
  while time.process_time() - start < float(line):
    pass
  print(time.process_time() - start, flush=True)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the CPU-time clock read is Linux's")
def test_a_workers_cpu_time_is_counted_to_the_millisecond():
  """bench's cores-busy and tokens-per-core figures divide by the CPU time of the loader and
  its workers over the timed batches, tens of milliseconds on a fast host: counted in the
  kernel's scheduler ticks (psutil's `cpu_times`, 10 ms) a worker's 35 ms would read 30 or 40."""
  worker = subprocess.Popen(
    [sys.executable, "-c", _BURNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
  )
  process = psutil.Process(worker.pid)
  try:
    assert worker.stdout.readline() == "ready\n"  # its start-up done
    for seconds in (0.035, 0.012):
      before = loading.process_cpu_seconds(process)
      worker.stdin.write(f"{seconds}\n")
      worker.stdin.flush()
      burnt = float(worker.stdout.readline())
      assert loading.process_cpu_seconds(process) - before == pytest.approx(burnt, abs=0.002)
  finally:
    worker.stdin.close()
    worker.wait(timeout=60)
  assert loading.process_cpu_seconds(process) is None  # ended


def test_accelerator_estimate_for_latency_network_on_h100():
  cfg = config.load(None)  # base.yml holds the 20-layer, 640-wide model
  peak, source = accelerators.resolve_peak_tflops(None, "H100", cfg)
  assert (peak, source) == (989.0, "h100")
  est = accelerators.estimate(cfg, source, peak, tokens_per_batch=8 * 1024)
  d, layers, length = 640, 20, 1024
  matmul = layers * (4 * d * d + 3 * d * 2048) + 268 * d
  flops = 6 * matmul + 6 * layers * length * 10 * 64
  assert est["flops_per_token"] == pytest.approx(flops)
  at_40 = est["at_mfu"][0]
  assert at_40["mfu"] == 0.4
  assert at_40["tokens_per_s"] == pytest.approx(0.4 * 989e12 / flops)
  assert at_40["step_time_s"] == pytest.approx(8 * 1024 / at_40["tokens_per_s"])
  assert est["at_mfu"][1]["tokens_per_s"] == pytest.approx(at_40["tokens_per_s"] * 1.5)


def test_peak_from_flag_config_and_bad_name():
  cfg = config.load(None)
  assert accelerators.resolve_peak_tflops(123.0, None, cfg) == (123.0, "123-TFLOP/s chip")
  assert accelerators.resolve_peak_tflops(None, None, cfg) == (989.0, "h100")
  with pytest.raises(config.ConfigError, match="positive"):
    accelerators.resolve_peak_tflops(-1.0, None, cfg)
  with pytest.raises(config.ConfigError, match="v5e"):
    accelerators.resolve_peak_tflops(None, "tpu9", cfg)


def _report(tmp_path) -> dict:
  cfg = config.load(None)
  loading = _loading(0.012)
  acc = accelerators.estimate(cfg, "h100", 989.0, tokens_per_batch=8 * 1024)
  synthetic, real = _training(0.100, 0.0004), _training(0.104, 0.0006)
  target = {"step_time_s": 0.1, "source": "synthetic data on this machine"}
  return {
    "batch": {"sequences": 8, "max_target_length": 1024, "tokens": 8192},
    "target": target,
    "synthetic": synthetic,
    "real": real,
    "loading": loading,
    "sweep": [_loading(0.03, workers=0), loading],
    "recommended_workers": {"workers": 2, "reason": "fewest"},
    "stages": {"per_batch_s": {"read": 0.001, "build": 0.01}, "slowest": "build"},
    "accelerator": bench_report.with_loader_cores(acc, loading),
    "verdict": bench_report.decide(0.1, target["source"], loading, real, 0.1, "k"),
  }


def test_report_table_json_and_plot_hold_the_numbers(tmp_path):
  report = _report(tmp_path)
  table = render.format_table(report)
  assert report["verdict"]["text"] in table
  assert f"{report['loading']['batch_s'] * 1e3:.2f} ms/batch" in table
  assert "workers=0" in table and "slowest: build" in table
  path = render.write_json(report, tmp_path / "bench" / "report.json")
  loaded = json.loads(path.read_text())
  assert loaded["loading"]["batch_times_s"] == report["loading"]["batch_times_s"]
  assert loaded["real"]["step_times_s"] == report["real"]["step_times_s"]
  cores = loaded["accelerator"]["at_mfu"][0]["loader_cores_needed"]
  per_core = report["loading"]["slot_tokens_per_s"] / report["loading"]["cpu_cores_busy"]
  assert cores == pytest.approx(loaded["accelerator"]["at_mfu"][0]["tokens_per_s"] / per_core)
  png = render.write_plot(report, tmp_path / "bench" / "report.png")
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert png.stat().st_size > 10_000


def test_plot_draws_the_measured_numbers(tmp_path):
  report = _report(tmp_path)
  steps_ax, loading_ax = render.plot(report).axes
  plotted = {line.get_label(): list(line.get_ydata()) for line in steps_ax.get_lines()}
  for name in ("synthetic", "real"):
    ms = [t * 1e3 for t in report[name]["step_times_s"]]
    assert plotted[f"{name} step time"] == pytest.approx(ms)
    wait_ms = [t * 1e3 for t in report[name]["data_wait_s"]]
    assert plotted[f"{name} data wait"] == pytest.approx(wait_ms)
  assert plotted["target step"] == pytest.approx([100.0, 100.0])
  plotted = {line.get_label(): list(line.get_ydata()) for line in loading_ax.get_lines()}
  batch_ms = [t * 1e3 for t in report["loading"]["batch_times_s"]]
  assert plotted["loading, 2 workers"] == pytest.approx(batch_ms)
  assert plotted["loading, steady mean"][0] == pytest.approx(report["loading"]["batch_s"] * 1e3)
  sweep_0 = report["sweep"][0]["batch_s"] * 1e3
  assert plotted["steady mean, 0 workers (sweep)"][0] == pytest.approx(sweep_0)
  # Loading alone (no training runs): one panel.
  report.update(synthetic=None, real=None)
  assert len(render.plot(report).axes) == 1


# --- end to end on the smoke config -------------------------------------------------------


@pytest.fixture(scope="module")
def raw_files(tmp_path_factory):
  from maxtext_netdata import cli

  out = tmp_path_factory.mktemp("raw")
  assert cli.main(["generate", "--out", str(out), "--rows", "20000", "--shards", "2"]) == 0
  return str(out / "*.parquet")


def _bench(tmp_path, raw_files, *extra: str) -> int:
  from maxtext_netdata import cli

  return cli.main(
    [
      "bench",
      "configs/smoke.yml",
      f"grain_train_files={raw_files}",
      f"base_output_directory={tmp_path}",
      *extra,
    ]
  )


def _read_report(path) -> dict:
  report = json.loads(path.read_text())
  assert path.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  loading = report["loading"]
  assert loading["batches"] == len(loading["batch_times_s"])
  assert 0 < loading["real_tokens_per_s"] <= loading["slot_tokens_per_s"]
  # The steady rate is the batches' tokens over their wall time.
  wall = loading["batches"] * report["batch"]["tokens"] / loading["slot_tokens_per_s"]
  assert wall == pytest.approx(loading["batch_s"] * loading["batches"])
  assert sum(loading["batch_times_s"]) <= wall * 1.001
  assert set(report["stages"]["per_batch_s"]) == {"read", "build", "batch", "device"}
  assert report["stages"]["slowest"] in report["stages"]["per_batch_s"]
  return report


def test_bench_loading_only_end_to_end(tmp_path, raw_files, capsys):
  code = _bench(
    tmp_path,
    raw_files,
    "grain_worker_count=0",
    "--steps=0",
    "--batches=5",
    "--target-step-time=0.5",
  )
  assert code == 0
  out = capsys.readouterr().out
  report = _read_report(tmp_path / "smoke" / "bench" / "report.json")
  assert report["synthetic"] is None and report["real"] is None
  assert report["target"] == {"step_time_s": 0.5, "source": "--target-step-time"}
  assert report["batch"] == {"sequences": 8, "max_target_length": 256, "tokens": 8 * 256}
  assert report["loading"]["workers"] == 0 and report["loading"]["batches"] == 5
  ratio = 0.5 / report["loading"]["batch_s"]
  kind = bench_report.NOT_BOTTLENECK if ratio >= 1 else bench_report.BOTTLENECK
  assert report["verdict"]["kind"] == kind
  assert report["verdict"]["text"] in out
  assert f"{report['loading']['batch_s'] * 1e3:.2f} ms/batch" in out


@pytest.mark.slow
def test_bench_smoke_end_to_end(tmp_path, raw_files, capsys):
  assert _bench(tmp_path, raw_files, "grain_worker_count=0", "--steps=3", "--batches=4") == 0
  out = capsys.readouterr().out
  report = _read_report(tmp_path / "smoke" / "bench" / "report.json")
  assert report["target"]["source"] == "synthetic-data steps on this machine"
  synthetic, real = report["synthetic"], report["real"]
  assert len(synthetic["step_times_s"]) == len(real["step_times_s"]) == 3 + 2
  assert synthetic["step_time"]["n"] == real["step_time"]["n"] == 3
  assert report["target"]["step_time_s"] == synthetic["step_time"]["median"]
  metrics = (tmp_path / "smoke" / "bench" / "real" / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(line)["step_time_s"] for line in metrics] == real["step_times_s"]
  assert report["verdict"]["text"] in out


@pytest.mark.slow
def test_bench_worker_sweep_against_accelerator_estimate(tmp_path, raw_files, capsys):
  report_path = tmp_path / "out" / "r.json"
  code = _bench(
    tmp_path,
    raw_files,
    "grain_worker_count=0",
    "--steps=0",
    "--batches=3",
    "--sweep-workers=0,1",
    "--accelerator=v5e",
    f"--report={report_path}",
  )
  assert code == 0
  report = _read_report(report_path)
  first = report["accelerator"]["at_mfu"][0]
  assert report["accelerator"]["peak_tflops"] == 197.0
  assert report["target"]["step_time_s"] == first["step_time_s"]
  assert report["target"]["source"].startswith("estimate: v5e at 40% MFU")
  assert [s["workers"] for s in report["sweep"]] == [0, 1]
  assert report["sweep"][0] == report["loading"]
  assert report["recommended_workers"]["workers"] in (0, 1)
  assert "workers=1" in capsys.readouterr().out


@pytest.mark.parametrize(
  "extra, message",
  [
    (["grain_worker_count=0", "grain_wroker_count=1"], "did you mean 'grain_worker_count'"),
    (["dataset_type=synthetic"], "dataset_type must be network_grain"),
    (["--sweep-workers=0,x"], "--sweep-workers"),
    (["--batches=0"], "--batches=0"),
    (["--profile", "--steps=1"], "--profile records real-data steps: it needs --steps >= 2"),
  ],
)
def test_bench_bad_config_is_one_line_error(tmp_path, raw_files, capsys, extra, message):
  assert _bench(tmp_path, raw_files, *extra) == 2
  err = capsys.readouterr().err.strip()
  assert message in err and len(err.splitlines()) == 1


def test_bench_missing_data_names_the_pattern(tmp_path, capsys):
  missing = str(tmp_path / "nowhere" / "*.parquet")
  assert _bench(tmp_path, missing, "--steps=0", "--batches=2") == 2
  err = capsys.readouterr().err
  assert "nowhere" in err


def test_bench_on_two_devices_loads_the_whole_global_batch(tmp_path, raw_files):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
  command = [
    sys.executable,
    "-m",
    "maxtext_netdata",
    "bench",
    "configs/smoke.yml",
    f"grain_train_files={raw_files}",
    f"base_output_directory={tmp_path}",
    "grain_worker_count=0",
    "--steps=0",
    "--batches=3",
  ]
  result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  report = _read_report(tmp_path / "smoke" / "bench" / "report.json")
  assert report["host"]["devices"] == 2
  assert report["batch"]["sequences"] == 2 * 8
  assert report["accelerator"]["devices"] == 2


def test_bench_loader_slower_than_target_is_the_bottleneck(tmp_path, raw_files, capsys):
  args = ("grain_worker_count=0", "--steps=0", "--batches=3", "--target-step-time=0.00001")
  assert _bench(tmp_path, raw_files, *args) == 0
  report = _read_report(tmp_path / "smoke" / "bench" / "report.json")
  assert report["verdict"]["kind"] == bench_report.BOTTLENECK
  # 0 workers on a host with more cores: start workers; on one core: the slowest stage's fix.
  if report["host"]["cpu_cores"] > 1:
    expected = "raise grain_worker_count (now 0"
  else:
    expected = bench_report.STAGE_ADVICE[report["stages"]["slowest"]]
  assert expected in report["verdict"]["text"]
  assert report["verdict"]["text"] in capsys.readouterr().out


@pytest.mark.slow
def test_bench_profile_of_our_trainer(tmp_path, raw_files, capsys):
  """`--profile` on our own config: the trace of the real run, read at our jitted step."""
  args = ("grain_worker_count=0", "--steps=3", "--batches=3", "--profile")
  assert _bench(tmp_path, raw_files, *args) == 0
  report = _read_report(tmp_path / "smoke" / "bench" / "report.json")
  profile = report["profile"]
  assert profile["module"].endswith("train_step")
  # 2 warm-up + 3 steps, the warm-up left out; the last run closes the last step.
  assert [s["step"] for s in profile["steps"]] == [2, 3]
  assert all(0 <= s["idle_share"] <= 1 for s in profile["steps"])
  assert "Profile (2 steps, XLA threads of the CPU host)" in report["verdict"]["text"]
  assert "profile " in capsys.readouterr().out
