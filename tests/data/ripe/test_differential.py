"""`ingest` against a reader written here from docs/data_format.md alone, on mutated results.

The independent reader (`_expect`) takes each line with `json.loads` and applies the
documented mapping and rules: the casts of DuckDB's reader, the rows of each result shape,
and when a line is bad. The corpus is RIPE's real shapes (`tests.helpers.ripe_results`)
mutated by a seeded generator: fields dropped, duplicated and retyped, extreme numbers,
NaN and Infinity, deep nesting, unicode and escapes, non-objects, blank lines, broken text.
Every input encoding gives exactly the independent reader's rows, counts and first bad line,
and both of ingest's paths (the compiled scanner and the DuckDB reference) name every bad
line the independent reader names.
"""

import bz2
import dataclasses
import glob
import gzip
import json
import math
import os
import random
import re
import socket

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from maxtext_netdata.data.raw import schema
from maxtext_netdata.data.ripe import reference, scan
from maxtext_netdata.data.ripe.ingest import ingest
from maxtext_netdata.errors import DataError
from tests.helpers.ripe_results import FIRMWARE_0, MODERN, T0

# --- the independent reader: docs/data_format.md, "RIPE Atlas JSON → raw rows" -------------

TEXT = ("type", "from", "src_addr", "dst_addr", "addr")
INTEGER = ("msm_id", "prb_id", "timestamp", "af", "rcvd")
NEEDED = (*TEXT, *INTEGER, "result", "avg")  # a key twice among these: a bad line
LAST_SECOND = 4_294_967_295  # 2106-02-07T06:28:15Z, the last second a store keeps
MAX_NESTING = 512
_INTEGER_TEXT = re.compile(r"-?(0|[1-9][0-9]*)")


class Bad(Exception):
  """The line is bad."""


def _nesting(text: str) -> int:
  """The depth of arrays and objects in `text`, brackets in strings not counted."""
  if text.count("[") + text.count("{") <= MAX_NESTING:
    return 0  # cannot be deeper
  depth = deepest = 0
  in_string = escaped = False
  for c in text:
    if in_string:
      escaped, in_string = (False, True) if escaped else (c == "\\", c != '"')
    elif c == '"':
      in_string = True
    elif c in "[{":
      depth += 1
      deepest = max(deepest, depth)
    elif c in "]}":
      depth -= 1
  return deepest


def _lone_surrogate(value) -> bool:
  """Whether a string in `value` holds half a surrogate pair (no Unicode text)."""
  todo = [value]  # a loop, not a recursion: lists nest 511 deep
  while todo:
    value = todo.pop()
    if isinstance(value, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in value):
      return True
    if isinstance(value, dict) and value["\0lone"]:
      return True
    if isinstance(value, list):
      todo += value
  return False


def _pairs(pairs):
  """`json.loads`'s object hook: a dict, with the keys seen more than once and whether a
  key or string anywhere in it (values of a key seen twice included) is a lone surrogate."""
  value = dict(pairs)
  value["\0twice"] = {k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i])}
  value["\0lone"] = any(_lone_surrogate(k) or _lone_surrogate(v) for k, v in pairs)
  return value


def _integer(value):
  """DuckDB's BIGINT of a JSON value (None: null); Bad if it has none."""
  if value is None:
    return None
  if isinstance(value, bool):
    return int(value)
  if isinstance(value, str) and _INTEGER_TEXT.fullmatch(value):
    value = int(value)
  if isinstance(value, float) and math.isfinite(value):
    value = round(value)  # to the nearest, a half to even
  if isinstance(value, int) and -(2**63) <= value < 2**63:
    return value
  raise Bad


def _float(value):
  """DuckDB's DOUBLE of a JSON value (None: null); Bad if it has none."""
  if value is None:
    return None
  if isinstance(value, bool | int | float):
    return float(value)
  if isinstance(value, str):
    try:
      return float(value)
    except ValueError:
      raise Bad from None
  raise Bad


def _text(value):
  """The text of a JSON value where text belongs; only strings can be addresses, so any
  other value's JSON text is left as one that is not an address."""
  if value is None or isinstance(value, str):
    return value
  return f"<{type(value).__name__}>"


def _form(address):
  if not address:
    return None
  return 6 if ":" in address else 4 if "." in address else None


def _fits(address, version: int) -> bool:
  if not address:
    return True
  family = socket.AF_INET6 if ":" in address else socket.AF_INET
  try:
    socket.inet_pton(family, address)
  except (OSError, ValueError):
    return False
  return (6 if family == socket.AF_INET6 else 4) == version


@dataclasses.dataclass
class Expected:
  rows: list = dataclasses.field(default_factory=list)  # in input order
  bad: list = dataclasses.field(default_factory=list)  # line (or element) numbers
  other_types: int = 0
  duplicates: int = 0


def _rows_of(value: dict) -> tuple[list, int]:
  """(rows, duplicates) of a ping result; Bad if it gives none that prepare accepts."""
  if value["\0twice"] & set(NEEDED):
    raise Bad
  if value["\0lone"]:
    raise Bad  # DuckDB's reader refuses it: no Unicode text
  fields = {k: _integer(value.get(k)) for k in INTEGER}
  texts = {k: _text(value.get(k)) for k in TEXT}
  avg = _float(value.get("avg"))
  src = texts["from"] if texts["from"] else texts["src_addr"]
  dst = texts["dst_addr"] if texts["dst_addr"] else texts["addr"] or texts["dst_addr"]
  version = fields["af"] if fields["af"] is not None else _form(dst) or _form(src)
  if fields["msm_id"] is None or fields["timestamp"] is None or version not in (4, 6):
    raise Bad
  if not 0 <= fields["timestamp"] <= LAST_SECOND:
    raise Bad
  if not (_fits(src, version) and _fits(dst, version)):
    raise Bad
  packets = value.get("result")
  if packets is None:
    if fields["rcvd"] == 0 or avg == -1:
      rtts = [-1.0]
    elif avg is None or not math.isfinite(avg):
      raise Bad
    else:
      rtts = [avg]
    duplicates = 0
  elif isinstance(packets, list):
    if not all(isinstance(p, dict) for p in packets):
      raise Bad
    if any(p["\0twice"] & {"rtt", "dup"} for p in packets):
      raise Bad
    dup = [_integer(p.get("dup")) is not None for p in packets]
    rtts = [_float(p.get("rtt")) for p in packets]
    if any(
      not d and r is not None and not math.isfinite(r) for d, r in zip(dup, rtts, strict=True)
    ):
      raise Bad
    duplicates = sum(dup)
    rtts = [-1.0 if r is None else r for d, r in zip(dup, rtts, strict=True) if not d]
  else:
    raise Bad  # an object where the packets' list belongs (a DNS result's)
  row = (fields["msm_id"], fields["timestamp"], src, dst, version)
  return [(*row, rtt, fields["prb_id"]) for rtt in rtts], duplicates


def _expect(lines: list[bytes]) -> Expected:
  """What ingest must give for these lines (or array elements), numbered from 1."""
  expected = Expected()
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      if _nesting(line.decode("utf-8", "replace")) > MAX_NESTING:
        raise Bad
      try:
        value = json.loads(line, object_pairs_hook=_pairs)
      except ValueError:
        raise Bad from None
      if not isinstance(value, dict):
        raise Bad
      if value.get("type") not in (None, "ping"):
        expected.other_types += 1
        continue
      rows, duplicates = _rows_of(value)
    except Bad:
      expected.bad.append(number)
      continue
    expected.rows += rows
    expected.duplicates += duplicates
  return expected


# --- the corpus ----------------------------------------------------------------------------


class Raw(str):
  """JSON text written as it is."""


class Pairs(list):
  """An object as (key, value) pairs: a key may come twice."""


def _encode(value, rng: random.Random) -> str:
  if isinstance(value, Raw):
    return value
  if isinstance(value, dict):
    value = Pairs(value.items())
  if isinstance(value, Pairs):
    comma, colon = rng.choice([(",", ":"), (", ", ": "), (" ,\t", " : ")])
    return "{" + comma.join(f"{json.dumps(k)}{colon}{_encode(v, rng)}" for k, v in value) + "}"
  if isinstance(value, list):
    return "[" + ", ".join(_encode(v, rng) for v in value) + "]"
  return json.dumps(value, ensure_ascii=rng.random() < 0.5)


SHAPES = [*MODERN, *FIRMWARE_0]
RETYPED = [None, True, 7.5, "7", "x", "", [1], {"v": 1}, Raw("NaN"), Raw("1e30")]
TIMESTAMPS = [0, -1, LAST_SECOND, LAST_SECOND + 1, 10**16, 2**62, Raw("1e16"), Raw("-1e16")]
TIMESTAMPS += [T0 + 0.5, float(T0 + 1), str(T0 + 2), Raw(f"{T0 + 3}e0")]
MSM_IDS = [2**63 - 1, 2**63, -(2**63), Raw("1e30"), 12.5, 13.5, "14", "015"]
RTTS = [Raw(t) for t in ("NaN", "-NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e-400")]
RTTS += [Raw(t) for t in ("5e-324", "-0", "1E+2", "123.456789012345678", "0.1")]
RTTS += ["12.5", "nan", "inf", "x", None, True, [1], -5]
AVGS = ["nan", "inf", "-inf", "-1", "58.042", "x", Raw("NaN"), Raw("1e400"), None, 1.25]
TEXTS = [
  "é and 😀",
  Raw('"\\u00e9"'),
  Raw('"\\ud83d\\ude00"'),  # a surrogate pair: one character
  Raw('"\\ud800"'),  # a lone surrogate
  Raw('"\\udc00 x"'),
  Raw('"a\\u0000b"'),
  Raw('"\\"},{\\\\"'),
  "],[ },{",
]
ADDRESSES = ["example.net", "", None, "2001:db8::1", "::ffff:1.2.3.4", "1.2.3.04", "é", 12]
ADDRESSES += ["193.0.14.129", "1.2.3.4.5", Raw('"77.1.2.\\u0034"'), "2a00:1::5", "::"]
PACKETS = [None, 5, {}, {"x": "*"}, {"rtt": 1.0, "dup": 1}, {"rtt": 2.0, "dup": True}]
PACKETS += [{"rtt": 3.0, "dup": 0}, {"rtt": 4.0, "dup": None}, {"dup": "x"}, {"rtt": {}}]
PACKETS += [Pairs([("rtt", 1.0), ("rtt", 2.0)]), Pairs([("dup", 1), ("dup", None)])]
TYPES = ["Ping", None, Raw('"p\\u0069ng"'), 5, "traceroute", "ping"]
NOT_OBJECTS = ["null", "5", '"s"', "[1, 2]", "true", "[]"]


# Values at the edges of what a row may hold, on otherwise clean results.
EDGES = [{"timestamp": t} for t in (-1, 0, LAST_SECOND, LAST_SECOND + 1, 2**62)]
EDGES += [{"af": 6}, {"af": 4}, {"from": "1.2.3.04"}, {"from": ""}, {"dst_addr": "::"}]
EDGES += [{"result": []}, {"result": [{"rtt": 1.0, "dup": 1}]}, {"result": [{"rtt": 1e22}]}]


def _nested(depth: int) -> Raw:
  return Raw("[" * depth + "]" * depth)


def _set(pairs: Pairs, key: str, value) -> None:
  """`key`'s value replaced (every time it comes), or the key added."""
  pairs[:] = [(k, v) for k, v in pairs if k != key] + [(key, value)]


def _mutate(rng: random.Random, shape: dict, index: int) -> Pairs:
  """`shape` with a fresh time and id, a few mutations, and its keys in any order."""
  pairs = Pairs(dict(shape, timestamp=T0 + index % 97, msm_id=index).items())
  for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
    key = rng.choice([k for k, _ in pairs])
    kind = rng.randrange(12)
    if kind == 0:  # a field dropped
      pairs = Pairs(p for p in pairs if p[0] != key)
    elif kind == 1:  # a field twice, the same value or another
      value = dict(pairs)[key] if rng.random() < 0.5 else rng.choice(RETYPED)
      pairs.insert(rng.randrange(len(pairs) + 1), (key, value))
    elif kind == 2:  # a field of another type
      _set(pairs, rng.choice([*TEXT, *INTEGER, "avg", "result"]), rng.choice(RETYPED))
    elif kind == 3:
      _set(pairs, "timestamp", rng.choice(TIMESTAMPS))
    elif kind == 4:
      _set(pairs, "msm_id", rng.choice(MSM_IDS))
    elif kind == 5 and isinstance(dict(pairs).get("result"), list):
      packets = list(dict(pairs)["result"])
      where = rng.randrange(len(packets) + 1)
      if rng.random() < 0.5 and packets and isinstance(packets[-1], dict):
        packets[-1] = dict(packets[-1], rtt=rng.choice(RTTS))
      else:
        packets.insert(where, rng.choice(PACKETS))
      _set(pairs, "result", packets)
    elif kind == 5:  # firmware 0: avg and rcvd
      _set(pairs, "avg", rng.choice(AVGS))
      if rng.random() < 0.4:
        _set(pairs, "rcvd", rng.choice(["0", 0, "3", None]))
    elif kind == 6:  # an extra field nested deep, around the limit and far past it
      _set(pairs, "nested", _nested(rng.choice([5, 70, MAX_NESTING - 1, MAX_NESTING, 2000])))
    elif kind == 7:  # unicode and escapes in a field no row reads
      _set(pairs, "msm_name", rng.choice(TEXTS))
    elif kind == 8:
      _set(pairs, rng.choice(["from", "src_addr", "dst_addr", "addr"]), rng.choice(ADDRESSES))
    elif kind == 9:
      _set(pairs, "af", rng.choice([4, 6, "6", 6.0, 5, True, None]))
    elif kind == 10:
      _set(pairs, "type", rng.choice(TYPES))
    else:  # numbers no row reads, in forms Python's json and DuckDB's reader both take
      _set(pairs, "fw", rng.choice([Raw("NaN"), Raw("-Infinity"), Raw("1e400"), 10**30]))
  rng.shuffle(pairs)
  return pairs


def _broken(rng: random.Random, text: str) -> str:
  """A line whose text no reader should take as a result, or that tests the JSON rules."""
  return rng.choice(
    [
      text[: rng.randrange(1, len(text))],  # truncated
      text[:-1] + ",}",  # a trailing comma
      text[:-1] + ', "x": 01}',  # a leading zero
      text[:-1] + ', "x": "a\tb"}',  # a raw control character in a string
      text[:-1] + ', "x": [1, 2,]}',
      text + " " + text,  # two objects on a line
    ]
  )


def _corpus(seed: int, results: int) -> tuple[list[bytes], list[bytes]]:
  """(lines of JSON lines, elements of a JSON array): the same mutated results, with blank
  and broken lines between the lines, and non-objects between the elements."""
  rng = random.Random(seed)
  lines, elements = [], []
  for index in range(results):
    text = _encode(_mutate(rng, rng.choice(SHAPES), index), rng)
    if rng.random() < 0.04:
      broken = _broken(rng, text)
      lines.append(broken)
      if broken.count("{") == broken.count("}") and broken.count('"') % 2 == 0:
        elements.append(broken)  # a balanced one cannot break the array around it
    else:
      lines.append(text)
      elements.append(text)
    if rng.random() < 0.03:
      lines.append(rng.choice(["", "  ", "\t", "\r"]) if rng.random() < 0.7 else "null")
    if rng.random() < 0.03:
      elements.append(rng.choice(NOT_OBJECTS))
  for edge, value in enumerate(EDGES):  # clean lines the scanner reads, one of each edge
    for shape in MODERN[:2]:
      text = _encode(dict(shape, msm_id=results + edge, **value), rng)
      lines.insert(rng.randrange(len(lines) + 1), text)
      elements.insert(rng.randrange(len(elements) + 1), text)
  if not any("\xff" in line for line in lines):
    lines.insert(rng.randrange(len(lines)), '{"msm_id": 1, "x": "\xff"}')
  encoded = [line.encode("latin-1" if "\xff" in line else "utf-8") for line in lines]
  return [line + b"\r" if rng.random() < 0.05 else line for line in encoded], [
    e.encode() for e in elements
  ]


@pytest.fixture(scope="module")
def corpus():
  return _corpus(seed=7, results=1000)


# --- the checks ----------------------------------------------------------------------------


def _array(elements: list[bytes], pretty: bool) -> bytes:
  separator = b",\n  " if pretty else b", "
  return (
    b"[\n  " + separator.join(elements) + b"\n]\n"
    if pretty
    else b"[" + separator.join(elements) + b"]"
  )


def _written(out_dir) -> list[tuple]:
  files = sorted(glob.glob(os.path.join(out_dir, "*.parquet")))
  table = pa.concat_tables([pq.read_table(f) for f in files])
  seconds = table.column("event_time").cast(pa.timestamp("s", tz="UTC")).cast(pa.int64())
  columns = [table.column(c).to_pylist() for c in ("msm_id",)]
  columns.append(seconds.to_pylist())
  columns += [table.column(c).to_pylist() for c in ("src_addr", "dst_addr", "ip_version")]
  columns += [table.column(c).to_pylist() for c in ("rtt", "prb_id")]
  return list(zip(*columns, strict=True))


def _in_time_order(rows: list[tuple]) -> list[tuple]:
  return sorted(rows, key=lambda row: row[1])  # stable: equal times keep the input order


def test_corpus_holds_every_case(corpus):
  lines, elements = corpus
  expected = _expect(lines)
  assert len(expected.rows) > 700 and len(expected.bad) > 150 and expected.other_types > 200
  assert expected.duplicates > 50 and len(_expect(elements).bad) > 150
  text = b"\n".join(lines)
  for case in (b"NaN", b"1e400", b"\\ud800", b"[" * 600, b"\xff", b"\r", b"\t\n", b"Ping"):
    assert case in text, case
  # Not vacuous for the scanner: it maps many lines itself and hands many over.
  kinds = scan.scan(text + b"\n")[0]
  assert (kinds == scan.PING).sum() > 150 and (kinds == scan.HANDED).sum() > 300


ENCODINGS = {  # every encoding once, and the array both on one line and pretty-printed
  "lines.jsonl": lambda lines, elements: b"\n".join(lines) + b"\n",
  "lines.jsonl.gz": lambda lines, elements: gzip.compress(b"\n".join(lines)),
  "lines.jsonl.bz2": lambda lines, elements: bz2.compress(b"\n".join(lines) + b"\n"),
  "array.json": lambda lines, elements: _array(elements, pretty=False),
  "array.json.zst": lambda lines, elements: pa.Codec("zstd").compress(
    _array(elements, pretty=True), asbytes=True
  ),
}


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_ingest_gives_the_independent_readers_rows_and_bad_lines(tmp_path, corpus, name):
  lines, elements = corpus
  array = name.startswith("array")
  expected = _expect(elements if array else lines)
  path = tmp_path / name
  path.write_bytes(ENCODINGS[name](lines, elements))
  # Small blocks (~16 lines: a few bad lines each, so the scanner maps them, not the reference
  # whole) and runs: lines cut between blocks, threads, and the merge of sorted runs.
  options = dict(block_bytes=4_000, run_rows=1_500, progress=False, readers=2)
  summary = ingest([str(path)], str(tmp_path / "out"), skip_bad=True, **options)
  assert _written(tmp_path / "out") == _in_time_order(expected.rows)
  for shard in glob.glob(str(tmp_path / "out" / "*.parquet")):  # what prepare accepts
    schema.validate_table(pq.read_table(shard), source=shard)
  counts = summary.counts
  assert counts.bad_lines == len(expected.bad)
  assert (counts.other_types, counts.duplicates) == (expected.other_types, expected.duplicates)
  unit = "array element" if array else "line"
  with pytest.raises(DataError, match=f"^{re.escape(str(path))}: {unit} {expected.bad[0]}: "):
    ingest([str(path)], str(tmp_path / "stopped"), **options)


def _named_bad_lines(lines: list[bytes], rows_of_block, first_line: int):
  """(rows, the bad line numbers) of `lines` as one block, read without --skip-bad: each bad
  line named is blanked and the block read again, until none is left."""
  lines, named = list(lines), []
  while True:
    data = b"\n".join(lines) + b"\n"
    block = reference.Block(data, first_line, len(lines), "line")
    try:
      table = rows_of_block(block, "corpus.json", reference.Counts(), False)
    except reference.BadLine as bad:
      assert bad.line not in named and first_line <= bad.line < first_line + len(lines)
      named.append(bad.line)
      lines[bad.line - first_line] = b""
      continue
    return table, named


@pytest.mark.parametrize("path", ["scanner", "reference"])
def test_both_paths_name_every_bad_line_the_independent_reader_names(corpus, path):
  lines = corpus[0]
  rows_of_block = scan.rows_of_block if path == "scanner" else reference.rows_of_block
  # Blocks of 16 lines: at most 8 runs of lines handed over, which the scanner hands to the
  # reference one run at a time (more, and it hands over the whole block).
  chunk = 16
  for start in range(0, len(lines), chunk):
    piece = lines[start : start + chunk]
    expected = _expect(piece)
    table, named = _named_bad_lines(piece, rows_of_block, start + 1)
    assert named == [start + n for n in expected.bad], start
    got = [
      (r["msm_id"], int(r["event_time"].timestamp()), r["src_addr"], r["dst_addr"])
      + (r["ip_version"], r["rtt"], r["prb_id"])
      for r in table.to_pylist()
    ]
    assert got == expected.rows, start


def test_the_nesting_screen_counts_no_bracket_inside_a_string():
  # Strings of brackets, escaped quotes and backslashes between brackets; and one long
  # string, which an alternation a character took a second and ~570 MB to skip.
  rng = random.Random(5)
  pieces = ["[", "]", "{", "}", " ", ","]
  for _ in range(3000):
    parts = []
    for _ in range(rng.randrange(12)):
      if rng.random() < 0.3:
        inner = "".join(rng.choice(["a", "[", "}", '\\"', "\\\\", "\\n"]) for _ in range(5))
        parts.append(f'"{inner}"')
      else:
        parts.append(rng.choice(pieces))
    text = "".join(parts)
    depth = deepest = 0
    in_string = escaped = False
    for c in text:  # as `_nesting` above, at any depth
      if in_string:
        escaped, in_string = (False, True) if escaped else (c == "\\", c != '"')
      elif c == '"':
        in_string = True
      else:
        depth += (c in "[{") - (c in "]}")
        deepest = max(deepest, depth)
    assert reference._nesting(text.encode()) == deepest, text
  assert reference._nesting(b'[{"a": "' + b"[" * 5_000_000 + b'"}]') == 2
