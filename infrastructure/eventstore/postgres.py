"""PostgreSQL as the event store: a ``postgresql://`` URL becomes the library's environment.

The URL's query may carry ``schema=NAME`` (default ``public``); the schema is created if
missing, so several installations (or test runs) can share one database.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import psycopg
from eventsourcing.persistence import (
    DatabaseError,
    DataError,
    IntegrityError,
    InterfaceError,
    InternalError,
    NotSupportedError,
    OperationalError,
    PersistenceError,
    ProgrammingError,
    StoredEvent,
)
from eventsourcing.postgres import PostgresApplicationRecorder
from eventsourcing.utils import retry
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.types.composite import register_composite

from gateway_ledger.domain.errors import InvalidInput, NotAStore
from gateway_ledger.infrastructure.privacy.key_table import (
    KEYS_TABLE,
    PG_REPLACE_TOMBSTONE,
    KeyRaceLost,
    NewKeyRow,
    erased_among,
)
from gateway_ledger.infrastructure.privacy.keyring import WriteKeys

_SCHEMA_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def parse_postgres_url(url: str) -> dict[str, str]:
    parsed = urlparse(url)
    if parsed.scheme not in ("postgresql", "postgres"):
        raise InvalidInput(f"not a postgresql:// URL: {url!r}")
    query = parse_qs(parsed.query)
    schema = query.get("schema", ["public"])[0]
    # fullmatch: ``$`` alone would let a trailing newline through (``?schema=evil%0A``).
    if not _SCHEMA_RE.fullmatch(schema):
        raise InvalidInput(f"invalid schema name {schema!r}")
    dbname = unquote(parsed.path.lstrip("/")) or "postgres"
    try:
        port = parsed.port or 5432
    except ValueError:
        raise InvalidInput(f"invalid port in the PostgreSQL URL (host {parsed.hostname})") from None
    return {
        "host": parsed.hostname or "127.0.0.1",
        "port": str(port),
        "user": unquote(parsed.username or "postgres"),
        "password": unquote(parsed.password or ""),
        "dbname": dbname,
        "schema": schema,
        "pool_size": query.get("pool_size", ["1"])[0],
    }


def connect(params: dict[str, str]) -> psycopg.Connection:
    return psycopg.connect(
        host=params["host"],
        port=int(params["port"]),
        user=params["user"],
        password=params["password"] or None,
        dbname=params["dbname"],
        autocommit=True,
        connect_timeout=5,
    )


STORE_TABLES = ("gateway_ledger_events", "gateway_sessions_events")
"""The library's events tables of the ledger and of the sessions: a schema holding
either is a gateway-ledger store."""


def require_postgres_store(url: str) -> None:
    """Refuse, creating nothing (not even the schema), a database or schema without a
    gateway-ledger store, and a server that does not answer: one line, no password."""
    params = parse_postgres_url(url)
    where = f"{params['host']}:{params['port']}/{params['dbname']}"
    names = [f'"{params["schema"]}"."{table}"' for table in STORE_TABLES]
    try:
        with connect(params) as conn:
            row = conn.execute(
                "SELECT " + ", ".join(["to_regclass(%s)"] * len(names)), names
            ).fetchone()
    except psycopg.Error as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise NotAStore(f"cannot open the PostgreSQL store at {where}: {reason}") from None
    if row is None or not any(row):
        raise NotAStore(
            f"no gateway-ledger store in schema {params['schema']} of {where} "
            "(not a gateway-ledger store)"
        )


def ensure_schema(params: dict[str, str]) -> None:
    """Create the store's schema unless it exists. Two processes opening a new store at
    once may both find it missing: PostgreSQL's ``IF NOT EXISTS`` then lets one of them
    fail on the catalog's unique name, which only means the other created it."""
    with connect(params) as conn:
        try:
            conn.execute(
                sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(params["schema"]))
            )
        except psycopg.errors.UniqueViolation:
            conn.rollback()
            found = conn.execute(
                "SELECT 1 FROM pg_namespace WHERE nspname = %s", (params["schema"],)
            ).fetchone()
            if found is None:
                raise


_CREATION_LOCK = 0x6761_7465  # "gate": one advisory lock id for all table creation


@contextmanager
def creation_lock(url: str) -> Iterator[None]:
    """Serialise table creation across processes opening a new schema at once.

    PostgreSQL's ``CREATE TABLE IF NOT EXISTS`` is not safe against a concurrent twin
    (it fails with "tuple concurrently updated" or a pg_type unique violation).
    """
    with connect(parse_postgres_url(url)) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_CREATION_LOCK,))
        try:
            yield
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_CREATION_LOCK,))


def postgres_environment(url: str) -> dict[str, str]:
    params = parse_postgres_url(url)
    ensure_schema(params)
    return {
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": params["dbname"],
        "POSTGRES_HOST": params["host"],
        "POSTGRES_PORT": params["port"],
        "POSTGRES_USER": params["user"],
        "POSTGRES_PASSWORD": params["password"],
        "POSTGRES_SCHEMA": params["schema"],
        "POSTGRES_POOL_SIZE": params["pool_size"],
        "POSTGRES_MAX_OVERFLOW": "8",
        "POSTGRES_CONNECT_TIMEOUT": "10",
        "POSTGRES_LOCK_TIMEOUT": "10",
        "POSTGRES_PRE_PING": "y",
    }


def environment_params(env: Mapping[str, str]) -> dict[str, str]:
    """The reverse of :func:`postgres_environment`: connection parameters for
    :func:`connect`, from an application's environment (for connections of our own)."""
    return {
        "host": env.get("POSTGRES_HOST", "127.0.0.1"),
        "port": env.get("POSTGRES_PORT", "5432"),
        "user": env.get("POSTGRES_USER", "postgres"),
        "password": env.get("POSTGRES_PASSWORD", ""),
        "dbname": env.get("POSTGRES_DBNAME", "postgres"),
    }


class KeyedPostgresApplicationRecorder(PostgresApplicationRecorder):
    """Stores a write's new key rows in the events' transaction (ADR 0023).

    The write's ``keys`` (a ``WriteKeys``) reach ``_insert_events`` through the library's
    ``insert_events(stored_events, **kwargs)``, the channel its own examples extend; the
    library calls it first in that transaction, before it locks the events table. A row
    for a subject whose key another writer stored meanwhile is skipped (``ON CONFLICT DO
    NOTHING``, after waiting for that writer's commit), and ``KeyRaceLost`` rolls the whole
    transaction back. Before that, the stored keys the events were sealed with are read
    ``FOR KEY SHARE``: an erasure's DELETE of one of them then waits for this commit (and
    its second pass abandons what it wrote), or it came first and ``SessionErased`` rolls
    this transaction back (ADR 0028). The one write path's usual write (stored keys only)
    sends that check with ``BEGIN`` and the lock statements instead (ADR 0066).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # With the library's database functions the hook below is never called.
        self.stores_keys = not self.datastore.enable_db_functions
        self._keys = sql.Identifier(self.datastore.schema, KEYS_TABLE)
        # Every statement of a write rendered once: psycopg renders a composed query
        # (``sql.SQL(...).format(...)``) again on each execute, about a quarter of the
        # writer thread's CPU in a one-reply commit (docs/performance.md, issue 21). The
        # stored events' array travels in binary (``%b``): the text form spells each
        # event's bytes out in hex, in Python, event by event.
        insert = _rendered(self.insert_events_statement).as_string(None)
        self.insert_events_statement = sql.Composed(
            [sql.SQL(insert.replace("unnest(%s", "unnest(%b"))]
        )
        self.lock_table_statements = [_rendered(q) for q in self.lock_table_statements]
        self._conn: psycopg.Connection[Any] | None = None
        self._registered = 0  # composite types registered on it
        self._write_lock = threading.Lock()
        # The group commit's write (``notification_ids=False``) reads no notification ids
        # back: the same INSERT without its RETURNING, and the same NOTIFY, rendered once.
        self._insert_unreturned = sql.SQL(
            insert.replace("unnest(%s", "unnest(%b").removesuffix(" RETURNING notification_id")
        )
        self._notify = sql.SQL(
            sql.SQL("NOTIFY {}").format(sql.Identifier(self.channel_name)).as_string(None)
        )
        # The statements before the INSERT that take no parameters (the library's lock
        # statements, then NOTIFY) as one text: sent with ``BEGIN`` in one round trip.
        self._locking = "; ".join(
            [_rendered(q).as_string(None) for q in self.lock_table_statements]
            + [self._notify.as_string(None)]
        )
        self._locking_sql = sql.SQL(self._locking)
        self._keys_in_use = (
            sql.SQL("SELECT subject_id, key_id FROM {} WHERE subject_id = ANY(")
            .format(self._keys)
            .as_string(None)
        )

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        """The library's write, for a caller that wants no notification ids back (the one
        write path's ``append``): the same statements in the same order in one transaction
        (the check of the used keys and the key rows, the table's lock, NOTIFY, the
        INSERT), on a connection of the recorder's own kept open, as the SQLite
        recorder's writes are, in a plain ``BEGIN`` ... ``COMMIT`` of three round trips
        where the write carries no new key rows (ADR 0066); without the pool's check-out
        and ping, the pipeline and transaction objects, and the INSERT's RETURNING read
        back into dicts (docs/performance.md, issue 21). A version already taken
        raises the library's ``IntegrityError``; a broken connection is dropped and the
        write retried as the library retries its own. Any other caller (and the
        library's database functions) gets the library's own write."""
        if kwargs.get("notification_ids", True) or self.datastore.enable_db_functions:
            ids: Sequence[int] | None = super().insert_events(stored_events, **kwargs)
            return ids
        if stored_events:
            self._append(stored_events, kwargs)
        return None

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)  # as the library's
    def _append(self, stored_events: Sequence[StoredEvent], kwargs: dict[str, Any]) -> None:
        """One attempt of the write (retried on a failed connection, as the library's)."""
        construct = self.construct_pg_stored_event
        events = [
            construct(e.originator_id, e.originator_version, e.topic, e.state)
            for e in stored_events
        ]
        keys: WriteKeys | None = kwargs.get("keys")
        used = keys.used if keys is not None else None
        # A write that carries only stored keys (a session's later writes): their check,
        # the lock statements and NOTIFY go with BEGIN, in one round trip (ADR 0066).
        # Anything more (new key rows, a tracking row, another keyword) goes through the
        # library's hook first, in the library's order.
        hooked = (keys is not None and bool(keys.rows)) or any(k not in _PLAIN for k in kwargs)
        opening = ["BEGIN"]
        if not hooked:
            if used:
                opening.append(self._live_keys_check(used))
            opening.append(self._locking)
        with self._write_lock:
            try:
                conn = self._connection()
                curs = conn.cursor()
                try:
                    curs.execute(sql.SQL("; ".join(opening)))
                    if hooked:
                        self._insert_events(curs, stored_events, **kwargs)
                        curs.execute(self._locking_sql)
                    elif used:
                        curs.nextset()  # the check's rows, after BEGIN's empty result
                        erased_among(used, [_pair(row) for row in curs.fetchall()])
                    curs.execute(self._insert_unreturned, (events,))
                    curs.execute(_COMMIT)
                except BaseException:
                    self._roll_back(conn)
                    raise
            except psycopg.Error as e:
                raise self._library_error(e) from e

    def _roll_back(self, conn: psycopg.Connection[Any]) -> None:
        """End a failed write's transaction; a connection that cannot is dropped."""
        try:
            if not conn.closed and conn.info.transaction_status != _IDLE:
                conn.execute(_ROLLBACK)
        except psycopg.Error:
            self._drop_connection()

    def _connection(self) -> psycopg.Connection[Any]:
        """The write connection, opened as the library's pool opens its connections
        (same parameters and rows, autocommit, its session settings), with the store's
        composite types registered."""
        conn = self._conn
        if conn is None or conn.closed:
            pool = self.datastore.pool
            params = pool.kwargs() if callable(pool.kwargs) else pool.kwargs
            # The pool's wait for a connection bounds the connect here (libpq: seconds).
            conn = self._conn = psycopg.Connection.connect(
                **{"connect_timeout": max(1, round(pool.timeout)), **(params or {})}
            )
            self.datastore.after_connect_func()(conn)
            self._registered = 0
        adapters = self.datastore.psycopg_type_adapters
        if self._registered != len(adapters):
            for info in adapters.values():
                if not conn.adapters.types.get(info.oid):
                    register_composite(info, conn)
            self._registered = len(adapters)
        return conn

    def _library_error(self, error: psycopg.Error) -> Exception:
        """The library's error for a psycopg one, as its connections raise them; a
        connection that failed (operational, interface) is dropped first."""
        if isinstance(error, psycopg.OperationalError | psycopg.InterfaceError):
            self._drop_connection()
        for psycopg_class, library_class in _LIBRARY_ERRORS:
            if isinstance(error, psycopg_class):
                return library_class(str(error))
        return PersistenceError(str(error))

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def _insert_events(
        self, curs: Any, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> None:
        """The library's hook, first in the write's transaction: the check of the used
        keys, then the new key rows (ADR 0023, 0028)."""
        keys: WriteKeys | None = kwargs.get("keys")
        if keys is not None and keys.used:
            curs.execute(sql.SQL(self._live_keys_check(keys.used)))
            erased_among(keys.used, [_pair(row) for row in curs.fetchall()])
        rows = keys.rows if keys is not None else ()
        if keys is not None and keys.replacing:
            rows = self._replace_tombstones(curs, rows, keys.replacing)
        if rows:
            curs.execute(
                sql.SQL(
                    "INSERT INTO {} (subject_id, key_id, wrapped, created_at) VALUES {} "
                    "ON CONFLICT DO NOTHING RETURNING subject_id"
                ).format(self._keys, sql.SQL(", ").join([sql.SQL("(%s, %s, %s, %s)")] * len(rows))),
                [value for row in rows for value in row],
            )
            if len(curs.fetchall()) != len(rows):
                raise KeyRaceLost
        super()._insert_events(curs, stored_events, **kwargs)

    def _replace_tombstones(
        self, curs: Any, rows: Sequence[NewKeyRow], replacing: Mapping[str, str]
    ) -> list[NewKeyRow]:
        """The new keys that take the place of the tombstones their write found (after an
        erasure, ADR 0071), one UPDATE each: ``KeyRaceLost`` if the tombstone is gone (an
        erasure or a writer replaced it meanwhile). Returns the other rows, to insert."""
        statement = sql.SQL(PG_REPLACE_TOMBSTONE).format(self._keys)
        for subject_id, key_id, wrapped, created_at in rows:
            if subject_id in replacing:
                curs.execute(
                    statement, (key_id, wrapped, created_at, subject_id, replacing[subject_id])
                )
                if curs.rowcount != 1:
                    raise KeyRaceLost
        return [row for row in rows if row[0] not in replacing]

    def _live_keys_check(self, used: Mapping[str, str]) -> str:
        """The stored keys of the subjects in ``used``, read ``FOR KEY SHARE`` (ADR 0028).
        Their ids are in the text as a quoted literal, so the check can travel with
        ``BEGIN`` and the lock statements in one round trip (ADR 0066)."""
        return f"{self._keys_in_use}{_text_array(sorted(used))}::text[]) FOR KEY SHARE"

    def close(self) -> None:
        """Close the write connection (the pool's are closed with the application)."""
        with self._write_lock:
            self._drop_connection()


_COMMIT = sql.SQL("COMMIT")
_PLAIN = frozenset({"keys", "notification_ids"})
"""What the one write path's write may carry and still skip the library's hook."""
_ROLLBACK = sql.SQL("ROLLBACK")
_IDLE = TransactionStatus.IDLE

_LIBRARY_ERRORS: tuple[tuple[type[psycopg.Error], type[Exception]], ...] = (
    (psycopg.InterfaceError, InterfaceError),
    (psycopg.OperationalError, OperationalError),
    (psycopg.DataError, DataError),
    (psycopg.IntegrityError, IntegrityError),
    (psycopg.InternalError, InternalError),
    (psycopg.ProgrammingError, ProgrammingError),
    (psycopg.NotSupportedError, NotSupportedError),
    (psycopg.DatabaseError, DatabaseError),
)
"""psycopg's errors and the library's, in the order its connections translate them."""


def _rendered(query: Any) -> Any:
    """A composed query as one literal ``sql.SQL`` (identifiers quoted now, no
    connection needed); a query already plain is returned as it is."""
    if isinstance(query, sql.Composed):
        return sql.SQL(query.as_string(None))
    return query


_HEX = re.compile(r"[0-9a-f]+\Z")


def _text_array(values: list[str]) -> str:
    """A quoted ``text[]`` literal of ``values``. Subject ids are hex digests (keyed
    names): written as they are; anything else is quoted by psycopg."""
    if all(_HEX.match(v) for v in values):
        return "'{" + ",".join(values) + "}'"
    return sql.Literal(values).as_string(None)


def _pair(row: Any) -> tuple[str, str]:
    if isinstance(row, Mapping):
        return str(row["subject_id"]), str(row["key_id"])
    return str(row[0]), str(row[1])
