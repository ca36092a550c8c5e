"""The rooms of maxtext_netdata import one way (docs/architecture.md), read from the code."""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import room_graph  # noqa: E402

_BASE = {"config", "errors", "signals"}
# The stages of `data/` (docs/architecture.md); `data` itself is their shared `remote` module.
_DATA = {"data", "data/raw", "data/ripe", "data/ripe/scanner", "data/synthetic", "data/prepare"}
_DATA |= {"data/store"}
_BELOW_CONSUMERS = {"format", "kernels", "distributed", "input_pipeline", *_DATA, *_BASE}
# Room -> the rooms it may import, as each room's __init__ says. Flow: kernels <- format <-
# data's stages <- input_pipeline <- trainer/bench/maxtext <- cli; distributed beside data;
# bench also measures the trainer and MaxText.
ALLOWED = {
  "errors": set(),
  "signals": set(),
  "config": {"input_pipeline", "errors"},  # the dataset-type registry only (see below)
  "kernels": set(),
  "format": {"errors"},
  "distributed": _BASE,
  "data": {"errors"},
  "data/raw": {"data", "kernels", "errors"},
  "data/ripe/scanner": {"kernels"},
  "data/ripe": {"data/ripe/scanner", "data/raw", "data", "kernels", *_BASE},
  "data/synthetic": {"data/raw", *_BASE},
  "data/store": {"data", "kernels", "errors"},
  "data/prepare": {"data/raw", "data/store", "data", "format", "kernels", *_BASE},
  "input_pipeline": {"format", "kernels", "distributed", *_DATA, *_BASE},
  "trainer": _BELOW_CONSUMERS,
  "maxtext": _BELOW_CONSUMERS,
  "bench": {"trainer", "maxtext", *_BELOW_CONSUMERS},
  "cli": {"trainer", "maxtext", "bench", *_BELOW_CONSUMERS},
}


def _culprits(source_room: str, target_room: str) -> list[str]:
  return [
    f"{module} imports {target}"
    for module, targets in sorted(room_graph.module_edges().items())
    if room_graph.room_of(module) == source_room
    for target in sorted(targets)
    if room_graph.room_of(target) == target_room
  ]


def test_rooms_import_along_the_flow():
  edges = room_graph.room_edges()
  assert set(edges) <= set(ALLOWED), (
    f"rooms without a place in the flow: {set(edges) - set(ALLOWED)}"
  )
  against = [
    culprit
    for room, targets in sorted(edges.items())
    for target in sorted(targets - ALLOWED[room])
    for culprit in _culprits(room, target)
  ]
  assert not against, "imports against the flow: " + "; ".join(against)


def test_data_and_format_import_no_consumer():
  edges = room_graph.room_edges()
  for room in (*_DATA, "format", "kernels"):
    assert not edges.get(room, set()) & {"cli", "trainer", "bench", "maxtext", "input_pipeline"}, (
      room
    )


def _third_party_imports(path: Path) -> set[str]:
  """Top-level names of what `path` imports, at module level or inside functions."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    if isinstance(node, ast.Import):
      found.update(a.name.split(".")[0] for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      found.add(node.module.split(".")[0])
  return found


def test_nothing_before_the_input_pipeline_imports_jax():
  """Raw data, prepare and the store run on machines and in processes without JAX (a Beam
  worker, a Grain worker); the multi-process store check lives in `input_pipeline/`."""
  package = ROOT / "maxtext_netdata"
  for room in ("data", "format", "kernels"):
    for path in sorted((package / room).rglob("*.py")):
      jax_like = _third_party_imports(path) & {"jax", "jaxlib", "flax", "optax", "orbax"}
      assert not jax_like, f"{path.relative_to(ROOT)} imports {sorted(jax_like)}"


def _our_imports(path: Path) -> set[str]:
  """maxtext_netdata modules `path` imports with import statements (names in strings aside)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    if isinstance(node, ast.Import):
      found.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      found.update({node.module} | {f"{node.module}.{a.name}" for a in node.names})
  return {name for name in found if name.startswith("maxtext_netdata")}


def test_config_reads_only_the_leaf_registry():
  """config's one import against the flow stays light: the registry imports none of ours (its
  built-in factories are names resolved on use), and the input_pipeline package only it."""
  package = ROOT / "maxtext_netdata"
  for path in (package / "config").glob("*.py"):
    ours = {name for name in _our_imports(path) if not name.startswith("maxtext_netdata.config")}
    assert ours <= {
      "maxtext_netdata.errors",
      "maxtext_netdata.errors.ConfigError",
      "maxtext_netdata.input_pipeline",
      "maxtext_netdata.input_pipeline.registry",
    }, path
  assert _our_imports(package / "input_pipeline" / "registry.py") == set()
  module_level = [
    node
    for node in ast.parse((package / "input_pipeline" / "__init__.py").read_text()).body
    if isinstance(node, (ast.Import, ast.ImportFrom))
  ]
  assert all(node.module == "maxtext_netdata.input_pipeline.registry" for node in module_level)


def test_package_root_holds_at_most_four_modules_and_rooms_say_what_they_may_import():
  package = ROOT / "maxtext_netdata"
  root_modules = sorted(p.name for p in package.glob("*.py"))
  assert len(root_modules) <= 4, root_modules
  rooms = sorted(p.parent for p in package.glob("*/__init__.py"))
  assert len(rooms) >= 5
  for room in rooms:
    docstring = ast.get_docstring(ast.parse((room / "__init__.py").read_text()))
    assert docstring and "import" in docstring.lower(), (
      f"{room.name}/__init__.py: say what it may import"
    )


def test_room_map_drawing_is_current():
  text = room_graph.ARCHITECTURE.read_text(encoding="utf-8")
  assert text == room_graph.with_drawing(text), "run: python scripts/room_graph.py"
