"""The package's shape, read from its own files: imports only point down the layers, no
import cycles, no module over 600 lines (enough for a concept to stay whole), few closets
(modules too small to hold a concept of their own), no two modules of one name, every room
saying what it holds and may import, and what an import scan cannot see (a module named in
a string, package resources, package-data) still points at real files."""

from __future__ import annotations

import ast
import importlib.util
import tomllib
from importlib import resources
from pathlib import Path

import pytest

from replicator.spark.session import LOCAL_DAEMON_MODULE

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "replicator"
# Lowest first; a module may import from its own layer and the ones before it.
LAYERS = [
    "base",
    "project",
    "postgres",
    "plan",
    "transfer",
    "spark",
    "compare",
    "cdc",
    "report",
    "sync",
    "commands",
    "cli",
]
# The package's face: the only modules at its root.
ROOT_MODULES = {"__init__", "__main__"}
MAX_LINES = 600
# Modules under SMALL lines (the package's faces aside) are closets: a piece that belongs in
# the module it serves, unless it must stand alone (a process's entry point, a module Spark
# names in a string, one its Python workers import cheaply).
SMALL, MAX_SMALL = 40, 10


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    parts = module.split(".")
    if module == "replicator":
        return 0
    if module == "replicator.__main__":
        return LAYERS.index("cli")
    return LAYERS.index(parts[1])


def imports(path: Path) -> set[str]:
    """The replicator modules a file imports, module-level or not."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if not base.startswith("replicator"):
                continue
            for alias in node.names:  # `from ..postgres import ddl` imports a module
                candidate = f"{base}.{alias.name}"
                found.add(candidate if _exists(candidate) else base)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("replicator")}
    return found - {module}


def _exists(module: str) -> bool:
    relative = Path(*module.split("."))
    return (ROOT / relative.with_suffix(".py")).is_file() or (ROOT / relative).is_dir()


GRAPH = {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


def test_imports_only_point_down_the_layers():
    upward = [
        f"{src} ({LAYERS[layer(src)]}) imports {dst} ({LAYERS[layer(dst)]})"
        for src, targets in sorted(GRAPH.items())
        for dst in sorted(targets)
        if layer(dst) > layer(src)
    ]
    assert upward == []


def test_no_import_cycles():
    state: dict[str, str] = {}
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(GRAPH.get(module, ())):
            if state.get(target) == "open":
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = "done"

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_package_root_holds_only_its_face():
    """Every module lives in the wing its name belongs to; the root is `__init__` (the
    version) and `__main__` (`python -m replicator`)."""
    assert {p.stem for p in PACKAGE.glob("*.py")} == ROOT_MODULES


def test_no_module_is_over_600_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_few_modules_are_closets():
    small = sorted(
        f"{p.relative_to(ROOT)} ({n})"
        for p in PACKAGE.rglob("*.py")
        if p.stem not in ROOT_MODULES and (n := len(p.read_text().splitlines())) < SMALL
    )
    assert len(small) <= MAX_SMALL, small


def test_no_two_modules_share_a_name():
    """A name says what a module holds: two of one name hold two things, and a reader
    looking for one finds the other."""
    seen: dict[str, list[str]] = {}
    for p in PACKAGE.rglob("*.py"):
        if p.stem not in ROOT_MODULES:
            seen.setdefault(p.name, []).append(str(p.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


@pytest.mark.parametrize(
    "room", sorted(str(p.parent.relative_to(PACKAGE)) for p in PACKAGE.rglob("__init__.py"))
)
def test_each_room_says_what_lives_there_and_what_it_may_import(room):
    if room == ".":
        return  # the package's face: its version
    doc = ast.get_docstring(ast.parse((PACKAGE / room / "__init__.py").read_text()))
    assert doc and "May import" in doc


def test_what_an_import_scan_does_not_see_is_there():
    """The Spark daemon is named in a string; the built-in macros and the log4j settings
    are package resources, installed through package-data."""
    assert importlib.util.find_spec(LOCAL_DAEMON_MODULE) is not None
    macros = resources.files("replicator.project") / "macros"
    assert sorted(p.name for p in macros.iterdir() if p.name.endswith(".sql"))
    assert (resources.files("replicator.spark") / "log4j2.properties").is_file()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package, patterns in data["package-data"].items():
        folder = ROOT / Path(*package.split("."))
        for pattern in patterns:
            assert list(folder.glob(pattern)), f"{package}: {pattern} matches nothing"
