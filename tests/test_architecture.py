"""Rules of the architecture that import-linter cannot see (its contracts: pyproject.toml).

- No module reaches into another's underscored names: a ``_name`` is read only through
  ``self``/``cls`` of its own class, or imported within its own module.
- A library internal (an underscored name of ``eventsourcing`` or another package) is used
  by exactly one module of ours, listed in ``LIBRARY_INTERNALS`` with a test that pins it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("domain", "application", "projections", "infrastructure", "entrypoints")
SOURCES = sorted(
    p for layer in LAYERS for p in (ROOT / layer).rglob("*.py") if ".venv" not in p.parts
) + sorted((ROOT / "gateway_ledger").glob("*.py"))

OWN = {"self", "cls", "mcs"}

LIBRARY_INTERNALS: dict[str, str] = {
    # module (relative path) -> the library internal it owns (pinned where it says)
    "domain/topics.py": "_type_cache",  # eventsourcing.utils; tests/test_stored_topics.py
    "entrypoints/console.py": "_SubParsersAction",  # argparse; named once as Subcommands
    # eventsourcing's PostgreSQL recorder hook that runs in the events' transaction with
    # save's kwargs (the write's data keys); tests/test_write_path.py
    "infrastructure/eventstore/postgres.py": "_insert_events",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def underscored_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            if isinstance(base, ast.Name) and base.id in OWN:
                continue
            if (
                isinstance(base, ast.Call)
                and isinstance(base.func, ast.Name)
                and base.func.id == "super"
            ):
                continue
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: import {alias.name}")
    return found


def test_the_rules_see_every_source_module() -> None:
    assert len(SOURCES) > 80  # a scan that finds nothing passes vacuously


def test_no_module_reaches_into_another_modules_underscored_names() -> None:
    found = [
        use
        for path in SOURCES
        if str(path.relative_to(ROOT)) not in LIBRARY_INTERNALS
        for use in underscored_uses(path)
    ]
    assert found == []


def test_each_library_internal_has_one_owner_that_uses_it() -> None:
    for module, internal in LIBRARY_INTERNALS.items():
        assert internal in (ROOT / module).read_text(encoding="utf-8"), module
        others = [p for p in SOURCES if p != ROOT / module and internal in p.read_text("utf-8")]
        assert others == [], f"{internal} is used outside its owner {module}"
