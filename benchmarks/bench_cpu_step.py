"""The trainer's step on XLA's CPU backend: what huge pages for glibc's large blocks and the
MLP's backward shaped for XLA:CPU each gain, in step time and in compile time.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_cpu_step.py [--config configs/smoke.yml]
        [--steps 30] [--rounds 2] [key=value ...]

Each round starts three fresh processes, one after the other:
- `glibc default`: `GLIBC_TUNABLES` with `glibc.malloc.hugetlb=0` (glibc's default), the MLP's
  product differentiated by autodiff (`silu(gate) * up`): the step as it was before either;
- `huge pages`: `glibc.malloc.hugetlb=1` (what `scripts/setup_env.sh` and the
  `maxtext-netdata` command start with: `maxtext_netdata/cli/huge_pages.py`), autodiff's MLP;
- `+ mlp backward`: huge pages and `model.gated_silu_for_cpu`, what the trainer runs on a CPU.
Each jits the config's train step (`trainer.train.Trainer`), runs it once to compile (the
first step: tracing, compiling, one step; no compilation cache), then times `--steps` steps
on the `synthetic` dataset's fixed batch (`interface.create_data_iterator`), waiting for each.
Prints per process: the first step, the median and best step, the minor page faults and
system CPU time per step (`getrusage` around the timed steps) and the last loss's bits; then
the median step and first step of each setting over the rounds and their ratios to the
first's. A shared machine only slows a run down, so compare the best as well as the median.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# name → (GLIBC_TUNABLES, the MLP's product: the trainer's CPU one or autodiff's)
SETTINGS = {
  "glibc default": ("glibc.malloc.hugetlb=0", "autodiff"),
  "huge pages": ("glibc.malloc.hugetlb=1", "autodiff"),
  "+ mlp backward": ("glibc.malloc.hugetlb=1", "cpu"),
}


def _child(config: str, steps: int, mlp: str, overrides: list[str]) -> None:
  import jax  # noqa: PLC0415

  sys.path.insert(0, ROOT)
  from maxtext_netdata import config as config_lib  # noqa: PLC0415
  from maxtext_netdata.distributed.mesh import make_mesh  # noqa: PLC0415
  from maxtext_netdata.input_pipeline import interface  # noqa: PLC0415
  from maxtext_netdata.trainer import model  # noqa: PLC0415
  from maxtext_netdata.trainer.train import Trainer  # noqa: PLC0415

  if mlp == "autodiff":  # the product without its CPU-shaped backward, as before it
    model.gated_silu_for_cpu = lambda gate, up: jax.nn.silu(gate) * up

  cfg = config_lib.load(config, ["dataset_type=synthetic", *overrides])
  mesh = make_mesh(cfg)
  trainer = Trainer(cfg, mesh)
  state = trainer.init_state(jax.random.key(0))
  train, _ = interface.create_data_iterator(cfg, mesh)  # the synthetic dataset's fixed batch
  batch = next(train)
  start = time.perf_counter()
  state, metrics = trainer.train_step(state, batch)  # compile
  jax.block_until_ready(metrics)
  first = time.perf_counter() - start
  before, times = resource.getrusage(resource.RUSAGE_SELF), []
  for _ in range(steps):
    start = time.perf_counter()
    state, metrics = trainer.train_step(state, batch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  after = resource.getrusage(resource.RUSAGE_SELF)
  print(
    json.dumps(
      {
        "first_s": first,
        "median_s": statistics.median(times),
        "best_s": min(times),
        "faults_per_step": (after.ru_minflt - before.ru_minflt) / steps,
        "sys_s_per_step": (after.ru_stime - before.ru_stime) / steps,
        "loss": float(metrics["loss"]).hex(),
      }
    )
  )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default=os.path.join(ROOT, "configs", "smoke.yml"))
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--child", choices=("autodiff", "cpu"), help=argparse.SUPPRESS)
  args, overrides = parser.parse_known_args()
  if args.child:
    _child(args.config, args.steps, args.child, overrides)
    return
  medians: dict[str, list[float]] = {name: [] for name in SETTINGS}
  firsts: dict[str, list[float]] = {name: [] for name in SETTINGS}
  for round_ in range(args.rounds):
    for name, (tunables, mlp) in SETTINGS.items():
      env = {**os.environ, "GLIBC_TUNABLES": tunables, "JAX_PLATFORMS": "cpu"}
      command = [sys.executable, __file__, "--child", mlp, "--config", args.config]
      command += ["--steps", str(args.steps), *overrides]
      out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
      result = json.loads(out.strip().splitlines()[-1])
      medians[name].append(result["median_s"])
      firsts[name].append(result["first_s"])
      print(
        f"round {round_ + 1} {name:14s} first step {result['first_s']:5.2f} s, median"
        f" {result['median_s'] * 1e3:7.1f} ms, best {result['best_s'] * 1e3:7.1f} ms,"
        f" {result['faults_per_step']:8,.0f} page faults and"
        f" {result['sys_s_per_step'] * 1e3:5.1f} ms system CPU a step, loss {result['loss']}",
        flush=True,
      )
  steps = {name: statistics.median(times) for name, times in medians.items()}
  compiles = {name: statistics.median(times) for name, times in firsts.items()}
  step0, compile0 = steps["glibc default"], compiles["glibc default"]
  print(
    "median step: "
    + ", ".join(f"{name} {step * 1e3:.1f} ms ({step0 / step:.2f}x)" for name, step in steps.items())
  )
  print(
    "first step: "
    + ", ".join(f"{name} {t:.2f} s ({compile0 / t:.2f}x)" for name, t in compiles.items())
  )


if __name__ == "__main__":
  main()
