"""The `maxtext-netdata` command: one subcommand per job, each with `--help`.

The top of the house: it may import every room, and no room imports it.

Each subcommand lives in its own module, which offers `run(args) -> int`, and takes its
arguments from `add_arguments(parser)` there or, for a command whose module imports jax,
numba or pyarrow, from a light module of its room (`Command.arguments`). A command's module
is imported only when it runs, so every `--help` answers within a second (`train --help`:
0.3 s; 3.9 s when it imported the trainer), and a command reading our config
(`Command.reads_config`) checks it before that: a misspelt key's error in 0.4-0.6 s, not 2.7-2.8.
Expected failures (bad data, bad config, an output that cannot be written: a full disk, no
permission, a read-only filesystem) print one line naming the cause and exit with status 2.
Ctrl-C exits with 130 and SIGTERM with 143, both after the command's own clean-up has run
(worker processes closed, temporary files removed).
"""

from __future__ import annotations

import argparse
import errno
import gc
import importlib
import importlib.metadata
import os
import signal
import sys
from typing import NamedTuple

from maxtext_netdata import config, signals
from maxtext_netdata.cli import huge_pages
from maxtext_netdata.config import ConfigError
from maxtext_netdata.errors import DataError, UserError
from maxtext_netdata.format import tokens
from maxtext_netdata.trainer import xla_flags

# Causes of a failed write, reported as one line: a full disk or quota, a file over the size
# limit (RLIMIT_FSIZE), a read-only filesystem, no permission. Any other OSError is a fault
# to be shown with its traceback.
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES})


class Command(NamedTuple):
  module: str  # offers run(args) -> int
  help: str  # one line
  # "module:function" adding the arguments, when not the command module's add_arguments
  arguments: str = ""
  # takes `config` and `overrides` (ours, not MaxText's): they are checked before the module
  # and jax are imported, so a misspelt key answers in a fraction of a second, not seconds
  reads_config: bool = False


COMMANDS = {
  "generate": Command(
    "maxtext_netdata.data.synthetic.generate", "write realistic raw ping parquet shards"
  ),
  "ingest": Command(
    "maxtext_netdata.data.ripe.ingest",
    "RIPE Atlas ping results (JSON) -> raw parquet",
    "maxtext_netdata.data.ripe.arguments:add_arguments",
  ),
  "prepare": Command(
    "maxtext_netdata.data.prepare.prepare",
    "raw parquet -> the prepared store (cached; new files appended, old days removed)",
    "maxtext_netdata.data.prepare.arguments:prepare",
  ),
  "tokenize": Command(
    "maxtext_netdata.data.prepare.tokenize_cli",
    "tokenize a raw parquet file, one JSON list per row",
    "maxtext_netdata.data.prepare.arguments:tokenize",
  ),
  "decode": Command(
    "maxtext_netdata.format.decode_cli", "token ids back into readable measurements"
  ),
  "batches": Command(
    "maxtext_netdata.input_pipeline.batches_cli", "one digest line per batch", reads_config=True
  ),
  "train": Command(
    "maxtext_netdata.trainer.train",
    "train a model (MaxText-style trainer)",
    "maxtext_netdata.trainer.arguments:add_arguments",
    reads_config=True,
  ),
  "predict": Command(
    "maxtext_netdata.trainer.predict",
    "a trained model's failure probability and RTT for a probe's next pings",
    "maxtext_netdata.trainer.arguments:predict",
    reads_config=True,
  ),
  "bench": Command(
    "maxtext_netdata.bench.benchmark",
    "data-loading benchmark with a verdict",
    "maxtext_netdata.bench.arguments:add_arguments",
    reads_config=True,
  ),
  "maxtext-train": Command(
    "maxtext_netdata.maxtext.train", "run MaxText's trainer with the plugin"
  ),
}


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
  """Adds command `name`'s arguments to `parser`, importing no more than they need."""
  command = COMMANDS[name]
  module_name, _, function = (command.arguments or f"{command.module}:add_arguments").partition(":")
  getattr(importlib.import_module(module_name), function)(parser)


def version() -> str:
  """`maxtext-netdata 0.1.0 (tokens netdata-v1)`: the installed package and its token format."""
  try:
    installed = importlib.metadata.version("maxtext_netdata")
  except importlib.metadata.PackageNotFoundError:  # run from a checkout that is not installed
    installed = "(not installed)"
  return f"maxtext-netdata {installed} (tokens {tokens.FORMAT})"


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    prog="maxtext-netdata",
    description="Input pipeline, trainer and benchmark for network-measurement language models.",
  )
  parser.add_argument("--version", action="version", version=version())
  sub = parser.add_subparsers(dest="command", metavar="COMMAND")
  sub.required = True
  for name, command in COMMANDS.items():
    command_parser = sub.add_parser(name, help=command.help, description=command.help)
    if name == selected:
      add_arguments(name, command_parser)
  return parser


def _write_failure_line(error: OSError) -> str:
  """`cannot write PATH: no space left on device (ENOSPC)`, then the error's notes after `; `.

  PATH is the error's file name (a writer names its file or folder where the OS does not:
  `errors.WritesTo`). Permission denied may come from reading as well as writing: that one
  says `cannot access`.
  """
  cause = os.strerror(error.errno)
  line = "cannot access" if error.errno == errno.EACCES else "cannot write"
  if error.filename is not None:
    line += f" {error.filename}"
  line += f": {cause[:1].lower()}{cause[1:]} ({errno.errorcode[error.errno]})"
  return "; ".join([line, *getattr(error, "__notes__", [])])


def _close_maxtext_iterators() -> None:
  """The MaxText plugin's loading (Grain workers, /dev/shm blocks), where it was installed."""
  plugin = sys.modules.get("maxtext_netdata.maxtext.plugin")
  if plugin is not None:
    plugin.close_iterators()


def _mark_absl_flags_parsed() -> None:
  """Grain reads its absl flags when it starts worker processes, and only an entry point may
  parse them; ours take every setting from the config, so the flags keep their defaults."""
  from absl import flags  # noqa: PLC0415

  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def main(argv: list[str] | None = None) -> int:
  if argv is None:  # the command itself, not a call from Python: start with huge pages
    huge_pages.restart_with_huge_pages()
  argv = list(sys.argv[1:] if argv is None else argv)
  # Options after `--` belong to another program (`prepare --runner beam -- --runner=...`).
  passthrough = argv[argv.index("--") + 1 :] if "--" in argv else []
  argv = argv[: argv.index("--")] if "--" in argv else argv
  selected = next((a for a in argv if not a.startswith("-")), None)
  if selected not in COMMANDS:
    selected = None
  parser = build_parser(selected)
  args, extra = parser.parse_known_args(argv)
  # `key=value` overrides may also follow the options (`batches CONFIG --steps 3 seed=1`).
  stray = [a for a in extra if a.startswith("-") or "=" not in a]
  if stray or (extra and not hasattr(args, "overrides")):
    parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
  if extra:
    args.overrides = [*args.overrides, *extra]
  args.passthrough = passthrough
  xla_flags.apply()  # before any backend starts: XLA reads its flags then, once
  command = COMMANDS[args.command]
  try:
    with signals.as_exceptions():
      if command.reads_config and not getattr(args, "maxtext", False):
        config.load(args.config, args.overrides)  # before jax: a bad key answers at once
      module = importlib.import_module(command.module)
      _mark_absl_flags_parsed()
      signals.on_forced_exit(_close_maxtext_iterators)
      return int(module.run(args) or 0)
  except (DataError, ConfigError, UserError) as e:
    print(f"maxtext-netdata {args.command}: error: {e}", file=sys.stderr)
    return 2
  except BrokenPipeError:  # `maxtext-netdata batches ... | head`: the reader has gone
    # Python would flush stdout again at exit and print the same error: point it at nothing.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE  # the status of a command a closed pipe ended
  except OSError as e:
    if e.errno not in _WRITE_ERRNOS:
      raise
    print(f"maxtext-netdata {args.command}: error: {_write_failure_line(e)}", file=sys.stderr)
    return 2
  except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM as signals.Terminated
    status = signals.ended(f"maxtext-netdata {args.command}", e)
  _release_worker_blocks()  # the exception and the batches its frames held are gone now
  return status


def _release_worker_blocks() -> None:
  """Unlinks the /dev/shm blocks of the Grain batches an interrupted command still held.

  Grain unlinks a worker's block on a thread of its own when the array over it is garbage;
  the arrays in the frames of the interrupt's traceback (a batch being received when SIGTERM
  reached the whole process group, as Slurm sends it) become garbage only once the exception
  is handled, right before the process exits, and their unlinks were left to Python's
  resource tracker: "There appear to be 6 leaked shared_memory objects". Collected and waited
  for here; nothing to do where no Grain pipeline was imported.
  """
  network_grain = sys.modules.get("maxtext_netdata.input_pipeline.network_grain")
  if network_grain is not None:
    gc.collect()
    network_grain.release_shared_memory()


if __name__ == "__main__":
  sys.exit(main())
