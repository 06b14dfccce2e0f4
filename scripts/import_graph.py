"""The import graph of qlint's own modules: arrows, cycles, and arrows that go up a floor.

    python scripts/import_graph.py            # this checkout
    python scripts/import_graph.py ROOT       # another checkout (the figures in the note)

Every ``import`` / ``from ... import`` counts, at module level or inside a function
(a lazy import is still a dependency), except under ``if TYPE_CHECKING:``. ``rules/``
is scanned too: a Python module there would be a floor of its own. The floors are the
ones docs/architecture.md draws; tests/test_layering.py asserts zero cycles and no
upward arrow with :func:`graph` and :func:`violations`, the capture stages called one way
(:func:`capture_order_violations`) and no folder of qlint/ or tests/ over 12 modules
(:func:`crowded_folders`).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import networkx as nx

# floor of a module: the longest matching prefix wins; a module may import its own floor or lower
FLOORS = {
    "qlint._version": 0,
    "qlint.core": 0,  # what both capture and analysis need: algebra, value domain, ops, graph facts, results
    "qlint.zoo": 0,
    "qlint.loader": 0,
    "qlint.catalogue": 0,  # hf: / timm: / torchvision: specs, built from a library's config (the loader's)
    "qlint.capture": 1,  # a model in, a checked graph out
    "qlint.growth": 2,  # a graph in, blocks and exponents out
    "qlint.registry": 3,
    "qlint.lint": 4,
    "qlint.analysis": 5,
    "qlint.coverage": 5,
    "qlint.velocity": 5,  # what the probe, the witness and the monitor measure: a block's velocity, the bounds
    "qlint.ci": 6,
    "qlint.probe": 6,
    "qlint.remedies": 6,
    "qlint.api": 7,
    "qlint.fixes": 7,  # remedies as source patches, re-checked on the patched source
    "qlint.monitor": 7,  # the probe's velocity measured during training, its callbacks and sinks
    "qlint.verify": 8,
    "qlint.cli": 9,
    "qlint.__main__": 9,
    "qlint": 10,  # the package facade: qlint.check / qlint.analyze / qlint.register, resolved lazily
}

# qlint/capture/ from the bottom up: each module imports only the ones before it, so the capture stages are
# called in one direction. harness: what every stage shares; then the stages in the order the pipeline runs
# them (hops and shapes: what the trace stage reads; histories and graph_check: the check and the shape coverage);
# last the pipeline, which calls them top to bottom.
CAPTURE_ORDER = ("harness", "process_state", "call_state", "module_state", "eager_record", "reuse", "hops", "shapes",
                 "trace", "histories", "graph_check", "pipeline")

# at most this many Python modules (not counting __init__.py) in one folder of qlint/ or tests/
MAX_MODULES_PER_FOLDER = 12


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST, name: str, is_package: bool) -> set[str]:
    found: set[str] = set()
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(child) for child in ast.walk(node)
                     if child is not node} - {id(child) for orelse in node.orelse for child in ast.walk(orelse)}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def graph(root: Path) -> nx.DiGraph:
    """Module -> module arrows between qlint's (and rules') own modules."""
    files = [p for top in ("qlint", "rules") for p in sorted((root / top).rglob("*.py"))
             if "__pycache__" not in p.parts]
    modules = {module_name(root, p): p for p in files}
    g = nx.DiGraph()
    g.add_nodes_from(modules)
    for name, path in modules.items():
        for target in _imports(ast.parse(path.read_text()), name, path.name == "__init__.py"):
            if target.startswith("qlint.rules") and "qlint.rules" not in modules:  # 0.1 installed rules/ as qlint.rules
                target = target[len("qlint.") :]
            if target in modules and target != name:
                g.add_edge(name, target)
            elif target.rpartition(".")[0] in modules and target.rpartition(".")[0] != name:
                g.add_edge(name, target.rpartition(".")[0])  # `from pkg import function`
    # `from qlint.x import y` where y is a submodule also names the package qlint.x: drop that arrow
    for name in list(g.nodes):
        for target in list(g.successors(name)):
            if (any(t.startswith(target + ".") for t in g.successors(name))
                and not _names_package_attribute(modules[name], target)):
                g.remove_edge(name, target)
    return g


def _names_package_attribute(path: Path, package: str) -> bool:
    """Whether the file imports something from the package that is not one of its submodules."""
    tree = ast.parse(path.read_text())
    root = path
    while root.name not in ("qlint", "rules"):
        root = root.parent
    base = root.parent
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == package:
            for alias in node.names:
                if (not (base / Path(*package.split("."), alias.name + ".py")).exists()
                    and not (base / Path(*package.split("."), alias.name)).is_dir()):
                    return True
        if isinstance(node, ast.Import) and any(alias.name == package for alias in node.names):
            return True
    return False


def floor(module: str) -> int:
    matches = [prefix for prefix in FLOORS if module == prefix or module.startswith(prefix + ".")]
    return FLOORS[max(matches, key=len)] if matches else -1


def cycles(g: nx.DiGraph) -> list[list[str]]:
    """Strongly connected groups of more than one module (each holds at least one cycle)."""
    return [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]


def violations(g: nx.DiGraph) -> list[tuple[str, str]]:
    """Arrows to a higher floor (or into a module no floor names)."""
    return sorted((a, b) for a, b in g.edges if floor(a) < 0 or floor(b) < 0 or floor(b) > floor(a))


def capture_order_violations(g: nx.DiGraph) -> list[tuple[str, str]]:
    """Arrows inside qlint.capture that do not go down :data:`CAPTURE_ORDER`, and (module, "unplaced")
    for a capture module the order does not list."""
    rank = {f"qlint.capture.{name}": i for i, name in enumerate(CAPTURE_ORDER)}
    inside = [m for m in g.nodes if m.startswith("qlint.capture.")]
    found = [(m, "unplaced") for m in inside if m not in rank]
    found += [(a, b) for a, b in g.edges if a in rank and b in rank and rank[b] >= rank[a]]
    return sorted(found)


def crowded_folders(root: Path, tops: tuple[str, ...] = ("qlint", "tests"),
                    limit: int = MAX_MODULES_PER_FOLDER) -> dict[str, int]:
    """Folders of ``tops`` holding more than ``limit`` Python modules (``__init__.py`` not counted),
    with their counts. ``tests/fixtures``-like data folders are not scanned: only ``tops``."""
    counts: dict[str, int] = {}
    for top in tops:
        for folder in sorted(p for p in [root / top, *(root / top).rglob("*")] if p.is_dir()):
            if "__pycache__" in folder.parts:
                continue
            modules = [f for f in folder.glob("*.py") if f.name != "__init__.py"]
            if len(modules) > limit:
                counts[folder.relative_to(root).as_posix()] = len(modules)
    return counts


def main(argv: list[str]) -> None:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    g = graph(root)
    found = cycles(g)
    print(f"{root}: {g.number_of_nodes()} modules, {g.number_of_edges()} import arrows, {len(found)} cyclic groups "
          f"({sum(len(c) for c in found)} modules in them), {len(list(nx.simple_cycles(g)))} simple cycles")
    for group in found:
        print("  cycle group:", ", ".join(group))
    upward = violations(g)
    print(f"  arrows that go up a floor: {len(upward)}")
    for a, b in upward[:40]:
        print(f"    {a} (floor {floor(a)}) -> {b} (floor {floor(b)})")
    backward = capture_order_violations(g)
    print(f"  capture arrows against CAPTURE_ORDER: {len(backward)}")
    for a, b in backward:
        print(f"    {a} -> {b}")
    crowded = crowded_folders(root)
    print(f"  folders over {MAX_MODULES_PER_FOLDER} modules: {len(crowded)}")
    for folder, count in crowded.items():
        print(f"    {folder}: {count}")


if __name__ == "__main__":
    main(sys.argv)
