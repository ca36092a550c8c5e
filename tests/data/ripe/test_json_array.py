"""A JSON array fed in pieces becomes one element a line (`json_array.ArrayToLines`)."""

import gc
import json
import random
import re

import numba
import numpy as np
import pytest

from maxtext_netdata.data.ripe import json_array
from maxtext_netdata.data.ripe.json_array import ArrayToLines
from maxtext_netdata.errors import DataError
from tests.data.ripe.test_differential import _corpus as differential_corpus

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


def _arrays(seed: int) -> list[bytes]:
  """JSON arrays of test_differential's mutated results and non-objects, as written, pretty
  printed and with this file's tricky strings, and broken ones of each kind."""
  rng = random.Random(seed)
  elements = differential_corpus(seed=seed, results=300)[1]
  tricky = [json.dumps(_element(rng, i)).encode() for i in range(50)]
  arrays = [
    b"[" + b",".join(elements) + b"]",
    b"[\n  " + b",\n  ".join(elements + tricky) + b"\n]\n",
    json.dumps([json.loads(t) for t in tricky], indent=2, ensure_ascii=False).encode(),
    b"[ ]",
    b"[1 , 2\t,\r\n3 ]",
    b"[{} , \x0c , {}, \x0b]",  # bytes Python's strip() takes as spaces: elements here
  ]
  for broken in [b",", b", ,", b"}", b"]", b' "open', b"\\", b'\\"', b"\\\\", b" ,]", b"[[,]"]:
    for _ in range(3):
      good = rng.choice(arrays[:3])
      at = rng.choice([m.end() for m in re.finditer(rb"[,{}\[\]\"\\ ]", good)])
      arrays.append(good[:at] + broken + good[at:])
  return arrays


@pytest.mark.parametrize("seed", [0, 1])
def test_the_stand_in_splits_as_the_kernel(seed):
  """`_split_numpy` against the compiled `_split` on every piece an `ArrayToLines` could give
  it (a piece starts after `[` or a top-level comma), ending anywhere: the same return and the
  same bytes written."""
  rng = random.Random(seed)
  ends_seen = set()
  for text in _arrays(seed):
    body = text[text.index(b"[") + 1 :]
    starts = [0] + [m.end() for m in re.finditer(rb",", body)]
    for _ in range(150):
      start = rng.choice(starts)
      end = min(len(body), start + rng.choice([0, 1, 3, 40, 700, 5000, 10**6]))
      buf = np.frombuffer(body[start:end], np.uint8)
      for after_comma in (False, True):
        compiled, stand_in = np.empty_like(buf), np.empty_like(buf)
        expected = tuple(json_array._split(buf, compiled, after_comma))
        assert json_array._split_numpy(buf, stand_in, after_comma) == expected, body[start:end]
        assert (stand_in == compiled).all(), body[start:end]
        ends_seen.add(min(expected[1], 0))
  assert ends_seen == {json_array._MALFORMED, json_array._EMPTY, -1, 0}


@pytest.mark.parametrize("seed", [2, 3])
def test_arrays_split_while_the_kernel_compiles_are_the_same(monkeypatch, seed):
  """`ArrayToLines` with the stand-in (the kernel's compile in progress) against the kernel:
  the same lines of every array fed in random pieces, the same error of every broken one."""

  def lines_or_error(text, pending):
    monkeypatch.setattr(json_array.warmup, "pending", lambda name: pending)
    try:
      return _lines(text, random.Random(seed), piece_sizes=(5, 300, 4096))
    except DataError as e:
      return str(e)

  errors = 0
  for text in _arrays(seed):
    expected = lines_or_error(text, False)
    errors += isinstance(expected, str)
    assert lines_or_error(text, True) == expected
  assert 5 < errors < len(_arrays(seed)) - 3
