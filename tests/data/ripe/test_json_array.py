"""A JSON array fed in pieces becomes one element a line (`json_array.ArrayToLines`)."""

import json
import random

import pytest

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


def _lines(text: bytes, rng: random.Random) -> list[bytes]:
  """`text` fed in random pieces: the lines of everything returned."""
  converter, out, at = ArrayToLines("a.json"), [], 0
  while at < len(text):
    size = rng.choice([1, 2, 7, 64, 1000, len(text)])
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


def test_an_element_that_is_not_an_object_shares_the_line_of_the_element_after_it():
  lines = _lines(b'[{"a": 1}, {"b": 2}, 3, {"c": "}"}]', random.Random(1))
  assert lines == [b'{"a": 1}', b' {"b": 2}', b' 3, {"c": "}"}']


def test_an_empty_array_gives_no_line():
  assert _lines(b"  [ \n ]  ", random.Random(2)) == []


@pytest.mark.parametrize(
  ("text", "message"),
  [
    (b'{"a": 1}', "not a JSON array"),
    (b'[{"a": 1}] [', "text after the end of the JSON array"),
    (b'[{"a": 1}, {"b": 2}', "the JSON array is not closed"),
    (b'[{"a": 1}}, {"b": 2}]', "not a well-formed JSON array"),
  ],
)
def test_a_broken_array_is_one_error_naming_the_file(text, message):
  with pytest.raises(DataError, match=f"^a.json: {message}"):
    _lines(text, random.Random(3))
