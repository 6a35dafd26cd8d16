"""The top-level names a gateway author imports: each resolves, and to the real thing."""

from __future__ import annotations

import subprocess
import sys

import pytest

import gateway_ledger


@pytest.mark.parametrize("name", gateway_ledger.__all__)
def test_every_export_resolves(name: str) -> None:
    value = getattr(gateway_ledger, name)
    assert getattr(value, "__name__", name) == name


def test_unknown_names_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        gateway_ledger.nope  # noqa: B018


def test_importing_the_package_loads_no_store_code() -> None:
    code = "import sys, gateway_ledger; print('eventsourcing' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
