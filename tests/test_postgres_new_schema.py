"""Gateways opening one new PostgreSQL store at once all open it (the schema's creation
races: PostgreSQL's ``CREATE SCHEMA IF NOT EXISTS`` lets all but one fail on the
catalog's unique name; a CI run of ``simulate --faults`` lost a worker to it)."""

from __future__ import annotations

import threading
import uuid

from gateway_ledger.infrastructure.eventstore.postgres import ensure_schema, parse_postgres_url
from tests.conftest import PG_BASE_URL, drop_postgres_schema, require_postgres


def create(params: dict[str, str], start: threading.Barrier, errors: list[BaseException]) -> None:
    start.wait()
    try:
        ensure_schema(params)
    except BaseException as e:  # collected: the assertion names them
        errors.append(e)


def test_processes_creating_one_new_schema_at_once_all_succeed() -> None:
    require_postgres()
    for _ in range(5):  # the race is narrow: several rounds, a fresh schema each
        url = f"{PG_BASE_URL}?schema=t_race_{uuid.uuid4().hex[:8]}"
        params = parse_postgres_url(url)
        start = threading.Barrier(8)
        errors: list[BaseException] = []

        threads = [threading.Thread(target=create, args=(params, start, errors)) for _ in range(8)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
        finally:
            drop_postgres_schema(url)
        assert errors == []
