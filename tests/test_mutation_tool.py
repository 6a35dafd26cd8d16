"""tools/mutate_domain.py: it reaches the event bodies, judges message text apart, and its
allow-list names only mutants that exist.

Running the mutants takes minutes and stays a developer's step; what is checked here is
what a run relies on: the mutants are valid Python that differs from the code, the working
tree is never written, and a stale allow-list entry is noticed on every test run.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "mutate_domain.py"


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutate_domain", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutate_domain"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


tool = load_tool()


@functools.cache
def mutants_of(file: str) -> tuple[object, ...]:
    return tuple(tool.collect(file))


def test_event_bodies_and_decorated_methods_are_mutated() -> None:
    idents = {m.ident for m in mutants_of("domain/delivery/obligation.py")}
    late = "domain/delivery/obligation.py::DeliveryObligation.LateResultReported.apply: "
    assert late + "delete 'obligation.marker = self.marker_after(obligation.marker)'" in idents
    retry = "domain/delivery/obligation.py::DeliveryObligation.owed_again: "
    assert retry + "delete 'self.recovery_attempts = 0'" in idents
    rule = {m.ident for m in mutants_of("domain/delivery/marker.py")}
    assert (
        "domain/delivery/marker.py::SendFact.late_result: "
        + ("== -> != in 'outcome == 'delivered''")
        in rule
    )
    content = "domain/values.py::require_content: "
    values = {m.ident for m in mutants_of("domain/values.py")}
    assert any(i.startswith(content + "and -> or in 'len(text) * 4") for i in values)


def test_every_mutant_is_valid_python_that_changes_the_program() -> None:
    for file in tool.DEFAULT_TARGETS:
        source = (ROOT / file).read_bytes()
        mutants: tuple[Any, ...] = mutants_of(file)
        assert mutants, file
        assert [m for m in mutants if m.status == "invalid"] == []  # parsed by collect()
        mutated = {m.apply(source) for m in mutants}
        assert len(mutated) == len(mutants) and source not in mutated
        assert len({m.ident for m in mutants}) == len(mutants), file  # ids are unique
    sample = mutants_of("domain/sessions/route.py")[0]
    assert isinstance(ast.parse(sample.apply((ROOT / sample.file).read_bytes())), ast.Module)


def test_error_message_text_is_told_apart_from_behaviour() -> None:
    by_id = {m.ident: m for m in mutants_of("domain/delivery/obligation.py")}
    message = [m for m in by_id.values() if m.error_text]
    assert message and all(m.file == "domain/delivery/obligation.py" for m in message)
    # Pinned in record and in the marker rule: both are the core of the ledger (the ask to
    # deliver a reply; when a re-send is labelled), not helpers that edits move around.
    obligation = "domain/delivery/obligation.py::DeliveryObligation."
    name_arg = obligation + "record: 'session_key' -> 'XXsession_keyXX'"
    assert by_id[name_arg].error_text is True
    rule = {m.ident: m for m in mutants_of("domain/delivery/marker.py")}
    outcome = "domain/delivery/marker.py::SendFact.late_result: 'delivered' -> 'XXdeliveredXX'"
    assert rule[outcome].error_text is False


def _module_caps(tree: ast.Module) -> list[ast.Constant]:
    """The numbers in the module-level ``MAX_*`` limits (whatever they are called today)."""
    return [
        number
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id.startswith("MAX_") for t in node.targets)
        for number in ast.walk(node.value)
        if isinstance(number, ast.Constant) and type(number.value) is int
    ]


def _message_helpers() -> set[str]:
    """The helpers whose first argument only words an error, found by the domain's own
    convention: a validator in values.py takes the ``name`` of what it checks first, and an
    aggregate's refusal takes the ``transition`` it refuses."""
    found = set()
    values = ast.parse((ROOT / "domain" / "values.py").read_bytes())
    for node in values.body:
        if isinstance(node, ast.FunctionDef) and [a.arg for a in node.args.args[:1]] == ["name"]:
            found.add(node.name)
    for file in tool.DEFAULT_TARGETS:
        tree = ast.parse((ROOT / file).read_bytes())
        methods = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        found.update(
            m.name for m in methods if [a.arg for a in m.args.args[:2]] == ["self", "transition"]
        )
    return found


def _message_names(tree: ast.Module, helpers: set[str]) -> list[ast.Constant]:
    """The literal first arguments handed to those helpers."""
    return [
        node.args[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and tool._call_name(node) in helpers
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ]


def test_limits_are_behaviour_and_names_for_messages_are_text_in_every_domain_file() -> None:
    """Found by what they are, not by where they stand, so an edit elsewhere keeps it valid:
    changing a size limit is behaviour, and the name handed to ``require_clear_text`` and its
    kin only words an error."""
    helpers = _message_helpers()
    assert {"require_text", "require_clear_text", "check_state"} <= helpers
    caps = names = 0
    for file in tool.DEFAULT_TARGETS:
        source = (ROOT / file).read_bytes()
        tree = ast.parse(source)
        starts = [0]
        for line in source.splitlines(keepends=True):
            starts.append(starts[-1] + len(line))
        at = {(m.start, m.end): m for m in mutants_of(file)}

        def mutant_at(node: ast.expr, at: Any = at, starts: list[int] = starts) -> Any:
            start = starts[node.lineno - 1] + node.col_offset
            end = starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[operator]
            return at[(start, end)]

        for cap in _module_caps(tree):
            assert mutant_at(cap).error_text is False, file
            caps += 1
        for name in _message_names(tree, helpers):
            assert mutant_at(name).error_text is True, (file, name.value)
            names += 1
    assert caps >= 3 and names >= 10  # MAX_CONTENT_BYTES and the input caps; many names


def test_every_allow_list_entry_names_an_existing_mutant_with_a_reason() -> None:
    allow = tool.read_allow_list(tool.ALLOW_LIST)
    assert allow
    existing = {m.ident for f in tool.DEFAULT_TARGETS for m in mutants_of(f)}
    stale = sorted(set(allow) - existing)
    assert stale == [], "allow-listed mutants that no longer exist: review the list"
    assert all(len(reason) > 20 for reason in allow.values())


def test_listing_runs_nothing_and_leaves_the_tree_alone() -> None:
    before = {p: p.read_bytes() for p in (ROOT / "domain").rglob("*.py")}
    out = subprocess.run(
        [sys.executable, str(TOOL), "--list", "domain/sessions/route.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "domain/sessions/route.py::SessionRoute._rotated: delete 'self.rotations += 1'" in out
    assert out.rstrip().splitlines()[-1].endswith("message-text left out")
    assert {p: p.read_bytes() for p in (ROOT / "domain").rglob("*.py")} == before


def test_a_file_outside_domain_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, str(TOOL), "--list", "application/delivery/ledger.py"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "not a file under domain/" in done.stderr
