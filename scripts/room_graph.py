"""The room map of maxtext_netdata, read from its imports: `python scripts/room_graph.py`
rewrites the Mermaid flowchart between the `rooms` markers of docs/architecture.md.

A room is a subpackage of maxtext_netdata (or a module at its root: config, errors, signals); inside
`data/`, whose stages are rooms of their own, a room is the deepest subpackage a module sits in
(`data/prepare`, `data/ripe/scanner`; `data` itself holds `remote`). An edge
A --> B means some module of room A imports room B: at module level, inside a function (a lazy
import is still a dependency) or by name ("maxtext_netdata.data.prepare", "module:function",
as the CLI's command table and the dataset-type registry do). `if __name__ == "__main__":`
blocks are entry points and do not count. tests/cli/test_architecture.py checks the edges against
the flow and that the drawing in docs/architecture.md is up to date.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "maxtext_netdata"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
BEGIN, END = "<!-- rooms: written by scripts/room_graph.py -->", "<!-- /rooms -->"

# Top to bottom: who may import whom flows downwards.
LAYERS = (
  ("cli",),
  ("trainer", "bench", "maxtext"),
  ("input_pipeline",),
  ("data/prepare", "distributed"),
  ("data/ripe", "data/synthetic", "data/store"),
  ("data/raw", "data/ripe/scanner"),
  ("data", "format"),
  ("kernels",),
  ("config", "errors", "signals"),
)
# Rooms whose subpackages are rooms of their own.
NESTED = ("data",)


def room_of(module: str) -> str | None:
  """`maxtext_netdata.trainer.train` -> "trainer", `maxtext_netdata.data.prepare.partition`
  -> "data/prepare", `maxtext_netdata.data.remote` -> "data"; None outside the package or for
  its root."""
  parts = module.split(".")
  if parts[0] != "maxtext_netdata" or len(parts) < 2 or parts[1] in ("__init__", "__main__"):
    return None
  room = [parts[1]]
  if parts[1] in NESTED:
    for part in parts[2:]:
      if not PACKAGE.joinpath(*room, part).is_dir():
        break
      room.append(part)
  return "/".join(room)


def _is_main_block(node: ast.AST) -> bool:
  return (
    isinstance(node, ast.If)
    and isinstance(node.test, ast.Compare)
    and isinstance(node.test.left, ast.Name)
    and node.test.left.id == "__name__"
  )


def _walk_library_code(tree: ast.AST):
  """ast.walk, minus `if __name__ == "__main__":` blocks (entry points may use the CLI)."""
  pending = [tree]
  while pending:
    node = pending.pop()
    yield node
    pending.extend(child for child in ast.iter_child_nodes(node) if not _is_main_block(child))


def module_imports(path: Path) -> set[str]:
  """Absolute names of every maxtext_netdata module `path` imports (relative ones resolved)."""
  relative = path.relative_to(ROOT).with_suffix("")
  package = list(relative.parts if relative.name == "__init__" else relative.parts[:-1])
  if package and package[-1] == "__init__":
    package = package[:-1]
  found = set()
  for node in _walk_library_code(ast.parse(path.read_text(encoding="utf-8"))):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
      # Imported by name on use: "maxtext_netdata.data.prepare" or "module:function".
      if re.fullmatch(r"maxtext_netdata(\.\w+)+(:\w+)?", node.value):
        found.add(node.value.split(":")[0])
    elif isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
      found.add(base)
      found.update(f"{base}.{alias.name}" for alias in node.names)
  return {name for name in found if name.startswith("maxtext_netdata.")}


def modules() -> dict[str, Path]:
  """Every module of the package by dotted name."""
  found = {}
  for path in sorted(PACKAGE.rglob("*.py")):
    parts = path.relative_to(ROOT).with_suffix("").parts
    found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return found


def module_edges() -> dict[str, set[str]]:
  """module -> the package modules (or packages) it imports."""
  known = modules()
  edges = {}
  for name, path in known.items():
    targets = set()
    for imported in module_imports(path):
      # `from maxtext_netdata.data import prepare` names both the package and the module.
      if imported in known and imported != name:
        targets.add(imported)
    edges[name] = targets
  return edges


def room_edges() -> dict[str, set[str]]:
  """room -> the other rooms its modules import."""
  edges = defaultdict(set)
  for source, targets in module_edges().items():
    room = room_of(source)
    if room is None:
      continue
    edges[room].update(t for t in map(room_of, targets) if t is not None and t != room)
  return dict(edges)


def _node(room: str) -> str:
  """A Mermaid node id for a room ("data/ripe/scanner" -> "data_ripe_scanner")."""
  return room.replace("/", "_")


def mermaid() -> str:
  """The room map as a Mermaid flowchart, layer by layer; config, errors and signals (which
  every room may import) left implicit."""
  edges = room_edges()
  everywhere = {"config", "errors", "signals"}
  lines = [
    "```mermaid",
    "%% Every room may import config, errors and signals; those edges are left out.",
    "flowchart TD",
  ]
  for layer in LAYERS:
    for room in layer:
      label = f"{room}/" if PACKAGE.joinpath(room).is_dir() else f"{room}.py"
      lines.append(f'  {_node(room)}["{label}"]')
  for source in [room for layer in LAYERS for room in layer]:
    for target in sorted(edges.get(source, ()) - everywhere):
      # config reads only the dataset-type names (tests/cli/test_architecture.py checks it).
      arrow = " -. dataset-type names .-> " if source == "config" else " --> "
      lines.append(f"  {_node(source)}{arrow}{_node(target)}")
  return "\n".join([*lines, "```"]) + "\n"


def with_drawing(text: str) -> str:
  """`text` (docs/architecture.md) with the drawing between its markers redrawn."""
  head, _, rest = text.partition(BEGIN)
  _, _, tail = rest.partition(END)
  return f"{head}{BEGIN}\n{mermaid()}{END}{tail}"


if __name__ == "__main__":
  ARCHITECTURE.write_text(with_drawing(ARCHITECTURE.read_text(encoding="utf-8")), encoding="utf-8")
  print(mermaid(), end="")
