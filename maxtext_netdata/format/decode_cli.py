"""`maxtext-netdata decode [FILE|-]`: token ids back into readable measurements.

Reads JSON lists of token ids, one per line (what `tokenize` prints; a line may hold several
measurements and PAD), and prints one measurement per line: a JSON object, or with
`--format text` a readable line.
"""

from __future__ import annotations

import json
import os
import sys

from maxtext_netdata.errors import DataError
from maxtext_netdata.format import tokenizer


def add_arguments(parser) -> None:
  parser.add_argument(
    "file", nargs="?", default="-", help="token lists, one JSON list per line (default -: stdin)"
  )
  parser.add_argument(
    "--format", choices=("json", "text"), default="json", help="output format (default json)"
  )


def _token_list(line: str, where: str) -> list[int]:
  try:
    tokens = json.loads(line)
  except json.JSONDecodeError:
    tokens = None
  if not isinstance(tokens, list) or not all(
    isinstance(t, int) and not isinstance(t, bool) for t in tokens
  ):
    raise DataError(f"{where}: expected a JSON list of token ids, got {line.strip()[:60]!r}")
  return tokens


def run(args) -> int:
  name = "<stdin>" if args.file == "-" else args.file
  try:
    source = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")  # noqa: SIM115
  except OSError as e:
    raise DataError(f"{name}: cannot open ({e.strerror})") from None
  try:
    with source:
      for number, line in enumerate(source, start=1):
        if not line.strip():
          continue
        where = f"{name}: line {number}"
        tokens = _token_list(line, where)  # its errors name the line already
        try:
          measurements = tokenizer.decode(tokens)
        except ValueError as e:
          raise DataError(f"{where}: {e}") from None
        for measurement in measurements:
          if args.format == "text":
            sys.stdout.write(tokenizer.format_measurement(measurement) + "\n")
          else:
            sys.stdout.write(json.dumps(measurement) + "\n")
      sys.stdout.flush()
  except BrokenPipeError:
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
  return 0
