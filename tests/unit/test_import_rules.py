"""The rooms' import rules, read from their `__init__.py` and enforced over the whole import graph.

Every room (each folder mapped in pyproject.toml's package-dir that exists, plus any subpackage
whose `__init__.py` states a rule of its own, e.g. cellar.coord) states in its docstring one line

    Import rule: must not import A, B, ...       (these are forbidden)
    Import rule: may import only A, B, ...       (nothing else of cellar; its own room always)
    Import rule: any                             (benchmarks: they drive every part)

where an entry `cellar.x` names that module only and `cellar.x.*` the module and everything
below it. This test parses every module with `ast` (no import runs), collects every import of
`cellar` (module level or inside functions: a lazy import is still a dependency; relative ones
resolved), and checks each against the rule of the room the importing module lives in. The
design's floor for the engine rooms is enforced even if their own line says less:
integrations and compat import only the SDK (DESIGN.md "Parts and their one-way dependencies").

No import cycle: the imports a module runs when it is loaded (module level, including inside
`try`/`if` there; not inside functions, which run later) and its type-only imports (under
`if TYPE_CHECKING:`, none exempt) form a graph over every cellar module, and that graph has no
cycle (`test_no_import_cycle`, a strongly-connected-component search, with a negative control
on a synthetic graph). The record types the master's tables share live in one module
(cellar.master.state.records) for that reason.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
RULE_PREFIX = "Import rule:"
# DESIGN: integrations/compat -> the SDK (cellar.client and the public root: cellar, errors).
SDK_ONLY = ("cellar", "cellar.errors", "cellar.client.*")
ENGINE_ROOMS = ("cellar.integrations", "cellar.compat")


@dataclass(frozen=True)
class Rule:
    room: str
    kind: str                      # "must not" | "only" | "any"
    entries: tuple[str, ...]

    def allows(self, target: str) -> bool:
        if _matches(target, (self.room + ".*",)) or self.kind == "any":
            return True
        if self.kind == "must not":
            return not _matches(target, self.entries)
        return _matches(target, self.entries)


def _matches(module: str, entries: tuple[str, ...]) -> bool:
    for e in entries:
        if e.endswith(".*"):
            base = e[:-2]
            if module == base or module.startswith(base + "."):
                return True
        elif module == e:
            return True
    return False


def parse_rule(room: str, docstring: str | None) -> Rule | None:
    for line in (docstring or "").splitlines():
        line = line.strip()
        if not line.startswith(RULE_PREFIX):
            continue
        text = line[len(RULE_PREFIX):].strip()
        if text.startswith("any"):
            return Rule(room, "any", ())
        for prefix, kind in (("must not import ", "must not"), ("may import only ", "only")):
            if text.startswith(prefix):
                entries = tuple(e.strip() for e in text[len(prefix):].split(",") if e.strip())
                assert entries, f"{room}: an empty import rule"
                return Rule(room, kind, entries)
        raise AssertionError(f"{room}: unparseable import rule {line!r}")
    return None


def _modules() -> dict[str, Path]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        mapping: dict[str, str] = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    out: dict[str, Path] = {}
    for package, folder in mapping.items():
        base = ROOT / folder
        if not (base / "__init__.py").is_file():
            continue
        for path in base.rglob("*.py"):
            if any(p.startswith(".") or p == "__pycache__" for p in path.parts):
                continue
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if any(not (base.joinpath(*parts[:k]) / "__init__.py").is_file()
                   for k in range(1, len(parts))):
                continue  # a script folder, not a package
            out[".".join([package, *parts])] = path
    return out


MODULES = _modules()


def _mapped_rooms() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return [p for p in mapping if p in MODULES]


def _rules() -> dict[str, Rule]:
    rules: dict[str, Rule] = {}
    for name, path in MODULES.items():
        if path.name != "__init__.py":
            continue
        rule = parse_rule(name, ast.get_docstring(ast.parse(path.read_text())))
        if rule is not None:
            rules[name] = rule
    return rules


RULES = _rules()


def _room_of(module: str) -> str:
    best = ""
    for room in RULES:
        if (module == room or module.startswith(room + ".")) and len(room) > len(best):
            best = room
    return best


def imports_of(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, imported cellar module) for every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text())
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found += [(node.lineno, t) for t in _targets(node, package)]
    return [(line, t) for line, t in found if t == "cellar" or t.startswith("cellar.")]


def _targets(node: ast.Import | ast.ImportFrom, package: list[str]) -> list[str]:
    """The modules one import statement names, a relative one resolved against `package`."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = package[:len(package) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    # `from cellar.client import tensors` imports cellar.client.tensors when it is one
    return [target, *(f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES)]


def test_every_room_states_its_import_rule() -> None:
    missing = [room for room in _mapped_rooms() if room not in RULES]
    assert missing == [], f"rooms without an '{RULE_PREFIX}' line in __init__.py: {missing}"


def test_the_import_graph_keeps_every_stated_rule() -> None:
    broken: list[str] = []
    for module, path in sorted(MODULES.items()):
        room = _room_of(module)
        rule = RULES[room]
        for line, target in imports_of(module, path):
            if not rule.allows(target):
                broken.append(f"{path.relative_to(ROOT)}:{line} ({room}) imports {target}")
            if room in ENGINE_ROOMS and not (_matches(target, SDK_ONLY)
                                             or _matches(target, (room + ".*",))):
                broken.append(f"{path.relative_to(ROOT)}:{line} ({room}) imports {target}, "
                              "but engine rooms import only the SDK")
    assert broken == []


def test_the_rules_say_what_the_design_says() -> None:
    assert RULES["cellar.proto"].kind == "only"
    assert RULES["cellar.transfer"].allows("cellar.proto.grant")
    for room, forbidden in (("cellar.master", "cellar.client.sync"),
                            ("cellar.storage_node", "cellar.client"),
                            ("cellar.transfer", "cellar.client.session_state"),
                            ("cellar.transfer", "cellar.master"),
                            ("cellar.transfer", "cellar.storage_node.access"),
                            ("cellar.proto", "cellar.errors"),
                            ("cellar.client", "cellar.master.service"),
                            ("cellar.master.state", "cellar.master.service"),
                            ("cellar.master.state", "cellar.master.serving.servicer"),
                            ("cellar.master.state", "cellar.master.config"),
                            ("cellar.master.state", "cellar.coord.election"),
                            ("cellar.master.state", "cellar.http")):
        assert not RULES[room].allows(forbidden), (room, forbidden)


@pytest.mark.parametrize("source, module, expected", [
    ("from . import frame\nfrom .base import X\n", "cellar.transfer.tcp",
     ["cellar.transfer", "cellar.transfer.frame", "cellar.transfer.base"]),
    ("def f():\n    import cellar.client.sync\n", "cellar.master.x", ["cellar.client.sync"]),
    ("from .. import errors\n", "cellar.coord.x", ["cellar", "cellar.errors"]),
    ("import os, numpy\n", "cellar.bench.x", []),
])
def test_imports_are_found_anywhere_and_relative_ones_resolved(
        tmp_path: Path, source: str, module: str, expected: list[str]) -> None:
    path = tmp_path / "m.py"
    path.write_text(source)
    got = [t for _, t in imports_of(module, path) if t in expected or t.startswith("cellar")]
    assert sorted(set(got)) == sorted(set(expected))


def test_a_violation_is_caught() -> None:
    rule = parse_rule("cellar.master", "x\nImport rule: must not import cellar.client.*\n")
    assert rule is not None and not rule.allows("cellar.client.sync")
    assert rule.allows("cellar.master.service") and rule.allows("cellar.errors")
    only = parse_rule("cellar.proto", "Import rule: may import only cellar.proto.*")
    assert only is not None and not only.allows("cellar") and only.allows("cellar.proto.grant")
    with pytest.raises(AssertionError):
        parse_rule("x", "Import rule: whatever")


# ---------------------------------------------------------------- no import cycle

# Cycles allowed: none. Kept as a named empty tuple so that a tolerated cycle, if ever needed,
# is stated here with its reason rather than hidden in the test.
KNOWN_CYCLES: tuple[frozenset[str], ...] = ()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _loaded_by(node: ast.Import | ast.ImportFrom, package: list[str]) -> list[str]:
    """What one import statement makes Python run: `from cellar.client import tensors` runs
    cellar.client.tensors, and the package's `__init__` only when a name is not a submodule (a
    class, a function): binding a submodule adds no edge to its package, which the importer's
    own parent import already ran."""
    targets = _targets(node, package)
    if isinstance(node, ast.ImportFrom) and len(targets) == len(node.names) + 1:
        return targets[1:]
    return targets


def module_level_imports(module: str, path: Path, *, with_type_checking: bool = False) -> set[str]:
    """The cellar modules `module` imports when it is loaded: module-level statements, into
    `if`/`try`/`with` blocks, never into functions or classes' methods; `if TYPE_CHECKING:`
    bodies only `with_type_checking` (their `else` always)."""
    tree = ast.parse(path.read_text())
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()

    def visit(body: Iterable[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.update(_loaded_by(node, package))
            elif isinstance(node, ast.If):
                if not _is_type_checking(node.test) or with_type_checking:
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.With):
                visit(node.body)
            elif isinstance(node, ast.ClassDef):
                visit(node.body)  # a class body runs at import time too

    visit(tree.body)
    return {t for t in found if t == "cellar" or t.startswith("cellar.")}


def import_cycles(graph: Mapping[str, Iterable[str]]) -> list[frozenset[str]]:
    """Every strongly connected component of more than one module (or a module importing itself):
    the import cycles of `graph`, found by Tarjan's algorithm (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[frozenset[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, [])]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work[-1] = (root, list(graph.get(root, ())))
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, list(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    cycles.append(frozenset(component))
    return cycles


def _graph(*, with_type_checking: bool) -> dict[str, set[str]]:
    return {module: module_level_imports(module, path, with_type_checking=with_type_checking) & MODULES.keys()
            for module, path in MODULES.items()}


def _unexpected(cycles: list[frozenset[str]], allowed: tuple[frozenset[str], ...]) -> list[list[str]]:
    return [sorted(c) for c in cycles if not any(c <= known for known in allowed)]


def test_no_import_cycle() -> None:
    assert _unexpected(import_cycles(_graph(with_type_checking=True)), KNOWN_CYCLES) == []


def test_the_master_has_no_import_cycle_not_even_type_only() -> None:
    cycles = import_cycles(_graph(with_type_checking=True))
    assert [sorted(c) for c in cycles if any(m.startswith("cellar.master") for m in c)] == []


def test_the_cycle_detector_finds_a_cycle() -> None:
    """Negative control: a synthetic graph with a cycle, one without, a self-import."""
    graph = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"], "e": []}
    assert import_cycles(graph) == [frozenset({"a", "b", "c"})]
    assert import_cycles({"a": ["b"], "b": ["c"], "c": [], "d": ["a", "c"]}) == []
    assert import_cycles({"a": ["a"]}) == [frozenset({"a"})]
    assert _unexpected(import_cycles(graph), KNOWN_CYCLES) == [["a", "b", "c"]]


def test_module_level_imports_skip_functions_and_type_checking(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "import cellar.errors\n"
        "try:\n    from cellar import units\nexcept ImportError:\n    pass\n"
        "from cellar.devtools import local_cluster\n"  # a submodule: no edge to the package
        "from cellar.client import Client\n"  # a name in the package: its __init__ runs
        "if TYPE_CHECKING:\n    from cellar.master.service import MasterService\n"
        "def f():\n    import cellar.client.sync\n"
    )
    module = "cellar.master.x"
    assert module_level_imports(module, path) == {"cellar.errors", "cellar.units",
                                                  "cellar.devtools.local_cluster", "cellar.client"}
    assert "cellar.master.service" in module_level_imports(module, path, with_type_checking=True)


def test_the_state_room_serves_nothing() -> None:
    """cellar.master.state imports no gRPC, HTTP, asyncio or sockets, even indirectly through
    the cellar modules it imports (its own rule keeps those to the kernel's errors)."""
    serving = ("grpc", "asyncio", "http", "socket", "ssl", "selectors", "aiohttp", "uvloop",
               "prometheus_client", "google.protobuf", "etcd3aio")
    seen: set[str] = set()
    todo = [m for m in MODULES if m == "cellar.master.state" or m.startswith("cellar.master.state.")]
    broken: list[str] = []
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        tree = ast.parse(MODULES[module].read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            broken += [f"{module} imports {n}" for n in names
                       if any(n == s or n.startswith(s + ".") for s in serving)]
        todo += [t for _, t in imports_of(module, MODULES[module]) if t in MODULES]
    assert broken == []
