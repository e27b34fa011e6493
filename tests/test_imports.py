"""The import structure: one way between the packages, floors inside the library, no cycles.

Every ``import`` counts, including those inside functions: an import deferred
into a function to dodge a cycle is still a cycle in the design.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("layercheck", "profiler", "sim", "dashboard")
FORBIDDEN = {
    "layercheck": {"profiler", "sim", "dashboard"},   # the library needs nothing of ours
    "sim": {"profiler", "dashboard"},                 # torch-free, reads traces
    "dashboard": {"profiler"},                        # torch-free, reads traces and sim
    "profiler": {"dashboard"},
}

CONTRACT = "layercheck.contract"
FLOORS = {
    CONTRACT: set(),                                  # torch-free, shared: the floor
    "layercheck.storage": {CONTRACT},                 # the format and its I/O
    "layercheck.backends": {CONTRACT, "layercheck.storage"},   # where a layer's tensors live
    "layercheck.drift": {CONTRACT, "layercheck.storage", "layercheck.backends"},
    "layercheck": {CONTRACT, "layercheck.storage", "layercheck.backends",   # the lifecycle
                   "layercheck.drift"},
    "layercheck.tools": {CONTRACT, "layercheck.storage", "layercheck.backends",   # offline
                         "layercheck.drift", "layercheck"},
}
"""The library's rooms (a folder each; ``layercheck`` itself is the lifecycle's top-level
modules) and the rooms each may import besides itself: every arrow points down."""
DOORS = {"layercheck.__main__"}
"""Modules that only open another room (``python -m layercheck`` runs ``tools.cli``)."""
UPPER = {"sim", "dashboard"}
"""Packages that stand on the contract alone: of the library, they import only it."""


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ours that ``name`` imports (a package's ``__init__`` only when
    it is imported by name, not as the parent of a submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            submodules = {f"{origin}.{alias.name}" for alias in node.names} & modules.keys()
            found.update(submodules)
            if len(submodules) < len(node.names):
                found.add(origin)                      # names defined in the module itself
    return {target for target in found if target in modules and target != name}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_packages_import_one_way(graph):
    wrong = sorted(f"{name} imports {target}" for name, targets in graph.items()
                   for target in targets
                   if target.split(".")[0] in FORBIDDEN[name.split(".")[0]])
    assert not wrong


def _last_line(code: str) -> str:
    """The last line ``code`` prints in a fresh interpreter at the repository's root."""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def room(name: str) -> str:
    """The room of module ``name``: its folder in the library, else its package."""
    parts = name.split(".")
    if parts[0] != "layercheck":
        return parts[0]
    folder = ".".join(parts[:2])
    return folder if folder in FLOORS else "layercheck"


def test_every_module_of_the_library_has_a_room(graph):
    folders = {room(n) for n in graph if n.startswith("layercheck")}
    assert folders == set(FLOORS)


def test_the_library_s_rooms_import_only_the_floors_below_them(graph):
    wrong = sorted(f"{name} ({room(name)}) imports {target} ({room(target)})"
                   for name, targets in graph.items()
                   if name.startswith("layercheck") and name not in DOORS
                   for target in targets
                   if target.startswith("layercheck") and room(target) != room(name)
                   and room(target) not in FLOORS[room(name)])
    assert not wrong, "\n".join(wrong)


def test_the_simulator_and_the_dashboard_import_only_the_contract_of_the_library(graph):
    wrong = sorted(f"{name} imports {target}" for name, targets in graph.items()
                   if name.split(".")[0] in UPPER
                   for target in targets
                   if target.startswith("layercheck") and room(target) != CONTRACT)
    assert not wrong, "\n".join(wrong)


def test_the_contract_and_a_calibrated_trace_load_neither_torch_nor_the_simulator(graph):
    """Every module of the contract imported, and a shipped trace with its costs.json read
    through it, in a fresh interpreter: no torch, no ``sim`` (the calibration is
    schema-agnostic: no owner is looked up), and nothing of the library outside the
    contract but the package itself."""
    contract = sorted(n for n in graph if room(n) == CONTRACT)
    trace = ROOT / "traces" / "minilm-200steps"
    assert (trace / "costs.json").exists()
    code = ("import importlib, sys\n"
            f"for name in {contract!r}: importlib.import_module(name)\n"
            "from layercheck.contract.trace import read_trace\n"
            "from layercheck.contract.decision import threshold_matrix\n"
            f"trace = read_trace({str(trace)!r})\n"
            "assert trace.costs is not None and trace.costs.figures\n"
            "threshold_matrix(trace)\n"
            "loaded = {m.split('.')[0] for m in sys.modules}\n"
            "library = {m for m in sys.modules if m.startswith('layercheck.')\n"
            f"           and not m.startswith({CONTRACT + '.'!r}) and m != {CONTRACT!r}}}\n"
            "print(sorted(loaded & {'torch', 'sim', 'profiler', 'dashboard'}), sorted(library))")
    assert _last_line(code) == "[] []"


def test_no_module_imports_itself_through_others(graph):
    cycles, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        for target in sorted(graph[node]):
            if target in path:
                cycles.append(path[path.index(target):] + [target])
            elif target not in done:
                visit(target, path + [target])
        done.add(node)

    for name in sorted(graph):
        if name not in done:
            visit(name, [name])
    # a package's __init__ re-exporting its modules is not a cycle of the design
    real = [c for c in cycles if not any("." not in m for m in c)]
    assert not real, "\n".join(" -> ".join(c) for c in real)


def test_the_library_loads_no_module_of_the_simulator_profiler_or_dashboard(graph):
    """Every module of ``layercheck`` imported in a fresh interpreter leaves no ``sim``,
    ``profiler`` or ``dashboard`` module loaded: what the graph above cannot see (an import
    by a computed name) fails here."""
    library = sorted(n for n in graph if n.split(".")[0] == "layercheck" and n != "layercheck.__main__")
    code = ("import importlib, sys\n"
            f"for name in {library!r}: importlib.import_module(name)\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'sim', 'profiler', 'dashboard'}))")
    assert _last_line(code) == "[]"
