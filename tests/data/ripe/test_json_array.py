"""A JSON array fed in pieces becomes one element a line (`json_array.ArrayToLines`)."""

import gc
import json
import random

import numba
import pytest

from maxtext_netdata.data.ripe import json_array
from maxtext_netdata.data.ripe.json_array import ArrayToLines
from maxtext_netdata.errors import DataError

TRICKY = [
  'a "quoted" },{ "x": [1, 2] }',
  'one " quote },{ [',  # an odd number of escaped quotes: a missed escape ends the string
  '\\"},{',
  "back\\slash\\",
  "\\",
  "é and \u2028",
  "],[",
  "",
]


def _element(rng: random.Random, index: int) -> dict:
  element = {"msm_id": index, "timestamp": 1_751_328_000 + index}
  for _ in range(rng.randrange(4)):
    element[rng.choice(["msm_name", "dst_name", "note"])] = rng.choice(TRICKY)
  if rng.random() < 0.5:
    element["result"] = [{"rtt": rng.random()}, {"x": "*"}, {"nested": [[{}], []]}]
  return element


def _lines(text: bytes, rng: random.Random, piece_sizes=(1, 2, 7, 64, 1000)) -> list[bytes]:
  """`text` fed in random pieces: the lines of everything returned."""
  converter, out, at = ArrayToLines("a.json"), [], 0
  while at < len(text):
    size = rng.choice([*piece_sizes, len(text)])
    out.append(bytes(converter.feed(text[at : at + size], last=False)))
    at += size
  out.append(bytes(converter.feed(b"", last=True)))
  joined = b"".join(out)
  assert not joined or joined.endswith(b"\n")
  return [line for line in joined.split(b"\n") if line.strip()]


@pytest.mark.parametrize("indent", [None, 2])
def test_every_element_comes_out_whole_on_its_own_line(indent):
  rng = random.Random(indent or 0)
  elements = [_element(rng, i) for i in range(300)]
  text = json.dumps(elements, indent=indent, ensure_ascii=bool(indent)).encode()
  for _ in range(5):
    lines = _lines(text, rng)
    assert [json.loads(line) for line in lines] == elements


def test_every_element_gets_its_own_line_whatever_it_is():
  lines = _lines(b'[{"a": 1}, null, {"b": 2}, 5, "s", [1, {}], {"c": "}"}]', random.Random(1))
  assert lines == [b'{"a": 1}', b" null", b' {"b": 2}', b" 5", b' "s"', b" [1, {}]", b' {"c": "}"}']


def test_the_first_array_on_a_fresh_compile_is_split(monkeypatch):
  # The first call of a numba function keeps its arguments alive in a reference cycle of
  # the compiler until the cyclic collector runs: a bytearray viewed by the call and then
  # shortened raised BufferError on a machine's first JSON array (a file ending in a newline).
  monkeypatch.setattr(json_array, "_split", numba.njit(nogil=True)(json_array._split.py_func))
  gc.disable()
  try:
    lines = _lines(b'[{"a": 1}, {"b": 2}]\n', random.Random(4), piece_sizes=[1000])
  finally:
    gc.enable()
  assert lines == [b'{"a": 1}', b' {"b": 2}']


def test_an_empty_array_gives_no_line():
  assert _lines(b"  [ \n ]  ", random.Random(2)) == []


@pytest.mark.parametrize(
  ("text", "message"),
  [
    (b'{"a": 1}', "not a JSON array"),
    (b'[{"a": 1}] [', "text after the end of the JSON array"),
    (b'[{"a": 1}, {"b": 2}', "the JSON array is not closed"),
    (b'[{"a": 1}}, {"b": 2}]', "not a well-formed JSON array"),
    (b'[{"a": 1}, {"b": 2},]', r"array element 3: no value \(a comma after"),
    (b'[{"a": 1},, {"b": 2}]', "array element 2: no value"),
    (b"[ , {}]", "array element 1: no value"),
  ],
)
def test_a_broken_array_is_one_error_naming_the_file(text, message):
  with pytest.raises(DataError, match=f"^a.json: {message}"):
    _lines(text, random.Random(3))
