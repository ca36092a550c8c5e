"""Every third-party import of the package is declared in setup.py, with a range that holds the
exact version constraints.txt pins (the one tested)."""

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def _imported_modules() -> dict[str, str]:
  """Top-level name of every absolute import under maxtext_netdata/ -> one file importing it."""
  found = {}
  for path in sorted((ROOT / "maxtext_netdata").rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
      elif isinstance(node, ast.ImportFrom) and node.level == 0:
        names = [node.module]
      else:
        continue
      for name in names:
        found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
  return found


def _declared() -> dict[str, Requirement]:
  """setup.py's INSTALL_REQUIRES and every extra, read without running setup()."""
  tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
  values = {
    target.id: ast.literal_eval(node.value)
    for node in tree.body
    if isinstance(node, ast.Assign)
    for target in node.targets
    if isinstance(target, ast.Name) and target.id in ("INSTALL_REQUIRES", "EXTRAS_REQUIRE")
  }
  texts = values["INSTALL_REQUIRES"] + [
    r for extra in values["EXTRAS_REQUIRE"].values() for r in extra
  ]
  return {canonicalize_name(r.name): r for r in map(Requirement, texts)}


def _pins() -> dict[str, str]:
  text = (ROOT / "constraints.txt").read_text(encoding="utf-8")
  return {
    canonicalize_name(name): version
    for name, version in re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)", text, flags=re.MULTILINE)
  }


def test_every_import_is_declared():
  distributions = importlib.metadata.packages_distributions()
  declared = _declared()
  missing = []
  for module, path in sorted(_imported_modules().items()):
    if module in sys.stdlib_module_names or module == "maxtext_netdata":
      continue
    names = {canonicalize_name(d) for d in distributions.get(module, [module])}
    if not names & set(declared):
      missing.append(f"{module} (imported by {path}; distribution {', '.join(sorted(names))})")
  assert not missing, "imported but not in setup.py: " + "; ".join(missing)


def test_every_declared_range_holds_its_pin():
  pins = _pins()
  for name, requirement in _declared().items():
    assert name in pins, f"{requirement} is not pinned in constraints.txt"
    assert requirement.specifier.contains(pins[name], prereleases=True), (
      f"constraints.txt pins {name}=={pins[name]}, outside setup.py's {requirement}"
    )
