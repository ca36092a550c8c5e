"""The compiled address parser against the C library's `inet_pton`, on texts of every form.

The reference is `socket.inet_pton` (glibc's, which the parser ports), called one text at a
time; the texts are real addresses in every spelling plus mutations of them, so that each
of glibc's accept/reject rules is met by valid and invalid neighbours.
"""

import socket

import numpy as np
import pyarrow as pa
import pytest

from maxtext_netdata.data.raw import ip_text


def _reference(text: str | None) -> tuple[bytes, int]:
  """(16 bytes, family) by socket.inet_pton: ":" picks IPv6; -1 empty, 0 invalid."""
  if not text:
    return bytes(16), -1
  try:
    if ":" in text:
      return socket.inet_pton(socket.AF_INET6, text), 6
    return socket.inet_pton(socket.AF_INET, text) + bytes(12), 4
  except (OSError, ValueError):
    return bytes(16), 0


def _spellings(rng: np.random.Generator) -> list[str]:
  """One random address in the spellings that real data and hand-written text use."""
  v4 = socket.inet_ntop(socket.AF_INET, rng.bytes(4))
  raw = bytearray(rng.bytes(16))
  if rng.random() < 0.5:  # runs of zero groups, so that "::" appears in several places
    start = int(rng.integers(0, 8))
    stop = min(8, start + int(rng.integers(1, 8)))
    raw[2 * start : 2 * stop] = bytes(2 * (stop - start))
  v6 = socket.inet_ntop(socket.AF_INET6, bytes(raw))
  groups = [f"{int.from_bytes(raw[i : i + 2], 'big'):x}" for i in range(0, 16, 2)]
  mapped = socket.inet_ntop(socket.AF_INET6, bytes(10) + b"\xff\xff" + rng.bytes(4))
  embedded = ":".join(groups[:6]) + ":" + v4  # full form with IPv4 at the end
  return [
    v4,
    v6,
    v6.upper(),
    ":".join(groups),  # no "::"
    ":".join(g.zfill(4) for g in groups),  # leading zeros, 4 digits a group
    mapped,
    embedded,
    "::" + v4,
    "::ffff:" + v4,
    ":".join(groups[:3]) + "::" + v4,
    ".".join(f"{b:03d}" for b in rng.bytes(4)),  # leading zeros in IPv4 (glibc rejects)
  ]


_ALPHABET = list("0123456789abcdefABCDEFgG:.x /%") + ["\x00", "é", "::", "00", "256"]


def _mutations(text: str, rng: np.random.Generator) -> list[str]:
  """A character deleted, replaced, inserted; a piece doubled; the text cut."""
  if not text:
    return []
  at = int(rng.integers(0, len(text)))
  other = _ALPHABET[int(rng.integers(0, len(_ALPHABET)))]
  return [
    text[:at] + text[at + 1 :],
    text[:at] + other + text[at + 1 :],
    text[:at] + other + text[at:],
    text[:at] + text[at:] + text[at:],
    text[:at],
  ]


def _corpus(count: int, seed: int = 0) -> list[str]:
  rng = np.random.default_rng(seed)
  texts = ["", "::", ":::", ":", "1::", "::1", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8:9"]
  texts += ["1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8", "1:2:3:4:5:6::7:8", "1.2.3.4", "0.0.0.0"]
  texts += ["255.255.255.255", "1.2.3.04", "1..2.3", ".1.2.3.4", "1.2.3.4.", "12345::"]
  texts += ["::1.2.3.4:5", "1:2:3:4:5:6:1.2.3.4", "1:2:3:4:5:6:7:1.2.3.4", "::ffff:1.2.3"]
  while len(texts) < count:
    for text in _spellings(rng):
      texts.append(text)
      for mutated in _mutations(text, rng):
        texts.append(mutated)
        texts.extend(_mutations(mutated, rng)[:2])
    length = int(rng.integers(1, 12))
    texts.append("".join(_ALPHABET[i] for i in rng.integers(0, len(_ALPHABET), length)))
  return texts


def test_parser_matches_inet_pton_on_every_form_and_mutation():
  texts = _corpus(60_000)
  parsed, family = ip_text.parse(pa.array(texts, pa.string()))
  expected = [_reference(text) for text in texts]
  wrong = [
    (text, want_family, int(got_family))
    for text, (want_bytes, want_family), got_bytes, got_family in zip(
      texts, expected, parsed, family, strict=True
    )
    if want_family != got_family or want_bytes != got_bytes.tobytes()
  ]
  assert not wrong, wrong[:10]
  # The corpus reaches every outcome, in numbers: not a test of invalid text alone.
  counts = np.bincount(np.asarray(family, np.int64) + 1, minlength=8)
  assert counts[0] >= 100 and counts[1] > 20_000 and counts[5] > 1_000 and counts[7] > 10_000


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()])
def test_sliced_arrays_nulls_and_spare_entries(kind):
  texts = ["9.9.9.9", "10.0.0.1", None, "", "2001:db8::1", "bad", "::ffff:1.2.3.4"]
  array = pa.array(texts, kind).slice(1)  # an offset into the buffers
  parsed, family = ip_text.parse(array, spare=2)
  assert family.tolist() == [4, -1, -1, 6, 0, 6, -1, -1]
  assert parsed[0, :4].tolist() == [10, 0, 0, 1] and not parsed[0, 4:].any()
  assert parsed[3].tobytes() == socket.inet_pton(socket.AF_INET6, "2001:db8::1")
  assert not parsed[[1, 2, 4, 6, 7]].any()


def test_empty_array():
  parsed, family = ip_text.parse(pa.array([], pa.string()), spare=1)
  assert parsed.shape == (1, 16) and family.tolist() == [-1]
