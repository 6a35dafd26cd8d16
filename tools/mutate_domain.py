#!/usr/bin/env python3
"""Mutation testing of ``domain/``: run it before touching the domain, and after.

Each mutant is one small change to the code (an operator swapped, a constant changed, a
statement deleted, a condition negated), including inside decorated functions and the
``@event`` bodies, which mutmut skips. A mutant the tests still pass is a behaviour no test
pins down. mutmut is not used: it skips decorated functions, and every ``@event`` body is
one; this runner is small enough to read and has no dependency of its own.

How it runs. The repository is copied (without .git and .venv) into one temporary sandbox
per job; the sandbox, never the working tree, receives each mutated file, so an interrupted
run leaves nothing to restore. ``PYTHONPATH`` points at the sandbox, so the tests and any
child process they start (the console script too) import the mutated code. Each mutant
runs the fast domain tests first (pure aggregates plus the SQLite state machine; PostgreSQL
deselected; stop at the first failure); with ``--full`` the survivors then run the whole
SQLite suite. Hypothesis runs derandomized and without its example database, so a run is
reproducible and one mutant's failing example never leaks into the next.

What is not counted. Error-message text (string constants and expressions inside a
``raise``, and the name and transition arguments that only feed a message) is skipped
unless ``--error-text``. Mutants judged equivalent (or message-only in a way the classifier
cannot see) are listed in ``tools/mutation-equivalent.txt``, one per line as
``<mutant id>  ## <reason>``; they are still run, so an entry that a test starts killing
is reported as stale.

Usage::

    .venv/bin/python tools/mutate_domain.py                      # every domain file, fast tests
    .venv/bin/python tools/mutate_domain.py domain/delivery/obligation.py --full
    .venv/bin/python tools/mutate_domain.py --list domain/values.py   # the mutants, not run
    .venv/bin/python tools/mutate_domain.py --only arrived_before --show
    .venv/bin/python tools/mutate_domain.py --allowed --full   # re-judge the allow-list
    .venv/bin/python tools/mutate_domain.py --budget 600       # stop starting mutants at 10 min

Each job is one sandbox and one long-lived runner process that imports the libraries once
and forks a pytest per mutant (started under ``nice``; ``--jobs`` is 1 or 2, the machine is
shared). A mutant whose tests run past four times the unmutated time counts as killed.

Exit status: 0 when no mutant outside the allow-list survived, 1 otherwise, 2 on a usage
error or when the unmutated tests fail in the sandbox.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALLOW_LIST = ROOT / "tools" / "mutation-equivalent.txt"
DEFAULT_TARGETS = sorted(
    str(p.relative_to(ROOT))
    for p in sorted((ROOT / "domain").rglob("*.py"))
    if p.name not in ("__init__.py", "errors.py")  # errors.py is message text only
)
FAST_TESTS = [
    # Pure domain tests first (a kill there costs a second), the SQLite state machine last.
    "tests/test_obligation_rules.py",
    "tests/test_obligation_domain.py",
    "tests/test_obligation_marker.py",
    "tests/test_session_policy_bounds.py",
    "tests/test_session_policy.py",
    "tests/test_session_keys.py",
    "tests/test_upstream_domain.py",
    "tests/test_upstream_sessions.py",
    "tests/test_domain_values.py",
    "tests/test_retention_rule.py",
    "tests/test_session_aggregates.py",
    "tests/test_obligation_stateful.py",
]
RUN_FIRST = {  # the tests most likely to kill a mutant of each file run before the others
    "domain/delivery/marker.py": ["tests/test_obligation_marker.py"],
    "domain/sessions/policy.py": ["tests/test_session_policy_bounds.py"],
    "domain/sessions/key.py": ["tests/test_session_keys.py"],
    "domain/sessions/whatsapp.py": ["tests/test_upstream_sessions.py"],
    "domain/sessions/source.py": ["tests/test_session_keys.py"],
    "domain/privacy/hashing.py": ["tests/test_domain_values.py", "tests/test_session_keys.py"],
    "domain/values.py": ["tests/test_domain_values.py"],
    "domain/sessions/session.py": ["tests/test_session_aggregates.py"],
    "domain/sessions/route.py": ["tests/test_session_aggregates.py"],
    "domain/privacy/erasure.py": ["tests/test_session_aggregates.py"],
}
NOT_POSTGRES = "not postgres"
NOT_IN_FULL = ["tests/test_mutation_tool.py"]  # it reads domain/ itself: any mutant fails it
SANDBOX_IGNORE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "__pycache__",
    ".hypothesis",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    "*.egg-info",
    "build",
    "dist",
    "*.db",
    "*.db-wal",
    "*.db-shm",
)
PROFILE_PLUGIN = "_mutation_hypothesis_profile"
PROFILE_SOURCE = """\
import os

from hypothesis import settings

settings.register_profile("mutation", derandomize=True, database=None, print_blob=False)
settings.load_profile("mutation")


def _note(nodeid):
    path = os.environ.get("MUTATION_FAILURES")
    if path:
        with open(path, "a", encoding="utf-8") as failures:
            failures.write(nodeid + "\\n")


def pytest_runtest_logreport(report):
    if report.failed:
        _note(report.nodeid)


def pytest_collectreport(report):
    if report.failed:
        _note(report.nodeid)
"""

# Calls whose arguments (by position; None: all) only make an error message.
ERROR_TEXT_ARGS: dict[str, tuple[int, ...] | None] = {
    "InvalidInput": None,
    "IllegalTransition": None,
    "_refuse": None,
    "check_state": (0,),
    "check_open": (0,),
    "require_text": (0,),
    "require_clear_text": (0,),
    "require_content": (0,),
    "require_choice": (0,),
    "require_metadata": (0,),
    "check_not_quarantined": (0,),
    "check_freshly_recorded": (0,),
    "check_holder": (0,),
    "require_wait": (0,),
    "require_aware": (0,),
    "require_json_like": (0,),
    "optional_text": (0,),
    "_text": (0,),
    "_clear_text": (0,),
}

BINOP_SWAPS: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Mult,
    ast.Pow: ast.Mult,
}
COMPARE_SWAPS: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
SYMBOL = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Pow: "**",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.And: "and",
    ast.Or: "or",
}
DELETABLE = (
    ast.Assign,
    ast.AugAssign,
    ast.AnnAssign,
    ast.Expr,
    ast.Raise,
    ast.Return,
    ast.Delete,
    ast.Assert,
)


# -- mutants ------------------------------------------------------------------------------


@dataclass
class Mutant:
    file: str
    line: int
    ident: str  # stable across edits elsewhere in the file: file::qualname: change
    start: int  # byte offsets of the replaced span in the original file
    end: int
    replacement: bytes
    error_text: bool
    status: str = "not run"  # killed | survived | timeout | invalid | not run
    by: str = ""  # "fast" or "full": which run killed it
    seconds: float = 0.0
    flaky: list[str] = field(default_factory=list)  # failed without the mutant too

    @property
    def killed(self) -> bool:
        return self.status in ("killed", "timeout")

    def apply(self, source: bytes) -> bytes:
        return source[: self.start] + self.replacement + source[self.end :]


def _short(node: ast.AST, limit: int = 70) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class _Ctx:
    qualname: str = ""
    error_text: bool = False
    anchor: ast.expr | None = None  # outermost f-string around the node (3.11 positions)
    path: tuple[tuple[str, int | None], ...] = ()  # from the anchor to the node


@dataclass
class _Collector:
    file: str
    source: bytes
    line_starts: list[int] = field(default_factory=list)
    found: list[Mutant] = field(default_factory=list)

    def __post_init__(self) -> None:
        pos = 0
        for line in self.source.splitlines(keepends=True):
            self.line_starts.append(pos)
            pos += len(line)
        self.line_starts.append(pos)

    def offset(self, line: int, col: int) -> int:
        return self.line_starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (
            self.offset(node.lineno, node.col_offset),  # type: ignore[attr-defined]
            self.offset(node.end_lineno, node.end_col_offset),  # type: ignore[attr-defined]
        )

    def add(self, ctx: _Ctx, node: ast.AST, change: str, replacement: str, *, err: bool) -> None:
        start, end = self.span(node)
        where = ctx.qualname or "<module>"
        self.found.append(
            Mutant(
                file=self.file,
                line=node.lineno,  # type: ignore[attr-defined]
                ident=f"{self.file}::{where}: {change}",
                start=start,
                end=end,
                replacement=replacement.encode("utf-8"),
                error_text=err,
            )
        )

    def expr(
        self,
        ctx: _Ctx,
        node: ast.expr,
        change: str,
        mutate: Callable[[ast.expr], ast.expr],
    ) -> None:
        """A mutant replacing ``node`` with ``mutate(copy of node)``, written back as source.

        Inside an f-string the whole f-string is re-written: Python 3.11 gives nodes inside
        one unreliable positions.
        """
        if ctx.anchor is None:
            text = ast.unparse(mutate(copy.deepcopy(node)))
            self.add(ctx, node, change, f"({text})", err=ctx.error_text)
            return
        anchor = copy.deepcopy(ctx.anchor)
        parent: ast.AST | None = None
        target: ast.AST = anchor
        step: tuple[str, int | None] | None = None
        for step in ctx.path:
            parent = target
            name, index = step
            child = getattr(target, name)
            target = child if index is None else child[index]
        new = mutate(target)  # type: ignore[arg-type]
        if parent is None or step is None:
            anchor = new
        elif step[1] is None:
            setattr(parent, step[0], new)
        else:
            getattr(parent, step[0])[step[1]] = new
        self.add(ctx, ctx.anchor, change, f"({ast.unparse(anchor)})", err=ctx.error_text)

    # -- the walk ---------------------------------------------------------------------------

    def walk(self, node: ast.AST, ctx: _Ctx, *, module_level: bool = False) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom | ast.Global | ast.Nonlocal):
            return
        if _is_docstring(node):
            return  # a docstring, or an attribute's docstring after it: documentation
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            self.scope(node, ctx)
            return
        if isinstance(node, ast.stmt):
            self.statement(node, ctx, module_level=module_level)
        if isinstance(node, ast.expr):
            self.expression(node, ctx)
        self.children(node, ctx)

    def children(self, node: ast.AST, ctx: _Ctx) -> None:
        for name, value in ast.iter_fields(node):
            if name in ("annotation", "returns", "type_comment"):
                continue  # annotations are never evaluated (from __future__ import annotations)
            items = value if isinstance(value, list) else [value]
            for index, child in enumerate(items):
                if not isinstance(child, ast.AST):
                    continue
                sub = self.child_ctx(node, name, index if isinstance(value, list) else None, ctx)
                self.walk(child, sub)

    def child_ctx(self, node: ast.AST, name: str, index: int | None, ctx: _Ctx) -> _Ctx:
        err = ctx.error_text
        if isinstance(node, ast.Raise) and name == "exc":
            err = True
        if isinstance(node, ast.Call) and name == "args" and index is not None:
            positions = ERROR_TEXT_ARGS.get(_call_name(node), ())
            if positions is None or index in positions:
                err = True
        if (
            isinstance(node, ast.Call)
            and name == "keywords"
            and ERROR_TEXT_ARGS.get(_call_name(node), ()) is None
        ):
            err = True
        anchor, path = ctx.anchor, ctx.path
        if anchor is not None:
            path = (*path, (name, index))
        elif isinstance(node, ast.JoinedStr):
            anchor, path = node, ((name, index),)
        return _Ctx(ctx.qualname, err, anchor, path)

    def scope(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, ctx: _Ctx) -> None:
        qualname = f"{ctx.qualname}.{node.name}" if ctx.qualname else node.name
        inner = _Ctx(qualname, False)
        for decorator in node.decorator_list:
            self.walk(decorator, inner)
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                self.walk(base, inner)
        else:
            defaults = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
            for default in defaults:
                self.walk(default, inner)
        body = node.body
        if body and _is_docstring(body[0]):
            body = body[1:]
        for stmt in body:
            self.walk(stmt, inner)

    def statement(self, node: ast.stmt, ctx: _Ctx, *, module_level: bool) -> None:
        bare_annotation = isinstance(node, ast.AnnAssign) and node.value is None
        if isinstance(node, DELETABLE) and not module_level and not bare_annotation:
            first = _short(node).splitlines()[0]
            self.add(ctx, node, f"delete '{first}'", "pass", err=False)
        test = getattr(node, "test", None)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return  # negating ``not x`` is the "drop not" mutant again
        if isinstance(node, ast.If | ast.While | ast.Assert) and isinstance(test, ast.expr):
            sub = _Ctx(ctx.qualname, ctx.error_text, None, ())
            self.expr(sub, test, f"negate '{_short(test)}'", _negate)

    def expression(self, node: ast.expr, ctx: _Ctx) -> None:
        src = _short(node)
        if isinstance(node, ast.BoolOp):
            new_op = ast.Or if isinstance(node.op, ast.And) else ast.And

            def swap_bool(n: ast.expr, op: type[ast.boolop] = new_op) -> ast.expr:
                n.op = op()  # type: ignore[attr-defined]
                return n

            change = f"{SYMBOL[type(node.op)]} -> {SYMBOL[new_op]} in '{src}'"
            self.expr(ctx, node, change, swap_bool)
        elif isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                swapped = COMPARE_SWAPS.get(type(op))
                if swapped is None:
                    continue

                def swap_cmp(n: ast.expr, i: int = i, new: type[ast.cmpop] = swapped) -> ast.expr:
                    n.ops[i] = new()  # type: ignore[attr-defined]
                    return n

                change = f"{SYMBOL[type(op)]} -> {SYMBOL[swapped]} in '{src}'"
                self.expr(ctx, node, change, swap_cmp)
        elif isinstance(node, ast.BinOp) and type(node.op) in BINOP_SWAPS:
            new_bin = BINOP_SWAPS[type(node.op)]

            def swap_bin(n: ast.expr, op: type[ast.operator] = new_bin) -> ast.expr:
                n.op = op()  # type: ignore[attr-defined]
                return n

            change = f"{SYMBOL[type(node.op)]} -> {SYMBOL[new_bin]} in '{src}'"
            self.expr(ctx, node, change, swap_bin)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not | ast.USub):
            word = "not" if isinstance(node.op, ast.Not) else "unary -"
            self.expr(ctx, node, f"drop {word} in '{src}'", lambda n: n.operand)  # type: ignore[attr-defined]
        elif isinstance(node, ast.IfExp) and not (
            isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not)
        ):
            change = f"negate '{_short(node.test)}' in '{src}'"
            self.expr(_descend(ctx, "test", None), node.test, change, _negate)
        elif isinstance(node, ast.Constant):
            self.constant(node, ctx)
        if isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            for g, gen in enumerate(node.generators):
                for c, cond in enumerate(gen.ifs):
                    sub = _descend(_descend(ctx, "generators", g), "ifs", c)
                    self.expr(sub, cond, f"negate '{_short(cond)}'", _negate)

    def constant(self, node: ast.Constant, ctx: _Ctx) -> None:
        value = node.value
        new: bool | int | float | str
        if isinstance(value, bool):
            new = not value
        elif isinstance(value, int):
            new = {0: 1, 1: 0}.get(value, value + 1)
        elif isinstance(value, float):
            new = value + 1.0
        elif isinstance(value, str):
            new = f"XX{value}XX"
        else:
            return

        def replace(n: ast.expr, new: bool | int | float | str = new) -> ast.expr:
            return ast.Constant(new)

        self.expr(ctx, node, f"{value!r} -> {new!r}", replace)

    def statements(self, tree: ast.Module) -> None:
        body = tree.body[1:] if tree.body and _is_docstring(tree.body[0]) else tree.body
        for stmt in body:
            self.walk(stmt, _Ctx(), module_level=True)

    def make_unique(self) -> None:
        """Make identical descriptions unique by their order in the file."""
        seen: Counter[str] = Counter()
        for m in sorted(self.found, key=lambda m: (m.start, m.end)):
            seen[m.ident] += 1
            if seen[m.ident] > 1:
                m.ident = f"{m.ident} [{seen[m.ident]}]"


def _descend(ctx: _Ctx, name: str, index: int | None) -> _Ctx:
    """The context of a child of the node ``ctx`` describes (same message-text judgement)."""
    if ctx.anchor is None:
        return ctx
    return _Ctx(ctx.qualname, ctx.error_text, ctx.anchor, (*ctx.path, (name, index)))


def _call_name(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _is_docstring(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _negate(node: ast.expr) -> ast.expr:
    return ast.UnaryOp(ast.Not(), node)


def collect(file: str) -> list[Mutant]:
    """Every mutant of one file, in file order; no-op and duplicate mutants left out."""
    source = (ROOT / file).read_bytes()
    tree = ast.parse(source, filename=file)
    collector = _Collector(file, source)
    collector.statements(tree)
    collector.make_unique()
    seen: set[bytes] = set()
    result = []
    for m in sorted(collector.found, key=lambda m: (m.start, m.end, m.ident)):
        before = source[m.start : m.end]
        if m.replacement in (before, b"(" + before + b")"):
            continue  # written back unchanged
        mutated = m.apply(source)
        if mutated in seen:
            continue
        seen.add(mutated)
        try:
            compile(mutated, file, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
        except SyntaxError:
            m.status = "invalid"
        result.append(m)
    return result


# -- the allow-list -----------------------------------------------------------------------


def read_allow_list(path: Path) -> dict[str, str]:
    """``<mutant id>  ## <reason>`` per line; ``#`` lines and blank lines are comments."""
    entries: dict[str, str] = {}
    if not path.exists():
        return entries
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        ident, sep, reason = line.rpartition("  ## ")
        if not sep or not reason.strip():
            raise SystemExit(f"{path}:{number}: expected '<mutant id>  ## <reason>'")
        entries[ident.strip()] = reason.strip()
    return entries


# -- running ------------------------------------------------------------------------------


def make_sandbox(parent: Path, index: int) -> Path:
    box = parent / f"sandbox-{index}"
    shutil.copytree(ROOT, box, symlinks=True, ignore=SANDBOX_IGNORE)
    (box / f"{PROFILE_PLUGIN}.py").write_text(PROFILE_SOURCE, encoding="utf-8")
    return box


PREIMPORT = (
    "pytest",
    "_pytest.python",
    "hypothesis",
    "hypothesis.stateful",
    "attrs",
    "orjson",
    "sqlite3",
    "psycopg",
    "cryptography.hazmat.primitives.ciphers.aead",
    "eventsourcing.domain",
    "eventsourcing.application",
    "eventsourcing.persistence",
    "eventsourcing.sqlite",
    "eventsourcing.postgres",
    "eventsourcing.system",
)


def worker_loop(box: Path) -> None:
    """One job's test runner: imports the libraries once, then forks a pytest per request.

    Nothing of gateway_ledger is imported here, so every fork imports the sandbox's code as
    it is at that moment. Requests and answers are JSON lines on stdin and stdout.
    """
    import importlib
    import json

    for name in PREIMPORT:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    import pytest

    child = [0]

    def stop(signum: int, frame: object) -> None:
        if child[0]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child[0], signal.SIGKILL)
        os._exit(1)

    signal.signal(signal.SIGTERM, stop)
    answers = sys.stdout
    for line in sys.stdin:
        job = json.loads(line)
        started = time.monotonic()
        pid = os.fork()
        failures = box / ".mutation-failures"
        failures.unlink(missing_ok=True)
        if pid == 0:  # the test run
            os.setsid()  # its own process group: a timeout ends its children too
            os.environ["MUTATION_FAILURES"] = str(failures)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            code = 3
            try:
                code = int(pytest.main(job["args"]))
            finally:
                os._exit(code)
        child[0] = pid
        deadline = started + job["timeout"]
        outcome = ""
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                outcome = {0: "passed", 5: "no tests"}.get(code, "failed")
                break
            if time.monotonic() > deadline:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                outcome = "timeout"
                break
            time.sleep(0.02)
        child[0] = 0
        failed = failures.read_text(encoding="utf-8").split() if failures.exists() else []
        seconds = time.monotonic() - started
        answers.write(json.dumps({"outcome": outcome, "seconds": seconds, "failed": failed}))
        answers.write("\n")
        answers.flush()


class Worker:
    """A sandbox and its runner process, started under ``nice``."""

    def __init__(self, box: Path) -> None:
        self.box = box
        env = dict(os.environ, PYTHONPATH=str(box), PYTHONDONTWRITEBYTECODE="1")
        env.pop("GATEWAY_LEDGER_REQUIRE_POSTGRES", None)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(box)]
        if shutil.which("nice"):
            cmd = ["nice", "-n", "10", *cmd]
        self.proc = subprocess.Popen(
            cmd, cwd=box, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.failed: list[str] = []  # the tests that failed in the last run

    def run(
        self, tests: Sequence[str], timeout: float, *, stop_first: bool = True
    ) -> tuple[str, float]:
        """``passed``, ``failed`` or ``timeout``, and the seconds it took."""
        import json

        args = ["-q", "--no-header", "-p", "no:cacheprovider", "-p", PROFILE_PLUGIN]
        args += ["-k", NOT_POSTGRES, *(["-x"] if stop_first else []), *tests]
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"args": args, "timeout": timeout}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("a test runner process ended unexpectedly")
        answer = json.loads(line)
        self.failed = [str(nodeid) for nodeid in answer["failed"]]
        if answer["outcome"] == "no tests":
            raise SystemExit(f"no tests collected from {' '.join(tests)}")
        # failed: 1 a test failed; 2-4 collection or import broke (the mutant does not load)
        return answer["outcome"], answer["seconds"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # its handler ends a test run still going
        self.proc.wait()


def check_sandbox(box: Path) -> None:
    """The sandbox's code, not the working tree's, must be what the tests import."""
    env = dict(os.environ, PYTHONPATH=str(box), PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run(
        [sys.executable, "-c", "import gateway_ledger.domain.values as m; print(m.__file__)"],
        cwd=box,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not out.startswith(str(box)):
        raise SystemExit(f"the sandbox is not what gets imported ({out}); cannot mutate safely")


@dataclass
class Plan:
    fast: list[str]
    full: list[str] | None
    fast_timeout: float
    full_timeout: float
    deadline: float | None


def run_mutant(worker: Worker, m: Mutant, plan: Plan, sources: dict[str, bytes]) -> None:
    target = worker.box / m.file
    try:
        target.write_bytes(m.apply(sources[m.file]))
        first = [t for t in RUN_FIRST.get(m.file, []) if t in plan.fast]
        fast = [*first, *(t for t in plan.fast if t not in first)]
        outcome, seconds = worker.run(fast, plan.fast_timeout)
        m.seconds = seconds
        if outcome != "passed":
            m.status, m.by = ("timeout" if outcome == "timeout" else "killed"), "fast"
            return
        m.status = "survived"
        if plan.full is None or (plan.deadline is not None and time.monotonic() > plan.deadline):
            return
        outcome, seconds = worker.run(plan.full, plan.full_timeout)
        m.seconds += seconds
        if outcome == "timeout":
            m.status, m.by = "timeout", "full"
        elif outcome != "passed" and not worker.failed:
            m.status, m.by = "killed", "full"  # it broke before any test could report
        elif outcome != "passed":
            # The whole suite has timing-sensitive tests: a failure counts as a kill only
            # if the failing tests pass again on the unmutated code.
            target.write_bytes(sources[m.file])
            again, seconds = worker.run(worker.failed, plan.full_timeout, stop_first=False)
            m.seconds += seconds
            if again == "passed":
                m.status, m.by = "killed", "full"
            else:
                m.flaky = list(worker.failed)
    finally:
        target.write_bytes(sources[m.file])


def run_all(
    mutants: list[Mutant], workers: list[Worker], plan: Plan, sources: dict[str, bytes], show: bool
) -> None:
    todo: queue.Queue[Mutant] = queue.Queue()
    for m in mutants:
        todo.put(m)
    lock = threading.Lock()
    done = [0]
    total = len(mutants)

    def work(worker: Worker) -> None:
        while True:
            if stopping.is_set():
                return
            if plan.deadline is not None and time.monotonic() > plan.deadline:
                return
            try:
                m = todo.get_nowait()
            except queue.Empty:
                return
            run_mutant(worker, m, plan, sources)
            with lock:
                done[0] += 1
                if m.status == "survived" or show:
                    print(f"[{done[0]}/{total}] {m.status.upper():8} {m.file}:{m.line} {m.ident}")
                    if show:
                        print(f"    -> {m.replacement.decode()}")
                elif done[0] % 25 == 0:
                    print(f"[{done[0]}/{total}] ...", flush=True)
                sys.stdout.flush()

    stopping = threading.Event()
    threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in workers]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.5)
    except KeyboardInterrupt:
        stopping.set()
        print("\ninterrupted: ending the test runs; the working tree was never changed")
        raise


# -- report -------------------------------------------------------------------------------


def report(
    files: list[str],
    mutants: list[Mutant],
    skipped_text: Counter[str],
    allow: dict[str, str],
    elapsed: float,
) -> int:
    print()
    header = (
        f"{'file':28} {'mutants':>7} {'run':>5} {'killed':>6} {'surv':>5} "
        f"{'allowed':>7} {'kill %':>7} {'excl. %':>7} {'msg-text':>8}"
    )
    print(header)
    print("-" * len(header))
    unexplained = 0
    for file in files:
        mine = [m for m in mutants if m.file == file]
        ran = [m for m in mine if m.status in ("killed", "timeout", "survived")]
        killed = sum(m.killed for m in ran)
        survived = [m for m in ran if m.status == "survived"]
        allowed = [m for m in survived if m.ident in allow]
        unexplained += len(survived) - len(allowed)
        rate = 100.0 * killed / len(ran) if ran else 100.0
        judged = len(ran) - len(allowed)
        rate_excl = 100.0 * killed / judged if judged else 100.0
        print(
            f"{file:28} {len(mine):>7} {len(ran):>5} {killed:>6} {len(survived):>5} "
            f"{len(allowed):>7} {rate:>6.1f}% {rate_excl:>6.1f}% {skipped_text[file]:>8}"
        )
    flaky = sorted({t for m in mutants for t in m.flaky})
    if flaky:
        print("\nFailed in the whole suite without the mutant too (not counted as kills):")
        for nodeid in flaky:
            print(f"  {nodeid}")
    late_kills = [m for m in mutants if m.killed and m.by == "full"]
    if late_kills:
        print(f"\nKilled only by the whole SQLite suite ({len(late_kills)}; a fast test would be")
        print("quicker to run before touching the domain):")
        for m in late_kills:
            print(f"  {m.file}:{m.line} {m.ident}")
    not_run = [m for m in mutants if m.status == "not run"]
    invalid = [m for m in mutants if m.status == "invalid"]
    print(f"\n{len(mutants)} mutants in {elapsed:.0f} s", end="")
    print(f"; {len(not_run)} not run (time budget)" if not_run else "", end="")
    print(f"; {len(invalid)} not valid Python (ignored)" if invalid else "")
    allowed_seen = {m.ident: m for m in mutants}
    listed = [(i, r) for i, r in allow.items() if i in allowed_seen]
    if listed:
        print(f"\nAllow-listed as equivalent or message-only ({ALLOW_LIST.name}):")
        for ident, reason in listed:
            m = allowed_seen[ident]
            stale = "  <- now KILLED: remove it from the list" if m.killed else ""
            print(f"  {m.file}:{m.line} {ident}\n      {reason}{stale}")
    unknown = [i for i in allow if i not in allowed_seen and i.split("::")[0] in files]
    if unknown:
        print("\nAllow-list entries that match no mutant (the code changed; review them):")
        for ident in unknown:
            print(f"  {ident}")
    survivors = [m for m in mutants if m.status == "survived" and m.ident not in allow]
    if survivors:
        print(f"\n{len(survivors)} behaviour-changing mutant(s) survived:")
        for m in survivors:
            print(f"  {m.file}:{m.line} {m.ident}")
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Mutation testing of domain/ (see the module docstring)."
    )
    parser.add_argument("files", nargs="*", help="domain files (default: all but errors.py)")
    parser.add_argument("--full", action="store_true", help="survivors also run the SQLite suite")
    parser.add_argument("--budget", type=float, metavar="SECONDS", help="stop starting mutants")
    parser.add_argument("--jobs", "-j", type=int, default=2, help="parallel test runs (max 2)")
    parser.add_argument("--error-text", action="store_true", help="also mutate message text")
    parser.add_argument(
        "--only",
        metavar="TEXT",
        action="append",
        help="only mutants whose id contains TEXT (repeatable: any of them)",
    )
    parser.add_argument(
        "--allowed", action="store_true", help="only the allow-listed mutants (re-check them)"
    )
    parser.add_argument("--list", action="store_true", help="list the mutants; run nothing")
    parser.add_argument("--show", action="store_true", help="print every result and its code")
    args = parser.parse_args(argv)

    files = [str(Path(f)) for f in args.files] or DEFAULT_TARGETS
    for f in files:
        if not (ROOT / f).is_file() or not f.startswith("domain/"):
            parser.error(f"{f}: not a file under domain/ (paths are relative to {ROOT})")
    if not 1 <= args.jobs <= 2:
        parser.error("--jobs must be 1 or 2: the machine is shared")
    allow = read_allow_list(ALLOW_LIST)

    mutants: list[Mutant] = []
    skipped_text: Counter[str] = Counter()
    for f in files:
        for m in collect(f):
            if m.error_text and not args.error_text:
                skipped_text[f] += 1
                continue
            if args.only and not any(text in m.ident for text in args.only):
                continue
            if args.allowed and m.ident not in allow:
                continue
            mutants.append(m)
    if args.list:
        for m in mutants:
            tag = "  [allow-listed]" if m.ident in allow else ""
            print(f"{m.file}:{m.line} {m.ident}{tag}\n    -> {m.replacement.decode()}")
        print(f"{len(mutants)} mutants; {sum(skipped_text.values())} message-text left out")
        return 0

    try:
        import pytest  # noqa: F401
    except ImportError:
        print("pytest is not importable: run this with .venv/bin/python", file=sys.stderr)
        return 2
    fast = [t for t in FAST_TESTS if (ROOT / t).exists()]
    sources = {f: (ROOT / f).read_bytes() for f in files}
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _interrupt)  # a killed run still removes its sandboxes
    with tempfile.TemporaryDirectory(prefix="mutate-domain-") as tmp:
        boxes = [make_sandbox(Path(tmp), i) for i in range(args.jobs)]
        check_sandbox(boxes[0])
        workers = [Worker(box) for box in boxes]
        try:
            outcome, base_fast = workers[0].run(fast, 600, stop_first=False)
            if outcome != "passed":
                print("the fast tests fail without any mutant: fix them first", file=sys.stderr)
                return 2
            full: list[str] | None = None
            base_full = 0.0
            if args.full:
                full = ["tests", *(f"--ignore={t}" for t in NOT_IN_FULL)]
                outcome, base_full = workers[0].run(full, 3600, stop_first=False)
                if outcome != "passed":
                    print("the SQLite suite fails without any mutant: fix it", file=sys.stderr)
                    return 2
            print(
                f"{len(mutants)} mutants over {len(files)} file(s); fast tests {base_fast:.1f} s"
                + (f", SQLite suite {base_full:.0f} s" if args.full else "")
                + f"; {args.jobs} job(s)",
                flush=True,
            )
            plan = Plan(
                fast=fast,
                full=full,
                fast_timeout=base_fast * 4 + 20,
                full_timeout=base_full * 3 + 60,
                deadline=None if args.budget is None else started + args.budget,
            )
            valid = [m for m in mutants if m.status != "invalid"]
            run_all(valid, workers, plan, sources, args.show)
        except KeyboardInterrupt:
            return 130
        finally:
            for w in workers:
                w.close()
    return report(files, mutants, skipped_text, allow, time.monotonic() - started)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker_loop(Path(sys.argv[2]))
    else:
        sys.exit(main())
