"""Every citation of the contract (`docs/spec.md §N`) in code, configs and docs names a section
that docs/spec.md has, and every relative link into it names an anchor it has."""

import re

from tests.helpers import REPO

SPEC = REPO / "docs" / "spec.md"
THIS = REPO / "tests" / "cli" / "test_spec_references.py"
SOURCES = ("maxtext_netdata", "tests", "benchmarks", "scripts", "configs", "docs")


def _sections() -> set[str]:
  return set(re.findall(r"^## §(\d+) ", SPEC.read_text(encoding="utf-8"), flags=re.M))


def _anchors() -> set[str]:
  """GitHub's anchors of the headings: lower case, punctuation dropped, spaces as hyphens."""
  headings = re.findall(r"^#+ (.+)$", SPEC.read_text(encoding="utf-8"), flags=re.M)
  return {re.sub(r"[^\w\- ]", "", h.lower()).strip().replace(" ", "-") for h in headings}


def _texts():
  for folder in SOURCES:
    for path in sorted((REPO / folder).rglob("*")):
      if path.suffix in (".py", ".md", ".yml", ".sh") and path not in (SPEC, THIS):
        yield path, path.read_text(encoding="utf-8")
  yield REPO / "README.md", (REPO / "README.md").read_text(encoding="utf-8")


def test_the_contract_has_its_six_sections():
  assert _sections() == {"1", "2", "3", "4", "5", "6"}


def test_every_citation_names_a_section_of_the_contract():
  sections, cited, wrong = _sections(), 0, []
  for path, text in _texts():
    assert "SPEC §" not in text, f"{path}: cite the contract as docs/spec.md §N"
    for match in re.finditer(r"docs/spec\.md §(\d+)(?:[–-]§(\d+))?", text):
      cited += 1
      wrong += [f"{path}: §{n}" for n in match.groups() if n and n not in sections]
  assert cited >= 10 and not wrong, wrong


def test_links_into_the_contract_name_its_anchors():
  anchors, wrong = _anchors(), []
  for path, text in _texts():
    for anchor in re.findall(r"\(spec\.md#([^)]+)\)", text):
      if anchor not in anchors:
        wrong.append(f"{path}: #{anchor}")
  assert not wrong, f"{wrong}; anchors: {sorted(anchors)}"
