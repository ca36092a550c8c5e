"""The profile check of MaxText's pipeline-performance guide, read from a JAX profiler trace.

The guide asks a person to open the trace of a few training steps and look for gaps: stretches
in which the accelerator runs nothing. `analyze` measures them from the `.xplane.pb` that
`jax.profiler.trace` / `start_trace` (and MaxText's `profiler: xplane`) write:

- steps: the runs of the step's XLA program on the accelerator (its module, e.g.
  `jit_train_step`); a step runs from one run's start to the next one's, so the host running
  ahead (asynchronous dispatch) does not blur them;
- accelerator activity: on GPU/TPU the first device plane's op tracks (`XLA Ops`, CUDA streams);
  on CPU the XLA threads of the host plane (`tf_XLAExecute`, `tf_XLAEigen`: thunks, fusions);
- per step, the share in which the accelerator ran nothing, and each gap (an idle stretch of at
  least `GAP_MIN_SHARE` of the median step, and `GAP_MIN_S`);
- what the host was doing in each gap, from the Python tracer's events: loading data
  (`next`, `load_next_batch`, Grain), else reading a device value (`float`, `np.asarray`,
  `jax.device_get`, `block_until_ready`) that waited for the device up to the gap (the host
  waited for the device, so nothing was queued behind it), else other host work. A read that
  waited counts when it was still running at the gap's start or ended less than a gap's
  threshold before it: the device's activity runs on a moment after the read's value is ready
  (the program's own wrap-up, 3.3 ms on a loaded 2-core host, where the read's gap had been
  taken for other host work).

What the analysis changes in bench's verdict is `report.amend_verdict`; its plot panel is
`render`'s. jaxlib's `ProfileData` reads the trace; there is no other reader of xplane files in the
environment, and the analysis itself (interval unions over a few thousand events) is small.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections import Counter
from pathlib import Path

import numpy as np

from maxtext_netdata.bench import kernel_time

# Idle stretches shorter than this are noise (dispatch of the next program, thread hand-over).
GAP_MIN_S = 0.5e-3
GAP_MIN_SHARE = 0.05
# Busy intervals this close together are one busy stretch (the gaps between a program's thunks).
MERGE_S = 0.1e-3
# A gap is the host's data wait when loading covers at least this share of it.
DATA_COVERS = 0.5
# A device read this long waited for the device: reading a value already computed takes tens of
# microseconds (13 reads of a step's scalars in 0.3 ms on a loaded 2-core host).
READ_WAITED_S = 0.5e-3
# Steps whose median idle share is above this are reported as leaving the accelerator idle.
IDLE_SHARE_NOTABLE = 0.10

# The start of `source` when the activity was read from an accelerator's own tracks.
DEVICE_TRACKS = "device tracks of"

DATA = "data"
DEVICE_READ = "device_to_host_read"
HOST = "other_host_work"

_DATA_EVENT = re.compile(
  r"(^\$builtins next$|__next__|load_next_batch|[/\\]grain[/\\]|input_pipeline|data_loader"
  r"|multihost_dataloading|^\$.*\bgrain\b)"
)
_READ_EVENT = re.compile(
  r"(np\.asarray\(jax\.Array\)|array\.py:\d+ (_value|__float__|__int__|__array__|item|tolist)"
  r"|device_get|block_until_ready|_single_device_array_to_np_array|CopyToHost|ToLiteral)"
)
_DEVICE_OP_LINES = ("XLA Ops",)
_IDLE_MARKERS = ("ThreadpoolListener",)


def find_xplane(log_dir: str | os.PathLike) -> Path:
  """The newest `.xplane.pb` under `log_dir`.

  Raises:
    FileNotFoundError: none there (the profiler did not run).
  """
  found = sorted(Path(log_dir).rglob("*.xplane.pb"), key=lambda p: p.stat().st_mtime)
  if not found:
    raise FileNotFoundError(f"{log_dir}: no .xplane.pb profiler trace")
  return found[-1]


def analyze(xplane: str | os.PathLike, step_module: str | None = None, first_step: int = 0) -> dict:
  """Idle share per step, the gaps and what the host did in them, from one trace file:
  `analyze_events(read_events(xplane), ...)`."""
  return analyze_events(read_events(xplane), step_module, first_step)


def read_events(xplane: str | os.PathLike) -> dict:
  """What the analysis needs of a `.xplane.pb` written by the JAX profiler, as plain lists:

  - `source`: where the accelerator's activity was read (device tracks, or CPU XLA threads);
  - `busy`: its op events, `[start_ns, end_ns]`;
  - `runs`: the step programs' runs `[module, start_ns, end_ns]` from an `XLA Modules` line
    (TPU), else None, and then `ops`: `[module, op, start_ns, end_ns, run_id or None,
    kernel]`, the op events carrying an `hlo_module` stat, from which `runs_of_ops` finds the
    runs and `kernel_time.device_time` the kernel time by class;
  - `python`: the dispatching thread's events `[name, start_ns, end_ns]`.

  Raises ValueError for a trace without a host plane or accelerator activity.
  """
  from jax.profiler import ProfileData

  data = ProfileData.from_file(str(xplane))
  host = data.find_plane_with_name("/host:CPU")
  if host is None:
    raise ValueError(f"{xplane}: no host plane in the trace")
  events = _accelerator_activity(data, host)
  if not events["busy"]:
    raise ValueError(f"{xplane}: no accelerator activity in the trace")
  events["trace"] = str(xplane)
  events["python"] = [[e.name, e.start_ns, e.end_ns] for e in _main_thread_events(host)]
  return events


def write_events(events: dict, path: str | os.PathLike, steps: int | None = None) -> Path:
  """`events` (`read_events`) as gzipped JSON at `path`; with `steps`, only those around the
  middle run of the step program, so a trace of a few steps stays small (a test fixture):
  `steps + 1` whole runs, whose starts bound `steps` steps for `analyze_events`."""
  events = dict(events)
  if steps is not None:
    module = _step_module(_event_runs(events), None)
    starts = sorted(lo for name, lo, _ in _event_runs(events) if name == module)
    ends = sorted(hi for name, _, hi in _event_runs(events) if name == module)
    first = max(0, (len(starts) - steps - 1) // 2)
    last = min(len(starts) - 1, first + steps)
    lo, hi = starts[first], ends[last] + 1

    def inside(start: int, end: int) -> bool:
      return start < hi and end > lo

    # Busy intervals and host events that overlap the window; runs and ops that start in it
    # (a neighbour's tail would count as one more run).
    events["busy"] = [b for b in events["busy"] if inside(*b)]
    events["python"] = [p for p in events["python"] if inside(p[1], p[2])]
    if events.get("runs") is not None:
      events["runs"] = [r for r in events["runs"] if lo <= r[1] < hi]
    events["ops"] = [o for o in events.get("ops") or [] if lo <= o[2] < hi]
  path = Path(path)
  path.write_bytes(gzip.compress(json.dumps(events, separators=(",", ":")).encode()))
  return path


def load_events(path: str | os.PathLike) -> dict:
  """What `write_events` wrote."""
  return json.loads(gzip.decompress(Path(path).read_bytes()))


def _event_runs(events: dict) -> list[tuple[str, int, int]]:
  if events.get("runs") is not None:
    return [tuple(r) for r in events["runs"]]
  return runs_of_ops(events.get("ops") or [])


def analyze_events(events: dict, step_module: str | None = None, first_step: int = 0) -> dict:
  """Idle share per step, the gaps and what the host did in them.

  Args:
    events: `read_events` of a trace (or `load_events` of a saved one).
    step_module: a substring of the XLA module name of the step (`train_step`); by default the
      module that ran twice or more with the most accelerator time.
    first_step: the training step of the trace's first run of the step (a profiler started
      late), for the step numbers of the report.

  Returns:
    The report's `profile` section: `source` (device tracks or CPU XLA threads), `module`,
    `steps` (per step: start, seconds, idle seconds and share, gaps), `idle_share` (summary
    over steps), `gaps` (count, seconds, by cause), `host_waiting_on` (the cause holding the
    most gap time, or None without gaps), `device_time` (kernel time per step by class and
    the heaviest kernels, `kernel_time.device_time`; None where the trace has no kernel
    names).

  Raises:
    ValueError: the trace has fewer than two runs of the step.
  """
  trace = events.get("trace", "trace")
  python = events["python"]
  runs = _event_runs(events)
  module = _step_module(runs, step_module)
  starts = sorted(start for name, start, _ in runs if name == module)
  if len(starts) < 2:
    raise ValueError(
      f"{trace}: {len(starts)} runs of the step ({module or step_module}); need 2 or more"
      " (profile more steps)"
    )
  busy = _union([tuple(b) for b in events["busy"]], merge_ns=MERGE_S * 1e9)
  periods = list(zip(starts, starts[1:], strict=False))
  median_s = float(np.median([(e - s) / 1e9 for s, e in periods]))
  min_gap_ns = max(GAP_MIN_S, GAP_MIN_SHARE * median_s) * 1e9
  data_events = _union([(a, b) for name, a, b in python if _DATA_EVENT.search(name)])
  reads = [(a, b) for name, a, b in python if _READ_EVENT.search(name)]

  steps, gap_list = [], []
  for number, (lo, hi) in enumerate(periods, start=first_step):
    idle = _complement(busy, lo, hi)
    step_gaps = []
    for a, b in idle:
      if b - a >= min_gap_ns:
        gap = {"start_s": (a - starts[0]) / 1e9, "seconds": (b - a) / 1e9}
        gap["cause"] = _cause(a, b, data_events, reads, slack_ns=min_gap_ns)
        step_gaps.append(gap)
    idle_ns = sum(b - a for a, b in idle)
    steps.append(
      {
        "step": number,
        "start_s": (lo - starts[0]) / 1e9,
        "seconds": (hi - lo) / 1e9,
        "idle_s": idle_ns / 1e9,
        "idle_share": idle_ns / (hi - lo),
        "gaps": step_gaps,
      }
    )
    gap_list += step_gaps
  by_cause = {cause: 0.0 for cause in (DATA, DEVICE_READ, HOST)}
  for gap in gap_list:
    by_cause[gap["cause"]] += gap["seconds"]
  shares = [s["idle_share"] for s in steps]
  return {
    "trace": trace,
    "source": events["source"],
    "module": module,
    "steps": steps,
    "step_time_s": median_s,
    "idle_share": {
      "median": float(np.median(shares)),
      "max": float(np.max(shares)),
      "mean": float(np.mean(shares)),
    },
    "gap_min_s": min_gap_ns / 1e9,
    "gaps": {
      "count": len(gap_list),
      "steps_with_gaps": sum(1 for s in steps if s["gaps"]),
      "seconds": sum(g["seconds"] for g in gap_list),
      "by_cause_s": by_cause,
    },
    "host_waiting_on": max(by_cause, key=by_cause.get) if gap_list else None,
    "device_time": kernel_time.device_time(
      events.get("ops") or [], starts[0], starts[-1], len(periods)
    ),
  }


def read(log_dir: str | os.PathLike, **kwargs) -> dict:
  """`analyze` of the newest trace under `log_dir`, or `{"error": why}` when there is none or
  it cannot be measured: the rest of a bench report stands without its profile."""
  try:
    return analyze(find_xplane(log_dir), **kwargs)
  except (FileNotFoundError, ValueError) as e:
    return {"error": str(e)}


def describe(profile: dict) -> str:
  """One or two sentences on what the trace shows."""
  steps = len(profile["steps"])
  share = profile["idle_share"]["median"]
  gaps = profile["gaps"]
  words = (
    f"Profile ({steps} steps, {profile['source']}): the accelerator runs nothing for"
    f" {share:.0%} of a step (median)"
  )
  if not gaps["count"]:
    return f"{words}; no gaps between steps."
  cause = {
    DATA: "waiting for data",
    DEVICE_READ: "blocked on a device-to-host read (forced synchronization)",
    HOST: "busy with other host work",
  }[profile["host_waiting_on"]]
  return (
    f"{words}; {gaps['count']} gaps in {gaps['steps_with_gaps']} steps,"
    f" {gaps['seconds'] * 1e3:.1f} ms in all, mostly while the host was {cause}."
  )


def _accelerator_activity(data, host) -> dict:
  """`read_events`' source, busy, runs and ops: the first device plane's op tracks, else the
  CPU host's XLA threads."""
  for plane in data.planes:
    if not plane.name.startswith("/device:") or "CPU" in plane.name:
      continue
    lines = list(plane.lines)
    chosen = [ln for ln in lines if ln.name in _DEVICE_OP_LINES]
    chosen = chosen or [ln for ln in lines if ln.name.lower().startswith("stream")]
    busy = [[e.start_ns, e.end_ns] for ln in chosen for e in ln.events if e.duration_ns > 0]
    if not busy:
      continue
    modules = [ln for ln in lines if ln.name == "XLA Modules"]
    runs = (
      [[re.sub(r"\(\d+\)$", "", e.name), e.start_ns, e.end_ns] for e in modules[0].events]
      if modules
      else None
    )
    ops = [] if modules else _ops(e for ln in chosen for e in ln.events)
    return {"source": f"{DEVICE_TRACKS} {plane.name}", "busy": busy, "runs": runs, "ops": ops}
  events = [
    e
    for line in host.lines
    if line.name.startswith("tf_XLA")
    for e in line.events
    if e.duration_ns > 0 and not e.name.startswith(_IDLE_MARKERS)
  ]
  return {
    "source": "XLA threads of the CPU host",
    "busy": [[e.start_ns, e.end_ns] for e in events],
    "runs": None,
    "ops": _ops(events),
  }


def _main_thread_events(host) -> list:
  """Events of the thread that dispatches the steps: the Python thread with the most jitted
  dispatches (named `python`, or after the script)."""
  best, best_count = [], -1
  for line in host.lines:
    if line.name.startswith("tf_XLA"):
      continue
    events = list(line.events)
    count = sum(1 for e in events if e.name.startswith("PjitFunction("))
    if count > best_count:
      best, best_count = events, count
  return best


def _ops(events) -> list[list]:
  """`[module, op, start_ns, end_ns, run_id or None, kernel]` of the op events with
  `hlo_module`; `kernel` is the event's own name (a GPU kernel's, e.g. cuDNN's or cuBLAS's),
  the op's on the CPU."""
  ops = []
  for e in events:
    stats = dict(e.stats)
    if "hlo_module" in stats:
      op = stats.get("hlo_op", e.name)
      ops.append([stats["hlo_module"], op, e.start_ns, e.end_ns, stats.get("run_id"), e.name])
  return ops


def runs_of_ops(ops) -> list[tuple[str, int, int]]:
  """Program runs `(module, start, end)` from op events `(module, op, start, end, run_id[,
  kernel])`.

  Ops with a `run_id` (XLA on the CPU) are grouped by it. A GPU's kernels carry the module and
  the op but no run id (seen on an H100 with jax 0.11.2: `hlo_module`, `hlo_op`,
  `correlation_id`, `cuda_graph_id`), and one run's kernels come from many launches, so there
  a module's runs are cut where an op that runs once per run recurs: per module, the op
  counts that two or more ops share, the smallest of them above one is the number of runs
  (ops inside a scanned loop run once per layer; an op seen once is a run cut by the trace's
  ends), and the first op with that count marks each run's start. A run then reaches to the
  next one's start, so a step's period is the same whichever op marks it.

  An op is named with its kernel where the events carry one: XLA can run a whole step as one
  command buffer (a CUDA graph), and then every kernel of the step carries the same op
  (`command_buffer_1`, seen in an H200's trace of the unrolled model); the kernels' names
  still tell the ops apart.
  """
  spans: dict[tuple[str, int], list[int]] = {}
  unnumbered: dict[str, list[tuple[tuple, int, int]]] = {}
  for module, op, start, end, run_id, *kernel in ops:
    if run_id is None:
      unnumbered.setdefault(module, []).append(((op, *kernel), start, end))
      continue
    span = spans.setdefault((module, run_id), [start, end])
    span[0], span[1] = min(span[0], start), max(span[1], end)
  runs = [(name, lo, hi) for (name, _), (lo, hi) in spans.items()]
  for module, module_ops in unnumbered.items():
    module_ops.sort(key=lambda o: o[1])
    counts = Counter(op for op, _, _ in module_ops)
    shared = Counter(counts.values())
    repeated = [n for n in counts.values() if n > 1]
    if not repeated:
      runs.append((module, module_ops[0][1], max(end for _, _, end in module_ops)))
      continue
    times = min((n for n in repeated if shared[n] > 1), default=min(repeated))
    marker = next(op for op, _, _ in module_ops if counts[op] == times)
    starts = [start for op, start, _ in module_ops if op == marker]
    ends = [*starts[1:], None]
    for lo, next_lo in zip(starts, ends, strict=True):
      inside = [
        end for _, start, end in module_ops if start >= lo and (next_lo is None or start < next_lo)
      ]
      runs.append((module, lo, max(inside)))
  return runs


def _step_module(runs, wanted: str | None) -> str | None:
  totals: dict[str, list[int]] = {}
  for name, lo, hi in runs:
    if wanted is None or wanted in name:
      total = totals.setdefault(name, [0, 0])
      total[0] += 1
      total[1] += hi - lo
  repeated = {name: t for name, t in totals.items() if t[0] >= 2} or totals
  if not repeated:
    return None
  return max(repeated, key=lambda name: repeated[name][1])


def _union(intervals, merge_ns: float = 0.0) -> list[tuple[int, int]]:
  merged: list[list[int]] = []
  for a, b in sorted(intervals):
    if merged and a <= merged[-1][1] + merge_ns:
      merged[-1][1] = max(merged[-1][1], b)
    else:
      merged.append([a, b])
  return [(a, b) for a, b in merged]


def _complement(busy, lo: int, hi: int) -> list[tuple[int, int]]:
  idle, cursor = [], lo
  for a, b in busy:
    if b <= cursor:
      continue
    if a >= hi:
      break
    if a > cursor:
      idle.append((cursor, a))
    cursor = max(cursor, b)
  if cursor < hi:
    idle.append((cursor, hi))
  return idle


def _cause(a: int, b: int, data_events, read_events, slack_ns: float) -> str:
  """The cause of the gap `[a, b)`: the host's data wait, a device read that waited for the
  device up to the gap (within `slack_ns` of its start), or other host work."""
  covered = sum(max(0, min(b, y) - max(a, x)) for x, y in data_events)
  if covered >= DATA_COVERS * (b - a):
    return DATA
  for x, y in read_events:
    if x < a <= y + MERGE_S * 1e9:  # still waiting when the device went idle
      return DEVICE_READ
    if x < a and y >= a - slack_ns and y - x >= READ_WAITED_S * 1e9:
      return DEVICE_READ
  return HOST
