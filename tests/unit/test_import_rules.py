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
"""

from __future__ import annotations

import ast
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
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # `from cellar.client import tensors` imports cellar.client.tensors when it is one
            found += [(node.lineno, f"{target}.{a.name}") for a in node.names
                      if f"{target}.{a.name}" in MODULES]
    return [(line, t) for line, t in found if t == "cellar" or t.startswith("cellar.")]


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
                            ("cellar.client", "cellar.master.service")):
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
