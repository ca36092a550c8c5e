"""The compiled scanner (data.ripe.scan) against the reference path (DuckDB's reader, Arrow).

Every line the scanner maps itself must give what the reference gives for it (rows, values,
order, counts); every other line must be handed over. Lines of every real shape are mutated
in the ways real and hostile input differs: keys in any order, nested values before and
after the needed keys, escapes and unicode in needed and other strings, whitespace, numbers
in every JSON form, broken and truncated lines.
"""

import dataclasses
import glob
import gzip
import json
import random
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from maxtext_netdata.data.ripe import reference, scan
from maxtext_netdata.data.ripe.ingest import ingest
from maxtext_netdata.data.ripe.scanner.kernel import scan_block
from maxtext_netdata.data.synthetic.generate import generate
from tests.helpers.ripe_results import FIRMWARE_0, MODERN, T0


class Raw(str):
  """JSON text written as it is (an escape, a number's form), not encoded again."""


def _encode(value, separators) -> str:
  comma, colon = separators
  if isinstance(value, Raw):
    return value
  if isinstance(value, dict):
    items = (f"{json.dumps(k)}{colon}{_encode(v, separators)}" for k, v in value.items())
    return "{" + comma.join(items) + "}"
  if isinstance(value, list):
    return "[" + comma.join(_encode(v, separators) for v in value) + "]"
  return json.dumps(value, ensure_ascii=False)


BASE = [
  *MODERN,
  *FIRMWARE_0,
  {"msm_id": 1002, "prb_id": 9, "timestamp": T0 + 7, "addr": "8.8.8.8", "result": [{"rtt": 20}]},
  {"type": "ping", "msm_id": 3, "timestamp": T0, "af": 5, "result": []},
  {"type": "ping", "msm_id": 3, "result": [{"rtt": 1}], "af": 4},
]
NESTED = [{"a": [1, {"b": [[], {}, None]}], "c": "x"}, [[["deep"]]], {"k": {"k": {"k": True}}}]
RTT_TEXTS = [Raw(t) for t in ("1.234", "12", "1e-3", "1E+2", "-0", "0.0", "-1", "5e22")]
RTT_TEXTS += [Raw("123.456789012345678"), Raw("1.5e100"), "1.5", None]
VALUES = {
  "from": [Raw('"77.1.2.\\u0034"'), "é", "", None, 12, "1.2.3.4"],
  "dst_addr": ["", None, "::1", Raw('"1.2.3.\\\\4"'), "2001:db8::é", Raw('"::\\/1"')],
  "af": [4, 6, None, "4", Raw("4.0"), 5, True, Raw("4e0")],
  "msm_id": [7, -7, "7", 7.5, 12345678901234567890, None],
  "timestamp": [T0, "1751328000", 1.7e9, None],
  "prb_id": [None, 0, "9"],
  "type": ["ping", "Ping", Raw('"p\\u0069ng"'), None, 1, "http"],
  "avg": [1.5, "1.5", "x", None],
  "rcvd": [1, "1", 1.5],
}
BROKEN = [
  "",
  "   ",
  "\t\r",
  "\x0b",
  "{}",
  "[]",
  "null",
  "not json",
  '{"type": "ping",}',
  '{"type": "ping"} {"type": "ping"}',
  '{"msm_id": 01, "timestamp": 1, "af": 4, "result": []}',
  '{"msm_id": 1, "timestamp": 1, "af": 4, "result": [], "x": NaN}',
  '{"msm_id": 1, "timestamp": 1, "af": 4, "result": [], "x": [1, 2,]}',
  '{"msm_id": 1, "msm_id": 2, "timestamp": 1, "af": 4, "result": []}',
  '{"m\\u0073m_id": 1, "timestamp": 1, "af": 4, "result": []}',
  '{"msm_id": 1, "timestamp": 1, "af": 4, "result": [{"rtt": 1, "rtt": 2}]}',
  '{"msm_id": 1, "timestamp": 1, "af": 4, "result": [{"rtt": 1}, 1]}',
  '{"msm_id": 1, "timestamp": 1, "af": 4, "result": [{"rtt": 1}, null]}',
  '{"msm_id": 1, "timestamp": 1, "af": 4, "result": [{"rtt": "1.5"}, {"dup": true}]}',
  '{"msm_id": 1, "timestamp": 1, "af": 4, "result": [{"rtt": null}, {"dup": null}, {"dup": 0}]}',
  '{"msm_id": 1, "timestamp": 1, "af": 4, "result": [{"rtt": 1e400}]}',
  '{"msm_id": 1, "timestamp": 1, "af": 4, "result": [], "x": "\\ud800"}',
  '{"msm_id": 1, "timestamp": 1, "af": 4, "result": [], "x": "a\x01b"}',
  '{"msm_id": 1, "timestamp": 1, "af": 4, "result": [], "x": "\\u0000"}',
  '{"msm_id": 1, "timestamp": 1, "af": 4, "result": [], "x": "\\q"}',
  '{"msm_id": 1, "timestamp": 1, "af": 4, "result": [{}], "x": ' + "[" * 70 + "]" * 70 + "}",
  '{"msm_id": 1, "timestamp": 1, "af": 4, "result": [{}], "x": ' + "[" * 60 + "]" * 60 + "}",
  '{"msm_id": 1, "timestamp": 1, "af": 4, "result": [], "x": tru}',
  '{"msm_id": 1, "timestamp": 1, "af": 4, "result": [], "x": -}',
  '{"msm_id": 1, "timestamp": 1, "af": 4, "result": [], "x": 1.}',
  '{"msm_id": 1, "timestamp": 1, "af": 4, "result": [], "x": .5}',
  '{"msm_id":1,"timestamp":1,"af":4,"result":[{"rtt":1}]}\r',
  '\t{ "msm_id" :1 ,\t"timestamp": 1, "af" : 4 , "result" : [ { "rtt" : 2.5 } , { } ] } ',
]


def _mutated(rng: random.Random, result: dict) -> str:
  """`result` as one JSON line, changed in the ways real and hostile input is."""
  result = dict(result)
  for key, values in VALUES.items():
    if rng.random() < 0.15:
      result[key] = rng.choice(values)
  if isinstance(result.get("result"), list) and rng.random() < 0.5:
    result["result"] = [
      dict(p, rtt=rng.choice(RTT_TEXTS)) if "rtt" in p and rng.random() < 0.5 else p
      for p in result["result"]
    ]
  items = list(result.items())
  rng.shuffle(items)
  for _ in range(rng.randrange(3)):  # nested values anywhere among the needed keys
    items.insert(rng.randrange(len(items) + 1), (f"extra{rng.randrange(99)}", rng.choice(NESTED)))
  if rng.random() < 0.1:
    name = rng.choice([Raw('"a \\" \\u00e9 \\n \\\\"'), "é"])
    items.insert(rng.randrange(len(items) + 1), ("msm_name", name))
  separators = rng.choice([(",", ":"), (", ", ": "), (" ,\t", " :  ")])
  line = _encode(dict(items), separators)
  if rng.random() < 0.05:
    line = line[: rng.randrange(1, len(line))]  # truncated
  return line


def _hostile_lines(count: int, seed: int) -> list[bytes]:
  rng = random.Random(seed)
  lines = [_mutated(rng, rng.choice(BASE)) for _ in range(count)] + BROKEN
  rng.shuffle(lines)
  return [line.encode() for line in lines]


def _generated_lines(tmp_path, rows: int) -> list[bytes]:
  [path] = generate(str(tmp_path / "json"), rows=rows, shards=1, seed=5, fmt="ripe-json")
  with open(path, "rb") as f:
    return f.read().splitlines()


def _reference(lines: list[bytes], skip_bad: bool):
  counts = reference.Counts()
  data = b"\n".join(lines) + b"\n"
  table = reference.rows_of_block(
    reference.Block(data, 1, len(lines), "line"), "ref.json", counts, skip_bad
  )
  return table, counts


def _check_taken_lines(lines: list[bytes]) -> np.ndarray:
  """Assert the scanner's rows of the lines it takes are the reference's; its kinds."""
  data = b"\n".join(lines) + b"\n"
  kinds, _, _, dups, got = scan.scan(data)
  taken = [line for line, kind in zip(lines, kinds, strict=True) if kind in (scan.PING, scan.OTHER)]
  # Raises BadLine if the scanner took a line the reference finds bad.
  expected, counts = _reference(taken, skip_bad=False)
  assert got.equals(expected), (got.to_pylist()[:5], expected.to_pylist()[:5])
  assert counts.results == int(np.isin(kinds, [scan.PING, scan.OTHER]).sum())
  assert counts.other_types == int((kinds == scan.OTHER).sum())
  assert counts.duplicates == dups.sum() and counts.rows == got.num_rows
  return kinds


def test_scanner_takes_only_lines_it_maps_as_the_reference_does():
  lines = _hostile_lines(3000, seed=1)
  kinds = _check_taken_lines(lines)
  # Not vacuous: the scanner takes most mutated lines and hands many over.
  assert (kinds == scan.PING).sum() > 300 and (kinds == scan.OTHER).sum() > 300
  assert (kinds == scan.HANDED).sum() > 300
  by_line = dict(zip(lines, kinds, strict=True))
  assert by_line[BROKEN[-1].encode()] == scan.PING  # spaces and tabs everywhere
  assert by_line[BROKEN[-2].encode()] == scan.PING  # CRLF line end
  assert by_line[BROKEN[-7].encode()] == scan.PING  # 60 deep in another field
  assert by_line[BROKEN[-8].encode()] == scan.HANDED  # 70 deep
  escaped = [line for line in lines if b'"a \\"' in line]  # escapes in another field
  assert any(by_line[line] == scan.PING for line in escaped)
  assert any(by_line[line] == scan.PING for line in lines if b'"rtt":1E+2' in line)


def test_every_float_form_converts_as_the_reference_does():
  rng = random.Random(2)
  texts = [repr(rng.uniform(0, 300)) for _ in range(500)]
  texts += [repr(rng.lognormvariate(0, 8)) for _ in range(500)]
  texts += [
    f"{rng.randrange(10 ** rng.randrange(1, 24))}.{rng.randrange(10**6)}e{rng.randrange(-30, 30)}"
    for _ in range(500)
  ]
  texts += ["0.1", "0.30000000000000004", "9007199254740993", "2.2250738585072014e-08"]
  lines = [
    b'{"msm_id":1,"timestamp":%d,"af":4,"result":[{"rtt":%s}]}' % (T0 + i, t.encode())
    for i, t in enumerate(texts)
  ]
  kinds = _check_taken_lines(lines)
  assert (kinds == scan.PING).sum() > 1400


def _block(lines: list[bytes]) -> reference.Block:
  return reference.Block(b"\n".join(lines) + b"\n", 1, len(lines), "line")


def _rows_or_error(rows_of_block, block, skip_bad):
  counts = reference.Counts()
  try:
    return rows_of_block(block, "in.json", counts, skip_bad), counts
  except reference.BadLine as e:
    return str(e), None


def test_blocks_give_the_reference_rows_and_counts(tmp_path):
  lines = _generated_lines(tmp_path, 2000) + _hostile_lines(300, seed=3)
  for skip_bad in (True, False):
    for size in (7, 40, len(lines)):  # few handed-over runs per block, and many (all handed)
      for start in range(0, len(lines), size):
        piece = lines[start : start + size]
        data = b"\n".join(piece) + b"\n"
        block = reference.Block(data, 10 + start, len(piece), "line")
        got = _rows_or_error(scan.rows_of_block, block, skip_bad)
        expected = _rows_or_error(reference.rows_of_block, block, skip_bad)
        if isinstance(expected[0], str):
          assert got == expected
        else:
          assert got[0].equals(expected[0]) and got[1] == expected[1]


@pytest.mark.parametrize("line", [b'{"msm_id": 1, "af": 4, "result": []}', b"[1]", b"{"])
def test_a_bad_line_is_reported_by_the_reference_with_its_number(line):
  good = b'{"msm_id":1,"timestamp":5,"af":4,"result":[{"rtt":1.5}]}'
  data = b"\n".join([good, good, line, good]) + b"\n"
  block = reference.Block(data, 41, 4, "line")
  with pytest.raises(reference.BadLine, match=r"^in.json: line 43: "):
    scan.rows_of_block(block, "in.json", reference.Counts(), skip_bad=False)
  counts = reference.Counts()
  table = scan.rows_of_block(block, "in.json", counts, skip_bad=True)
  # A line DuckDB reads is a result even if it gives no row; one that is not JSON is not.
  results = 4 if line.startswith(b'{"') else 3
  assert table.num_rows == 3 and counts.bad_lines == 1 and counts.results == results


def test_plain_lines_read_in_place_give_the_rows_of_the_same_lines_compressed(tmp_path):
  # CRLF ends, blank lines, a line longer than the block, no newline at the end: the plain
  # reader (blocks cut at their last newline, the next read from there) against the
  # compressed one (pieces joined in memory).
  long_line = json.dumps(dict(BASE[0], msm_name="x" * 300, timestamp=T0 + 1))
  text = "\r\n".join(
    [json.dumps(dict(BASE[i % 3], timestamp=T0 + i)) for i in range(40)] + ["", "  ", long_line]
  )
  text += "\n" + json.dumps(dict(BASE[1], timestamp=T0 + 99))  # no newline at the end
  plain = tmp_path / "plain.json"
  plain.write_bytes(text.encode())
  packed = tmp_path / "packed.json.gz"
  packed.write_bytes(gzip.compress(text.encode()))
  outs = []
  for path in (plain, packed):
    out = str(tmp_path / f"out-{path.name}")
    summary = ingest([str(path)], out, block_bytes=128, progress=False)
    outs.append((pq.read_table(glob.glob(f"{out}/*.parquet")[0]), summary.counts))
  assert outs[0][0].equals(outs[1][0]) and outs[0][1] == outs[1][1]
  assert outs[0][1].results == 42 and outs[0][0].num_rows > 42


def test_results_of_many_packets_with_long_addresses_give_the_reference_rows():
  # A result's src and dst are written once per row: 300 packets repeat a 39-character
  # IPv6 address 300 times, more than the line's bytes (the scanner's text buffer grows).
  src, dst = "2001:0db8:85a3:0000:0000:8a2e:0370:7334", "2001:0db8:85a3:0000:0000:8a2e:0370:7335"
  packets = [{"x": "*"} if i % 3 == 2 else {"rtt": 1.5 + i} for i in range(300)]
  many = dict(msm_id=7, timestamp=T0, af=6, prb_id=9, type="ping", result=packets)
  lines = [
    json.dumps(dict(many, **{"from": src, "dst_addr": dst}), separators=(",", ":")).encode(),
    json.dumps(dict(many, timestamp=T0 + 1, src_addr=dst, addr=src)).encode(),
  ]
  kinds = _check_taken_lines(lines)
  assert (kinds == scan.PING).all()
  for line in lines:  # alone in its block too: the buffer starts at the line's size
    _check_taken_lines([line])


def test_the_text_buffer_grows_with_the_texts_not_with_the_rows():
  # A result of 20,000 packets: the rows grow ~12 times from three; each time the text buffer
  # doubled with them (546 MB for the 270 KB of texts its 20,000 rows repeat).
  packets = [{"x": "*"} if i % 3 == 2 else {"rtt": 1.5 + i % 7} for i in range(20_000)]
  result = dict(msm_id=7, timestamp=T0, af=4, prb_id=9, type="ping", result=packets)
  line = json.dumps(dict(result, src_addr="192.0.2.1", dst_addr="198.51.100.17")).encode()
  _check_taken_lines([line])
  scanned = scan_block(np.frombuffer(line + b"\n", np.uint8), 1)
  rows, offsets, texts = scanned[4], scanned[9], scanned[10]
  assert rows == 20_000 and offsets[:, rows].tolist() == [9 * rows, 13 * rows]
  assert texts.nbytes <= 4 * (offsets[:, rows].max() + len(line)) * 2


_GUARD_PAGE_SCAN = r"""
import ctypes, mmap, sys
import numpy as np
from maxtext_netdata.data.ripe.scanner.kernel import scan_block

# The page after the block is made unreadable: a read past the block's newline is a SIGSEGV.
size = mmap.PAGESIZE
area = mmap.mmap(-1, 2 * size)
start = ctypes.addressof(ctypes.c_char.from_buffer(area))
libc = ctypes.CDLL(None, use_errno=True)
if libc.mprotect(ctypes.c_void_p(start + size), ctypes.c_size_t(size), 0) != 0:  # PROT_NONE
  sys.exit(f"mprotect failed: errno {ctypes.get_errno()}")
page = np.frombuffer(area, np.uint8, size)
scans = 0
for line in sys.stdin.buffer.read().split(b"\n"):
  for cut in range(len(line) + 1):
    text = line[:cut] + b"\n"
    page[size - len(text) :] = np.frombuffer(text, np.uint8)
    block = page[size - len(text) :]
    block.flags.writeable = False
    scan_block(block, 1)
    scans += 1
print(scans)
"""


def test_no_prefix_of_any_line_makes_the_scanner_read_past_its_newline():
  # The JSON pieces read bytes unchecked up to the block's closing newline: every prefix of
  # every line shape, ended by the newline at the very end of readable memory.
  lines = [_encode(r, (",", ":")).encode() for r in BASE] + [b.encode() for b in BROKEN]
  lines += _hostile_lines(200, seed=4)
  run = subprocess.run(
    [sys.executable, "-c", _GUARD_PAGE_SCAN],
    input=b"\n".join(line for line in lines if b"\n" not in line),
    capture_output=True,
    timeout=300,
  )
  assert run.returncode == 0, (run.returncode, run.stderr.decode()[-2000:])
  assert int(run.stdout) > 30_000


def test_the_reference_judges_each_line_whatever_its_neighbours():
  # DuckDB's reader takes a trailing comma, `inf` and `null` that `json.loads` refuses: read
  # whole a block made such a line a result, read by halves (any other bad line in the
  # block) not. The scanner hands runs of lines to the reference, so both must agree.
  lines = _hostile_lines(400, seed=11) + [
    b'{"msm_id":1,"timestamp":1,"af":4,"result":[{"rtt":1.5},]}',
    b'{"msm_id":1,"timestamp":1,"af":4,"result":[{"rtt":inf}]}',
    b"null",
  ]
  alone = {line: _rows_or_error(reference.rows_of_block, _block([line]), True) for line in lines}
  rng = random.Random(12)
  for _ in range(80):
    block = rng.sample(lines, 7) + lines[-3:]
    table, counts = _rows_or_error(reference.rows_of_block, _block(block), True)
    assert table.equals(pa.concat_tables([alone[line][0] for line in block]))
    for field in dataclasses.fields(counts):
      assert getattr(counts, field.name) == sum(
        getattr(alone[line][1], field.name) for line in block
      ), field.name
