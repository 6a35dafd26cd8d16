"""Importing an existing hermes-agent installation into a gateway-ledger store.

``import_hermes(path, db=...)`` (also ``gateway-ledger import hermes PATH``) reads the
installation (``infrastructure/importing/hermes.py``, read-only), then writes its session
keys with their sessions and messages (``SessionStore.import_keys``) and its owed replies
with their history (``application/delivery/importing.py``), sealed as every write is.
Run it again and it imports nothing new, and says so; a killed run is simply run again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
from eventsourcing.application import AggregateNotFoundError
from eventsourcing.persistence import PersistenceError

from gateway_ledger import bootstrap
from gateway_ledger.application.delivery.importing import RowsImported, import_rows
from gateway_ledger.application.sessions.importing import ImportedKey, key_aggregates
from gateway_ledger.application.sessions.keying import is_raw_keys_mode
from gateway_ledger.domain.errors import LedgerError
from gateway_ledger.domain.sessions.route import SessionKeying
from gateway_ledger.infrastructure.eventstore.store import store_environment
from gateway_ledger.infrastructure.importing.hermes import (
    HermesInstallation,
    SourceProblem,
    read_installation,
)
from gateway_ledger.infrastructure.ownership.liveness import this_host
from gateway_ledger.infrastructure.ownership.process_identity import boot_id

SOURCE = "hermes"
KEY_BATCH = 100


@attrs.frozen
class ImportReport:
    """What one import found, wrote and could not read (ids and counts, never bodies)."""

    source: str
    store: str
    dry_run: bool
    time_basis: str
    keying: str
    keys_found: int
    keys_imported: int
    keys_already_present: int
    sessions_imported: int
    messages_imported: int
    obligations_found: int
    obligations_imported: int
    obligations_already_present: int
    problems: tuple[SourceProblem, ...]
    elapsed_seconds: float

    @property
    def nothing_new(self) -> bool:
        return self.keys_imported == 0 and self.obligations_imported == 0

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self, recurse=False)
        data["problems"] = [p.to_dict() for p in self.problems]
        data["nothing_new"] = self.nothing_new
        return data

    def summary(self) -> str:
        verb = "would import" if self.dry_run else "imported"
        if self.nothing_new:
            head = f"nothing new to import from {self.source} (already imported)"
        else:
            head = (
                f"{verb} {self.keys_imported} session key(s) ({self.sessions_imported} "
                f"sessions, {self.messages_imported} messages) and {self.obligations_imported} "
                f"obligation(s) from {self.source}"
            )
        return (
            f"{head}\n  already present: {self.keys_already_present} key(s), "
            f"{self.obligations_already_present} obligation(s)\n  keys: {self.keying}\n"
            f"  times: {self.time_basis}\n  problems: {len(self.problems)}"
            f"\n  took {self.elapsed_seconds:.1f} s"
        )


def _keying(location: str | Path) -> str | None:
    """How the store's keys are made, if it has sessions yet (read without creating)."""
    peek = bootstrap.SessionKeyingPeek(env={**store_environment(location), "CREATE_TABLE": "n"})
    try:
        keying: Any = peek.repository.get(SessionKeying.create_id())
        return str(keying.mode)
    except (AggregateNotFoundError, PersistenceError):  # no record, or no table yet
        return None
    finally:
        peek.close()


def import_hermes(
    path: str | Path,
    *,
    db: str | Path,
    dry_run: bool = False,
    timezone: str | None = None,
    raw_keys: bool = False,
    secret_dir: str | Path | None = None,
) -> ImportReport:
    """Import the installation at ``path`` ($HERMES_HOME) into the store ``db``.

    Keys: a store that has sessions already keeps its keying; a new one takes upstream's
    raw keys with ``raw_keys=True``, else keyed hashes from here on. ``timezone``: the
    zone upstream's naive local times are read in (default: this machine's).
    """
    started = time.perf_counter()
    found = read_installation(path, timezone=timezone)
    refused: list[tuple[ImportedKey, str]] = []
    if dry_run and _absent(db):
        done, store_keys, result = _check_only(found, refused)
        keying = "raw upstream keys" if raw_keys else "keyed hashes"
    else:
        recorded = _keying(db)
        if recorded is not None:
            raw_keys = is_raw_keys_mode(recorded)
        store = bootstrap.SessionStore.open(db, raw_keys=raw_keys, secret_dir=secret_dir)
        try:
            done = []
            for start in range(0, len(found.keys), KEY_BATCH):
                batch = found.keys[start : start + KEY_BATCH]
                done.extend(store.import_keys(batch, dry_run=dry_run, refused=refused))
            store_keys = {k.key: store.key_of_imported(k) for k in found.keys}
            keying = "raw upstream keys" if store.hasher is None else "keyed hashes"
        finally:
            store.close()
        ledger = bootstrap.DeliveryLedger.open(db)
        try:
            rows = [
                attrs.evolve(r, session_key=store_keys.get(r.session_key, r.session_key))
                for r in found.rows
            ]
            result = import_rows(
                ledger,
                rows,
                host=this_host(),
                boot_id=boot_id(),
                source=SOURCE,
                now=datetime.now(UTC),
                dry_run=dry_run,
            )
        finally:
            ledger.close()
    problems = list(found.problems)
    problems.extend(SourceProblem(*k.origin, why) for k, why in refused)
    problems.extend(
        SourceProblem("state.db:delivery_obligations", oid, why) for oid, why in result.refused
    )
    return ImportReport(
        source=str(Path(path)),
        store=str(db),
        dry_run=dry_run,
        time_basis=found.time_basis,
        keying=keying,
        keys_found=len(found.keys),
        keys_imported=len(done),
        keys_already_present=len(found.keys) - len(done) - len(refused),
        sessions_imported=sum(len(k.sessions) for k, _ in done),
        messages_imported=sum(k.message_count for k, _ in done),
        obligations_found=len(found.rows),
        obligations_imported=len(result.imported),
        obligations_already_present=result.already_present,
        problems=tuple(problems),
        elapsed_seconds=round(time.perf_counter() - started, 3),
    )


def _absent(db: str | Path) -> bool:
    """A store file that is not there yet (a dry run then opens nothing, so creates
    nothing); a URL names a server, whose store is opened as for a real run."""
    return "://" not in str(db) and not Path(db).exists()


class _Nothing:
    """A ledger that holds nothing and takes nothing: what a dry run into no store checks
    against."""

    def exists(self, obligation_id: str) -> bool:
        return False

    def save(self, *aggregates: Any) -> None:
        raise AssertionError("a dry run saves nothing")


def _check_only(
    found: HermesInstallation, refused: list[tuple[ImportedKey, str]]
) -> tuple[list[tuple[ImportedKey, str]], dict[str, str], RowsImported]:
    """Every key and row built and checked as a live store would, without a store."""
    done = []
    for imported in found.keys:
        try:
            key_aggregates(imported, imported.key, lambda chat, message: (chat, message))
        except LedgerError as e:
            refused.append((imported, str(e)))
            continue
        done.append((imported, imported.key))
    result = import_rows(
        _Nothing(), found.rows, host=this_host(), boot_id=boot_id(), source=SOURCE,
        now=datetime.now(UTC), dry_run=True,
    )  # fmt: skip
    return done, {}, result


def problems_text(problems: Sequence[SourceProblem]) -> list[str]:
    return [f"  {p.file} [{p.item}]: {p.error}" for p in problems]
