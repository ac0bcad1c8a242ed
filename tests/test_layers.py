"""The package's layers: each folder imports only from the layers below it, and no module imports itself back.

The order is docs/design.md's drawing of the tree: notations and the run
directory's records at the bottom (both sides read them), then configuration,
planning, rendering, the backends and the node-side runtime, the read-only
views, the actions on runs, the tools built on them, and the command line on
top. Imports inside functions count too: an upward import is upward wherever
it is written.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "clusterctl"

LAYERS: list[set[str]] = [
    {"exitcodes", "envnames", "errors", "procfs", "jsonfast", "store", "__init__"},
    {"syntax", "rundir"},
    {"checkpoint", "config"},
    {"plan"},
    {"render", "backends", "runtime"},
    {"trainer", "views"},
    {"actions"},
    {"remote", "qualify", "siteimport", "testing", "integrations"},
    {"cli", "launch", "watch"},  # launch: the entry point's thin alias of runtime/rank/launch.py; watch: record()
    {"docsgen"},  # the documentation's reference: reads everything, the command line included
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The clusterctl modules a module imports (a name imported from a package counts as that submodule)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "clusterctl":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in known else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "clusterctl")
    return {m for m in out if m in known}


def part(module: str) -> str:
    """The top-level folder (or module) a module belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_top_level_name_has_a_layer() -> None:
    top = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir() if (p.suffix == ".py" or (p / "__init__.py").exists())}
    assert top <= set(LAYER), f"place in LAYERS: {sorted(top - set(LAYER))}"


def test_the_top_level_holds_few_modules() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(loose) <= 8, loose


def test_nothing_imports_upward() -> None:
    known = modules()
    upward = []
    for module, path in known.items():
        for target in imports(path, known):
            if LAYER[part(target)] > LAYER[part(module)]:
                upward.append(f"{module} -> {target}")
    assert not upward, "\n".join(sorted(upward))


def test_no_import_cycles() -> None:
    known = modules()
    graph = {m: imports(p, known) - {m} for m, p in known.items()}
    # A package's __init__ that re-exports its submodules is not a cycle with them.
    for m in graph:
        graph[m] = {t for t in graph[m] if not (t.startswith(m + ".") and known[m].name == "__init__.py")}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_the_layers_are_what_the_design_draws() -> None:
    design = (PACKAGE.parent / "docs" / "design.md").read_text()
    for names in LAYERS:
        for name in names - {"__init__"}:
            assert f"{name}/" in design or f"{name}.py" in design, f"docs/design.md does not draw {name}"


def drawn_modules() -> set[Path]:
    """The modules docs/design.md's tree names: `  folder/`, `    a.py, b.py  what they do`, `    sub/  c.py, d.py`."""
    design = (PACKAGE.parent / "docs" / "design.md").read_text()
    tree = next(block for block in design.split("```")[1::2] if block.lstrip().startswith("clusterctl/"))
    drawn: set[Path] = set()
    folder = PACKAGE
    for line in tree.splitlines()[1:]:
        indent = len(line) - len(line.lstrip())
        words = line.split()
        if not words or indent > 4 or not (words[0].endswith("/") or words[0].rstrip(",").endswith(".py")):
            continue  # a description, or the folders beside the package
        if indent == 2 and words[0].endswith("/"):
            folder = PACKAGE / words[0].rstrip("/")
            continue
        where = folder
        if words[0].endswith("/"):
            where, words = folder / words[0].rstrip("/"), words[1:]
        for word in words:
            if not word.rstrip(",").endswith(".py"):
                break  # the description begins
            drawn.add(((PACKAGE if indent == 2 else where) / word.rstrip(",")).resolve())
    return drawn


def test_the_design_draws_every_module_and_only_modules_that_exist() -> None:
    drawn = drawn_modules()
    on_disk = {p.resolve() for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent == PACKAGE}
    assert not sorted(str(p.relative_to(PACKAGE)) for p in drawn - on_disk), "docs/design.md names modules that do not exist"
    assert not sorted(str(p.relative_to(PACKAGE)) for p in on_disk - drawn), "docs/design.md's tree leaves these out"


def test_no_module_is_a_drawer() -> None:
    """Small modules with one job each: no module over 600 lines (the style asks for ~400 without a reason)."""
    big = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600}
    assert not big, big


def test_the_folders_import_graph_is_acyclic() -> None:
    known = modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for module, path in known.items():
        for target in imports(path, known):
            if part(target) != part(module):
                edges[part(module)].add(part(target))
    both = sorted(f"{a} <-> {b}" for a in edges for b in edges[a] if a < b and a in edges.get(b, set()))
    assert not both, both


# The runtime's rooms, one per process, meet through the wire; these are the only other crossings, each for a reason.
ROOMS = ("rank", "controller", "node", "recovery", "wire")
ROOM_CROSSINGS = {
    ("recovery", "runtime.controller.keeper"): "a cancel's verdict where the controller was killed first: the one keeper",
    ("recovery", "runtime.node.warm.client"): "a full-size job stops the shrunk one once its warm servers have imported",
    ("rank", "runtime.controller.straggler"): "the compute check judges by the one straggler rule (pure)",
    ("node", "runtime.rank.preflight"): "GPU samples decode throttle reasons as the gpu check does",
    ("node", "runtime.rank.launch"): "a warm server's forked child becomes the rank",
    ("node", "runtime.rank.procexit"): "and ends as a cold rank would",
}


def test_the_runtimes_rooms_meet_only_through_the_wire() -> None:
    known = modules()
    crossings = []
    for module, path in known.items():
        parts = module.split(".")
        if len(parts) < 4 or parts[1] != "runtime" or parts[2] not in ROOMS:
            continue  # the package, or an alias of an old entry point
        room = parts[2]
        for target in imports(path, known):
            tparts = target.split(".")
            if len(tparts) < 3 or tparts[1] != "runtime" or tparts[2] in (room, "wire"):
                continue
            if not any(room == r and target.startswith(f"clusterctl.{t}") for r, t in ROOM_CROSSINGS):
                crossings.append(f"{module} -> {target}")
    assert not crossings, "\n".join(sorted(crossings))
    assert {p.name for p in (PACKAGE / "runtime").iterdir() if p.is_dir() and p.name != "__pycache__"} == {*ROOMS, "warm"}
