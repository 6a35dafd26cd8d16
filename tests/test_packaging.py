"""What ``pip install .`` really puts into site-packages, and the real console script.

The project is copied first (without .venv and caches) so the build leaves nothing in the
working tree. The install target is listed: only ``gateway_ledger``, its dist-info and the
console script may appear, never a top-level ``domain`` or ``infrastructure`` (ADR 0003).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IGNORE = shutil.ignore_patterns(
    ".venv", ".git", "__pycache__", "*.egg-info", "build", "dist", ".*_cache", ".hypothesis"
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("pkg")
    source, target = work / "src", work / "target"
    shutil.copytree(ROOT, source, symlinks=True, ignore=IGNORE)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), "."],
        cwd=source,
        check=True,
        capture_output=True,
        text=True,
    )
    return target


def test_install_adds_only_the_gateway_ledger_namespace(installed: Path) -> None:
    entries = sorted(p.name for p in installed.iterdir())
    assert entries == ["bin", "gateway_ledger", "gateway_ledger-0.5.0.dist-info"]
    assert sorted(p.name for p in (installed / "bin").iterdir()) == ["gateway-ledger"]
    package = installed / "gateway_ledger"
    for layer in ("domain", "application", "projections", "infrastructure", "entrypoints"):
        assert (package / layer).is_dir() and not (package / layer).is_symlink(), layer
    assert (package / "domain" / "delivery" / "obligation.py").is_file()
    assert (package / "py.typed").is_file()
    assert not list(package.rglob("test_*.py"))


def test_demo_through_the_installed_console_script(installed: Path, tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    env = {**os.environ, "PYTHONPATH": str(installed)}
    out = subprocess.run(
        [sys.executable, str(installed / "bin" / "gateway-ledger"), "demo", "--json", "--db", db],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=tmp_path,  # not the source tree: the installed copy must be what runs
    ).stdout
    report = json.loads(out)
    history = report["history"]
    assert [h["type"] for h in history] == [
        "Recorded",
        "Attempting",
        "Failed",
        "Attempting",
        "Delivered",
    ]
    stamps = [datetime.fromisoformat(h["timestamp"]) for h in history]
    assert all(s.tzinfo is not None for s in stamps) and stamps == sorted(stamps)
    assert report["db"] == str(db) and db.is_file()
