"""The subject key table, in the same store as the events (SQLite or PostgreSQL).

One row per live data key: ``key_id``, the subject it belongs to (a keyed hash, never a
session key), and the key wrapped by the master key. Destroying a subject deletes its
rows so that no copy survives in the store's files: on SQLite with ``secure_delete``
and a WAL checkpoint that truncates the log; on PostgreSQL with ``VACUUM FULL``, which
rewrites the table (the server's WAL and backups are outside our reach, see ADR 0012).
That cleanup never holds the store's writers off for more than about a second: a reader
that keeps SQLite from truncating its WAL, or a transaction that keeps ``VACUUM FULL``
from its lock, leaves it pending, marked in the meta table, and the next erasure or
``finish_cleanup`` completes it (ADR 0028). The key itself is gone at once either way.

An erasure leaves a tombstone in the subject's place: a row whose ``key_id`` starts with
``erased-`` and whose ``wrapped`` is empty, new on every erasure (ADR 0071). A write that
creates a subject's key inserts it only where the write first found no row, or replaces
the very tombstone it first found; a write that finds a tombstone it did not first see
was overtaken by an erasure and is refused (``SessionErased``). The table's unique
subject serialises the two on both stores, as it serialises two creators of one key.

A new subject's key row is inserted in the same transaction as the events sealed with it,
by the recorder every write goes through, on both stores (ADRs 0017, 0019, 0023). Where no
such transaction can carry it (the library's database functions on PostgreSQL, or a
mapping outside a write), the row is written before the events, on a private connection
of the key table's own (one round trip per statement). On SQLite it commits with
``synchronous=NORMAL`` and on PostgreSQL with ``synchronous_commit=off``: both logs are
sequential, so the fsync of the event's own commit makes the earlier key row durable too.
"""

from __future__ import annotations

import contextlib
import functools
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson

from gateway_ledger.domain.errors import SessionErased

KEYS_TABLE = "gateway_ledger_subject_keys"
META_TABLE = "gateway_ledger_privacy_meta"
CLEANUP_PENDING = "erasure_cleanup_pending"
"""Meta row present while an erasure's cleanup (WAL truncation, VACUUM FULL) is owed."""
CLEANUP_TRIES = 20
CLEANUP_PAUSE = 0.05
"""SQLite: WAL truncation is tried this often, this far apart (about a second in all),
never waiting on a lock in between."""
VACUUM_LOCK_TIMEOUT = "1s"
"""PostgreSQL: how long ``VACUUM FULL`` may wait for its lock (writers queue behind it)."""
SQLITE_INSERT_KEY = (
    f"INSERT OR IGNORE INTO {KEYS_TABLE} (subject_id, key_id, wrapped, created_at) "
    "VALUES (?, ?, ?, ?)"
)
"""Ignored when the subject has a row already (a concurrent creator won, or an erasure)."""
SQLITE_REPLACE_TOMBSTONE = (
    f"UPDATE {KEYS_TABLE} SET key_id=?, wrapped=?, created_at=? WHERE subject_id=? AND key_id=?"
)
"""A new key in the place of the tombstone the write found (no row changed if another
erasure replaced that tombstone meanwhile, or another writer replaced it first)."""
TOMBSTONE_PREFIX = "erased-"
"""The ``key_id`` of a tombstone: what an erasure leaves in its subject's row (ADR 0071)."""


def is_tombstone(key_id: str) -> bool:
    """Whether a key table row is an erasure's tombstone, not a data key."""
    return key_id.startswith(TOMBSTONE_PREFIX)


def overtaken_by_erasure(
    seen: dict[str, str | None],
    subject_id: str,
    tombstone: str,
    erased_at: str,
    made_at: datetime | None,
) -> bool:
    """The one rule for a write that finds a ``tombstone`` in a subject's row, left by an
    erasure at ``erased_at`` (its clock, ISO 8601): the erasure overtook the write unless
    that tombstone is what the write first found there and the event being sealed was made
    (``made_at``, its timestamp) after the erasure.

    ``seen`` holds, per subject, what the write found first, across its attempts: the key
    it sealed with, the tombstone, or None for no row. The first test is exact: the
    erasure came between the write's sealing and its commit. The second covers a reply
    made before the erasure and sealed after it (a writer's queue, a paused process): it
    belongs to the conversation the user asked to forget. Anything else is new data,
    sealed under a new key that takes the tombstone's place (ADR 0071).
    """
    if seen.setdefault(subject_id, tombstone) != tombstone:
        return True
    return made_before_erasure(made_at, erased_at)


def made_before_erasure(made_at: datetime | None, erased_at: str) -> bool:
    """Whether something made at ``made_at`` (None: not known) belongs to the
    conversation an erasure at ``erased_at`` (a tombstone's time, ISO 8601) forgot."""
    return made_at is not None and made_at < datetime.fromisoformat(erased_at)


PG_REPLACE_TOMBSTONE = (
    "UPDATE {} SET key_id=%s, wrapped=%s, created_at=%s WHERE subject_id=%s AND key_id=%s"
)
"""PostgreSQL's :data:`SQLITE_REPLACE_TOMBSTONE` (the table's name formatted in)."""
DESTROY_TRIES = 20
"""PostgreSQL: times an erasure deletes again when a first key committed under it."""


def tombstone_row(subject_id: str, erased_at: datetime | None) -> tuple[str, str, bytes, str]:
    """A new tombstone for the subject, as inserted: (subject_id, key_id, wrapped, created_at),
    ``created_at`` the erasure's time (now, if not given). Its id is new on every erasure,
    so a write can tell one erasure from the next."""
    key_id = TOMBSTONE_PREFIX + secrets.token_hex(12)
    return subject_id, key_id, b"", (erased_at or datetime.now(UTC)).isoformat()


NewKeyRow = tuple[str, str, bytes, str]
"""(subject_id, key_id, wrapped key, created_at): a key table row, as inserted."""


class KeyRaceLost(Exception):
    """Another writer stored a key for one of the new subjects first: seal again with it."""


def insert_staged_keys(
    cursor: sqlite3.Cursor,
    rows: Sequence[tuple[Any, ...]],
    replacing: Mapping[str, str] | None = None,
) -> None:
    """Insert new key rows in the caller's transaction, before the events sealed with them;
    a subject in ``replacing`` (subject -> tombstone id) replaces that tombstone instead.

    Raises ``KeyRaceLost`` if one was ignored (another writer or an erasure changed the
    subject's row first); the caller's transaction must then roll back.
    """
    if not rows:
        return
    if replacing:
        fresh = [row for row in rows if row[0] not in replacing]
        for subject_id, key_id, wrapped, created_at in (r for r in rows if r[0] in replacing):
            replaced = cursor.execute(
                SQLITE_REPLACE_TOMBSTONE,
                (key_id, wrapped, created_at, subject_id, replacing[subject_id]),
            )
            if replaced.rowcount != 1:
                raise KeyRaceLost
        rows = fresh
    if rows and cursor.executemany(SQLITE_INSERT_KEY, rows).rowcount != len(rows):
        raise KeyRaceLost


def erased_among(used: Mapping[str, str], stored: Iterable[tuple[str, str]]) -> None:
    """Raise ``SessionErased`` for each subject whose key ``used`` (subject -> key id) is
    not among the ``stored`` (subject, key id) rows read in the writer's transaction."""
    gone = set(used)
    for subject, key_id in stored:
        if used.get(subject) == key_id:
            gone.discard(subject)
    if gone:
        raise SessionErased(tuple(sorted(gone)))


def require_live_keys(cursor: sqlite3.Cursor, used: Mapping[str, str]) -> None:
    """In the caller's write transaction: every key the events were sealed with is still
    stored (one primary-key lookup per 500 subjects), else ``SessionErased`` and the
    caller rolls back. ``BEGIN IMMEDIATE`` serialises this with an erasure's DELETE, so
    a key destroyed before the commit is always seen (ADR 0028)."""
    if not used:
        return
    rows = []
    for chunk in _chunks(sorted(used)):
        rows += cursor.execute(_select_keys_of(len(chunk)), chunk).fetchall()
    erased_among(used, rows)


LIVE_KEYS_CONDITION = (
    f"(SELECT count(*) FROM json_each(?) AS used JOIN {KEYS_TABLE} AS stored"
    " ON stored.subject_id = used.key AND stored.key_id = used.value) = ?"
)
"""The same rule as ``require_live_keys``, as a condition of the statement that writes the
events (SQLite, one statement, its own transaction): true when every key ``used``
(subject -> key id, bound as a JSON object by ``live_keys_params``) is still stored. One
primary-key lookup per subject; the subquery does not depend on the rows, so SQLite
evaluates it once. When it is false nothing is written, and ``require_live_keys`` names
the subjects erased."""


def live_keys_params(used: Mapping[str, str]) -> tuple[str, int]:
    """What ``LIVE_KEYS_CONDITION`` is bound to for the keys ``used``."""
    return orjson.dumps(used).decode(), len(used)


@functools.lru_cache(maxsize=64)
def _select_keys_of(count: int) -> str:
    """The stored keys of ``count`` subjects (one statement text per count, reused)."""
    marks = ", ".join("?" * count)
    return f"SELECT subject_id, key_id FROM {KEYS_TABLE} WHERE subject_id IN ({marks})"


def _chunks(items: Sequence[str], size: int = 500) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


class KeyTable(Protocol):
    def get_meta(self, name: str) -> str | None: ...
    def put_meta_once(self, name: str, value: str) -> str: ...
    def probe_write(self) -> None: ...
    def find(self, subject_id: str) -> tuple[str, bytes, str] | None: ...
    def get(self, subject_id: str, key_id: str) -> bytes | None: ...
    def get_many(self, subject_ids: Sequence[str]) -> dict[str, tuple[str, bytes]]: ...
    def insert(self, row: NewKeyRow, replaces: str | None = None) -> bool: ...
    def destroy(self, subject_id: str, erased_at: datetime | None = None) -> list[str]: ...
    def finish_cleanup(self) -> bool: ...
    def rows(self) -> list[tuple[str, str, bytes]]: ...
    def originators_mentioning(self, topics: Sequence[str], needle: bytes) -> list[str]: ...
    def close(self) -> None: ...


class _OwnConnection:
    """A key table keeps a private connection, outside the store's pool, until closed."""

    _conn: Any
    _lock: threading.Lock

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def get_meta(self, name: str) -> str | None:
        raise NotImplementedError

    def _insert_meta_if_absent(self, name: str, value: str) -> None:
        raise NotImplementedError

    def put_meta_once(self, name: str, value: str) -> str:
        """The value stored under ``name``: ``value`` if none was. Read first: a store
        opened read-only has it already, and once stored it costs one read."""
        stored = self.get_meta(name)
        if stored is not None:
            return stored
        self._insert_meta_if_absent(name, value)
        stored = self.get_meta(name)
        assert stored is not None
        return stored


class SQLiteKeyTable(_OwnConnection):
    """A private connection to the store's file: secure_delete on, its own transactions."""

    def __init__(self, db_path: str, events_table: str, busy_timeout: float = 10.0) -> None:
        self.db_path = db_path
        self.events_table = events_table
        self.busy_timeout = busy_timeout
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self.last_checkpoint_complete: bool | None = None
        self.cleanup_pending = False
        """After ``destroy`` or ``finish_cleanup``: a copy of a destroyed key may remain."""

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            read_only = self.db_path.startswith("file:")  # store_environment's read-only URI
            conn = sqlite3.connect(
                self.db_path,
                timeout=self.busy_timeout,
                isolation_level=None,
                check_same_thread=False,
                uri=read_only,
            )
            conn.execute("PRAGMA secure_delete=ON")
            conn.execute("PRAGMA synchronous=NORMAL")
            if read_only:
                self._conn = conn  # the tables are there or the reads say so
                return conn
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {KEYS_TABLE} (subject_id TEXT PRIMARY KEY, "
                "key_id TEXT NOT NULL, wrapped BLOB NOT NULL, created_at TEXT NOT NULL) "
                "WITHOUT ROWID"
            )
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {META_TABLE} "
                "(name TEXT PRIMARY KEY, value TEXT NOT NULL)"
            )
            self._conn = conn
        return self._conn

    def _read(self, statement: str, params: Iterable[Any]) -> list[Any]:
        with self._lock:
            return self._connection().execute(statement, tuple(params)).fetchall()

    @contextlib.contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """One write transaction on the private connection, rolled back if the body raises."""
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _write(self, statements: Sequence[tuple[str, tuple[Any, ...]]]) -> int:
        """Run the statements in one write transaction; return the rows they changed."""
        with self._writing() as conn:
            before = conn.total_changes
            for statement, params in statements:
                conn.execute(statement, params)
            return conn.total_changes - before

    def get_meta(self, name: str) -> str | None:
        rows = self._read(f"SELECT value FROM {META_TABLE} WHERE name=?", (name,))
        return str(rows[0][0]) if rows else None

    def _insert_meta_if_absent(self, name: str, value: str) -> None:
        self._write([(f"INSERT OR IGNORE INTO {META_TABLE} VALUES (?, ?)", (name, value))])

    def probe_write(self) -> None:
        """Write a row and roll it back: raises where the store refuses writes (a read-only
        or immutable file), which opening it and reading never show."""
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(f"INSERT OR REPLACE INTO {META_TABLE} VALUES ('write_probe', '')")
            finally:
                conn.execute("ROLLBACK")

    def find(self, subject_id: str) -> tuple[str, bytes, str] | None:
        """The subject's row: (key_id, wrapped, created_at), a data key or a tombstone."""
        rows = self._read(
            f"SELECT key_id, wrapped, created_at FROM {KEYS_TABLE} WHERE subject_id=?",
            (subject_id,),
        )
        return (str(rows[0][0]), bytes(rows[0][1]), str(rows[0][2])) if rows else None

    def get(self, subject_id: str, key_id: str) -> bytes | None:
        rows = self._read(
            f"SELECT wrapped FROM {KEYS_TABLE} WHERE subject_id=? AND key_id=?",
            (subject_id, key_id),
        )
        return bytes(rows[0][0]) if rows else None

    def get_many(self, subject_ids: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        """The stored key of each subject that has one: ``{subject: (key_id, wrapped)}``."""
        found: dict[str, tuple[str, bytes]] = {}
        for chunk in _chunks(subject_ids):
            marks = ", ".join("?" * len(chunk))
            for subject, key_id, wrapped in self._read(
                f"SELECT subject_id, key_id, wrapped FROM {KEYS_TABLE} "
                f"WHERE subject_id IN ({marks})",
                chunk,
            ):
                found[str(subject)] = (str(key_id), bytes(wrapped))
        return found

    def insert(self, row: NewKeyRow, replaces: str | None = None) -> bool:
        """Store a new key where the subject has no row, or in the place of the tombstone
        ``replaces``, as a write's transaction would (:func:`insert_staged_keys`): True if
        ours (False: a concurrent creator or erasure came first)."""
        try:
            with self._writing() as conn:
                insert_staged_keys(conn.cursor(), [row], {row[0]: replaces} if replaces else None)
        except KeyRaceLost:
            return False
        return True

    def destroy(self, subject_id: str, erased_at: datetime | None = None) -> list[str]:
        """Delete, leave a new tombstone in the subject's place, zero the freed space, and
        truncate the WAL that still held the old page (or leave that pending, if a reader
        keeps it: see ``finish_cleanup``). Returns the ids of the data keys destroyed."""
        with self._lock:
            conn = self._connection()
            conn.execute("PRAGMA synchronous=FULL")
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    ids = [
                        str(r[0])
                        for r in conn.execute(
                            f"SELECT key_id FROM {KEYS_TABLE} WHERE subject_id=?", (subject_id,)
                        )
                        if not is_tombstone(str(r[0]))
                    ]
                    conn.execute(f"DELETE FROM {KEYS_TABLE} WHERE subject_id=?", (subject_id,))
                    conn.execute(SQLITE_INSERT_KEY, tombstone_row(subject_id, erased_at))
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            finally:
                conn.execute("PRAGMA synchronous=NORMAL")
            self._clean_up(conn)
        return ids

    def finish_cleanup(self) -> bool:
        """Truncate the WAL an earlier erasure could not; True when nothing is pending."""
        with self._lock:
            return self._clean_up(self._connection())

    def _clean_up(self, conn: sqlite3.Connection) -> bool:
        done = self._truncate_wal(conn, CLEANUP_TRIES)
        marked = (
            conn.execute(f"SELECT 1 FROM {META_TABLE} WHERE name=?", (CLEANUP_PENDING,)).fetchone()
            is not None
        )
        if done and marked:
            conn.execute(f"DELETE FROM {META_TABLE} WHERE name=?", (CLEANUP_PENDING,))
            self._truncate_wal(conn, 1)  # the WAL now holds only the meta page: best effort
        elif not done and not marked:
            conn.execute(
                f"INSERT OR IGNORE INTO {META_TABLE} VALUES (?, ?)",
                (CLEANUP_PENDING, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())),
            )
        self.last_checkpoint_complete = done
        self.cleanup_pending = not done
        return done

    def _truncate_wal(self, conn: sqlite3.Connection, tries: int) -> bool:
        """TRUNCATE needs a moment without readers. Tried without a busy timeout: waiting
        for readers inside the checkpoint would hold the write lock, and every writer,
        for as long (10 s a try before ADR 0028). Reports whether it ran."""
        conn.execute("PRAGMA busy_timeout=0")
        try:
            for attempt in range(tries):
                try:
                    busy, _log, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                except sqlite3.OperationalError as e:
                    if "locked" not in str(e) and "busy" not in str(e):
                        raise
                    busy = 1
                if busy == 0:
                    return True
                if attempt < tries - 1:
                    time.sleep(CLEANUP_PAUSE)
            return False
        finally:
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")

    def rows(self) -> list[tuple[str, str, bytes]]:
        return [
            (str(a), str(b), bytes(c))
            for a, b, c in self._read(f"SELECT key_id, subject_id, wrapped FROM {KEYS_TABLE}", ())
            if not is_tombstone(str(a))
        ]

    def originators_mentioning(self, topics: Sequence[str], needle: bytes) -> list[str]:
        marks = ",".join("?" * len(topics))
        rows = self._read(
            f"SELECT DISTINCT originator_id FROM {self.events_table} "
            f"WHERE topic IN ({marks}) AND instr(state, ?) > 0",
            (*topics, needle),
        )
        return [str(r[0]) for r in rows]


class PostgresKeyTable(_OwnConnection):
    """The key table in the store's schema, through one private autocommit connection.

    Not through the library's pool: a pool checkout pings the server and wraps each
    statement in BEGIN/COMMIT, four round trips where one does. The connection commits
    with ``synchronous_commit=off`` (the event's own commit makes the key row durable, see
    the module docstring); the erasure turns it back on for its DELETE.
    """

    def __init__(self, datastore: Any, events_table: str) -> None:
        from psycopg import sql

        self.sql = sql
        schema = datastore.schema
        self.connect_kwargs = dict(datastore.pool.kwargs)
        self.connect_kwargs.pop("row_factory", None)
        get_password = getattr(datastore.pool, "get_password_func", None)
        if get_password is not None:
            self.connect_kwargs["password"] = get_password()
        self.keys = sql.Identifier(schema, KEYS_TABLE)
        self.meta = sql.Identifier(schema, META_TABLE)
        self.events = sql.Identifier(schema, events_table)
        self._conn: Any = None
        self._lock = threading.Lock()
        self.cleanup_pending = False
        """After ``destroy`` or ``finish_cleanup``: the table may still hold a dead tuple."""

    def _connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            import psycopg

            conn = psycopg.connect(**self.connect_kwargs, autocommit=True, connect_timeout=10)
            if not self._tables_exist(conn):
                self._create_tables(conn)
            self._conn = conn
        return self._conn

    def _tables_exist(self, conn: Any) -> bool:
        """In one round trip: the connection's setting, and whether both tables exist
        already (every start but the store's first; the views check theirs alike)."""
        sql = self.sql
        cursor = conn.execute(
            sql.SQL(
                "SET synchronous_commit TO OFF; "
                "SELECT to_regclass({}) IS NOT NULL AND to_regclass({}) IS NOT NULL"
            ).format(sql.Literal(self.keys.as_string(conn)), sql.Literal(self.meta.as_string(conn)))
        )
        cursor.nextset()
        row = cursor.fetchone()
        return bool(row is not None and row[0])

    def _create_tables(self, conn: Any) -> None:
        sql = self.sql
        # Two processes opening a new store at once would race in the catalog ("tuple
        # concurrently updated"): serialise the creation on a transaction-level lock.
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('gateway_ledger_keys'))")
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (key_id TEXT PRIMARY KEY, subject_id "
                    "TEXT NOT NULL UNIQUE, wrapped BYTEA NOT NULL, created_at TEXT NOT NULL)"
                ).format(self.keys)
            )
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (name TEXT PRIMARY KEY, value TEXT NOT NULL)"
                ).format(self.meta)
            )

    def _run(self, statement: Any, params: Sequence[Any]) -> tuple[int, list[Any]]:
        """One statement, one round trip; a broken connection is reopened once."""
        import psycopg

        with self._lock:
            for attempt in (1, 2):
                try:
                    cur = self._connection().execute(statement, params)
                    rows = list(cur.fetchall()) if cur.description else []
                    return cur.rowcount, rows
                except psycopg.OperationalError:
                    if attempt == 2 or self._conn is None or not self._conn.closed:
                        raise
                    self._conn = None
        raise AssertionError("unreachable")

    def get_meta(self, name: str) -> str | None:
        _, rows = self._run(
            self.sql.SQL("SELECT value FROM {} WHERE name=%s").format(self.meta), (name,)
        )
        return str(rows[0][0]) if rows else None

    def probe_write(self) -> None:
        """Write a row and roll it back: raises where the store refuses writes (privileges,
        a read-only transaction or server), which opening it and reading never show."""
        with self._lock:
            conn = self._connection()
            with conn.transaction(force_rollback=True):
                conn.execute(
                    self.sql.SQL(
                        "INSERT INTO {} VALUES ('write_probe', '') ON CONFLICT DO NOTHING"
                    ).format(self.meta)
                )

    def _insert_meta_if_absent(self, name: str, value: str) -> None:
        self._run(
            self.sql.SQL("INSERT INTO {} VALUES (%s, %s) ON CONFLICT DO NOTHING").format(self.meta),
            (name, value),
        )

    def find(self, subject_id: str) -> tuple[str, bytes, str] | None:
        _, rows = self._run(
            self.sql.SQL("SELECT key_id, wrapped, created_at FROM {} WHERE subject_id=%s").format(
                self.keys
            ),
            (subject_id,),
        )
        return (str(rows[0][0]), bytes(rows[0][1]), str(rows[0][2])) if rows else None

    def get(self, subject_id: str, key_id: str) -> bytes | None:
        _, rows = self._run(
            self.sql.SQL("SELECT wrapped FROM {} WHERE subject_id=%s AND key_id=%s").format(
                self.keys
            ),
            (subject_id, key_id),
        )
        return bytes(rows[0][0]) if rows else None

    def get_many(self, subject_ids: Sequence[str]) -> dict[str, tuple[str, bytes]]:
        found: dict[str, tuple[str, bytes]] = {}
        for chunk in _chunks(subject_ids):
            _, rows = self._run(
                self.sql.SQL(
                    "SELECT subject_id, key_id, wrapped FROM {} WHERE subject_id = ANY(%s)"
                ).format(self.keys),
                (chunk,),
            )
            for subject, key_id, wrapped in rows:
                found[str(subject)] = (str(key_id), bytes(wrapped))
        return found

    def insert(self, row: NewKeyRow, replaces: str | None = None) -> bool:
        subject_id, key_id, wrapped, created_at = row
        if replaces is not None:
            count, _ = self._run(
                self.sql.SQL(PG_REPLACE_TOMBSTONE).format(self.keys),
                (key_id, wrapped, created_at, subject_id, replaces),
            )
        else:
            count, _ = self._run(
                self.sql.SQL(
                    "INSERT INTO {} (subject_id, key_id, wrapped, created_at) "
                    "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING"
                ).format(self.keys),
                row,
            )
        return count == 1

    def destroy(self, subject_id: str, erased_at: datetime | None = None) -> list[str]:
        """Delete durably and leave a new tombstone in the subject's place, in one
        transaction; then rewrite the table so no dead tuple keeps the wrapped key (or leave
        that pending, if the table's lock is not free within a second). Returns the ids of
        the data keys destroyed.

        A writer that inserted the subject's first key while this ran (uncommitted when the
        DELETE read the table) makes the tombstone's insert wait for it and then skip it:
        the DELETE runs again, now seeing that key, until the tombstone is in place."""
        sql = self.sql
        delete = sql.SQL("DELETE FROM {} WHERE subject_id=%s RETURNING key_id").format(self.keys)
        insert = sql.SQL(
            "INSERT INTO {} (subject_id, key_id, wrapped, created_at) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING key_id"
        ).format(self.keys)
        with self._lock:
            conn = self._connection()
            conn.execute("SET synchronous_commit TO ON")
            try:
                ids: list[str] = []
                with conn.transaction():
                    for _ in range(DESTROY_TRIES):
                        cur = conn.execute(delete, (subject_id,))
                        ids += [str(r[0]) for r in cur.fetchall() if not is_tombstone(str(r[0]))]
                        if conn.execute(insert, tombstone_row(subject_id, erased_at)).fetchall():
                            break
                    else:
                        raise RuntimeError(
                            f"subject {subject_id}: its key row kept changing; not erased"
                        )
                self._clean_up(conn)
            finally:
                conn.execute("SET synchronous_commit TO OFF")
        return ids

    def finish_cleanup(self) -> bool:
        """Rewrite the table an earlier erasure could not; True when nothing is pending."""
        with self._lock:
            return self._clean_up(self._connection())

    def _clean_up(self, conn: Any) -> bool:
        """``VACUUM FULL`` needs an exclusive lock, and every writer of the table queues
        behind it while it waits: it waits a second at most, then it is left pending."""
        import psycopg

        sql = self.sql
        conn.execute(sql.SQL("SET lock_timeout TO {}").format(sql.Literal(VACUUM_LOCK_TIMEOUT)))
        try:
            conn.execute(sql.SQL("VACUUM FULL {}").format(self.keys))
            done = True
        except psycopg.errors.LockNotAvailable:
            done = False
        finally:
            conn.execute("RESET lock_timeout")
        if done:
            conn.execute(
                sql.SQL("DELETE FROM {} WHERE name=%s").format(self.meta), (CLEANUP_PENDING,)
            )
        else:
            conn.execute(
                sql.SQL("INSERT INTO {} VALUES (%s, %s) ON CONFLICT DO NOTHING").format(self.meta),
                (CLEANUP_PENDING, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())),
            )
        self.cleanup_pending = not done
        return done

    def rows(self) -> list[tuple[str, str, bytes]]:
        _, rows = self._run(
            self.sql.SQL("SELECT key_id, subject_id, wrapped FROM {}").format(self.keys), ()
        )
        return [(str(a), str(b), bytes(c)) for a, b, c in rows if not is_tombstone(str(a))]

    def originators_mentioning(self, topics: Sequence[str], needle: bytes) -> list[str]:
        _, rows = self._run(
            self.sql.SQL(
                "SELECT DISTINCT originator_id FROM {} "
                "WHERE topic = ANY(%s) AND position(%s::bytea in state) > 0"
            ).format(self.events),
            (list(topics), needle),
        )
        return [str(r[0]) for r in rows]


def key_table_for(recorder: Any) -> KeyTable:
    """The key table beside the recorder's events, whichever store that is."""
    datastore = recorder.datastore
    events_table = recorder.events_table_name
    if hasattr(datastore, "schema"):
        return PostgresKeyTable(datastore, events_table)
    return SQLiteKeyTable(datastore.pool.db_name, events_table)
