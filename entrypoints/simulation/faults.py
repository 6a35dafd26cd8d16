"""The faults ``gateway-ledger simulate --faults`` plants on top of the SIGKILLs.

- **poison**: bit rot and a rolling upgrade, done to the stored events behind the
  ledger's back, as a disk or a newer gateway would: one byte of one stored event of an
  already-delivered obligation is flipped (the event no longer decodes), and another
  delivered obligation gets an event whose type this version does not know, at its next
  version. Both replies reached their users before (every part of each is on its platform
  when the poison lands: ``poison_candidates``); they must not be sent again, and every
  other reply must still be recovered.
- **forget**: sessions are erased (the public ``forget_session``) while replies of theirs
  are in flight: a killed gateway's orphans, a turn being answered. No platform may then
  receive an erased placeholder, nor a reply taken from the store after the erasure.
- **pause** (PostgreSQL, where liveness is a lease): a gateway is stopped with SIGSTOP
  past its lease, another gateway's sweep claims its replies, and it is resumed with
  SIGCONT: what it finishes late must be recorded as late, never as a second delivery.

Everything here reaches the store only through SQL or the public API, so the run measures
the ledger from outside, whatever the ledger does inside.
"""

from __future__ import annotations

import base64
import os
import random
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from uuid import UUID

import attrs
import orjson
from eventsourcing.utils import get_topic

from gateway_ledger.application.delivery.ports import DUPLICATE_NOTICE
from gateway_ledger.application.delivery.views import HistoryEntry, ObligationStatus
from gateway_ledger.bootstrap import DeliveryLedger, forget_session
from gateway_ledger.domain.delivery.obligation import DeliveryObligation, obligation_uuid
from gateway_ledger.domain.errors import NotFound
from gateway_ledger.entrypoints.simulation.platform import Received
from gateway_ledger.entrypoints.simulation.report import Report, SimulationConfig
from gateway_ledger.entrypoints.simulation.worker import forgotten_marker
from gateway_ledger.entrypoints.simulation.workload import Turn
from gateway_ledger.infrastructure.eventstore.postgres import connect, parse_postgres_url
from gateway_ledger.infrastructure.eventstore.store import is_postgres_url
from gateway_ledger.infrastructure.privacy.private_mapper import ERASED

OBLIGATION_TOPIC = get_topic(DeliveryObligation)
DELIVERED_TOPIC = f"{OBLIGATION_TOPIC}.Delivered"
UNKNOWN_TOPIC = f"{OBLIGATION_TOPIC}.ReadReceiptReported"
"""An event type a newer release might add; this version cannot resolve its topic."""

LEASE_ENV = {
    "GATEWAY_LEDGER_LEASE_TTL": "2",
    "GATEWAY_LEDGER_LEASE_RENEW": "0.5",
    "GATEWAY_LEDGER_CLOCK_SKEW": "0.5",
}
"""Short leases for a run with a pause, so the paused gateway is judged dead in seconds."""
DEAD_AFTER = 2.5
"""ttl + clock skew above: from then on another gateway's sweep may claim its replies."""


# -- poison: the stored events, changed behind the ledger's back -------------------------------


class EventTable:
    """The stored events table of a ledger, reached with plain SQL (sqlite3 or psycopg)."""

    def __init__(self, location: str, table: str) -> None:
        self.location = location
        self.table = table
        self.postgres = is_postgres_url(location)

    def _key(self, aggregate_id: UUID) -> Any:
        return aggregate_id if self.postgres else aggregate_id.hex

    def delivered(self) -> list[UUID]:
        """Aggregates with a ``Delivered`` event: obligations already delivered."""
        rows = self._query("SELECT originator_id FROM {t} WHERE topic = {p}", DELIVERED_TOPIC)
        return sorted({UUID(str(r[0])) for r in rows})

    def flip_byte(self, aggregate_id: UUID, rng: random.Random) -> tuple[int, str]:
        """Flip the top bit of one byte of one stored event: its JSON is no longer UTF-8.

        Returns the version and topic of the event changed.
        """
        rows = self._query(
            "SELECT originator_version, topic, state FROM {t} WHERE originator_id = {p} "
            "ORDER BY originator_version",
            self._key(aggregate_id),
        )
        version, topic, state = rng.choice(rows)
        data = bytearray(bytes(state))
        # A byte followed by an ASCII byte, so the flipped one cannot form a valid sequence.
        spots = [
            i
            for i in range(len(data))
            if data[i] < 0x80 and (i + 1 == len(data) or data[i + 1] < 0x80)
        ]
        spot = rng.choice(spots)
        data[spot] ^= 0x80
        self._execute(
            "UPDATE {t} SET state = {p} WHERE originator_id = {p} AND originator_version = {p}",
            (bytes(data), self._key(aggregate_id), int(version)),
        )
        return int(version), str(topic)

    def state(self, aggregate_id: UUID, version: int) -> bytes:
        """The stored bytes of one event."""
        rows = self._query(
            "SELECT state FROM {t} WHERE originator_id = {p} AND originator_version = {p}",
            self._key(aggregate_id),
            version,
        )
        if not rows:
            raise LookupError(f"no event v{version} of {aggregate_id}")
        return bytes(rows[0][0])

    def set_state(self, aggregate_id: UUID, version: int, state: bytes) -> None:
        """Replace the stored bytes of one event, as bit rot or a tampering hand would."""
        self._execute(
            "UPDATE {t} SET state = {p} WHERE originator_id = {p} AND originator_version = {p}",
            (state, self._key(aggregate_id), version),
        )

    def flip_first_byte(self, aggregate_id: UUID, version: int) -> None:
        """One bit of the event's first byte flipped: ``{`` becomes ``z``, no longer JSON."""
        data = bytearray(self.state(aggregate_id, version))
        data[0] ^= 0x01
        self.set_state(aggregate_id, version, bytes(data))

    def tamper_ciphertext(self, aggregate_id: UUID, version: int) -> None:
        """One bit of the sealed fields' ciphertext flipped, still valid base64 and JSON:
        only the AEAD's authentication finds it."""
        state = orjson.loads(self.state(aggregate_id, version))
        blob = bytearray(base64.b64decode(state["_sealed_"]["c"]))
        blob[20] ^= 0x01
        state["_sealed_"]["c"] = base64.b64encode(bytes(blob)).decode()
        self.set_state(aggregate_id, version, orjson.dumps(state))

    def insert(self, aggregate_id: UUID, version: int, topic: str, state: bytes) -> None:
        """Append a raw event at ``version`` (as the library does: in notification order)."""
        self._execute(
            "INSERT INTO {t} (originator_id, originator_version, topic, state) "
            "VALUES ({p}, {p}, {p}, {p})",
            (self._key(aggregate_id), version, topic, state),
            lock=True,
        )

    def append_unknown(self, aggregate_id: UUID, now: datetime) -> int:
        """Append an event of a type this version does not know, at the next version."""
        state = orjson.dumps(
            {"timestamp": {"_type_": "datetime_iso", "_data_": now.isoformat()}, "read": True}
        )
        for _ in range(5):
            rows = self._query(
                "SELECT MAX(originator_version) FROM {t} WHERE originator_id = {p}",
                self._key(aggregate_id),
            )
            version = int(rows[0][0]) + 1
            try:
                self.insert(aggregate_id, version, UNKNOWN_TOPIC, state)
            except Exception as e:
                if not _is_duplicate_key(e):
                    raise
                continue  # a writer took that version meanwhile
            return version
        raise RuntimeError(f"could not append to {aggregate_id}: it kept changing")

    def _sql(self, statement: str) -> Any:
        if not self.postgres:
            return statement.replace("{t}", self.table).replace("{p}", "?")
        from psycopg import sql

        schema = parse_postgres_url(self.location)["schema"]
        text = statement.replace("{p}", "%s").replace("{t}", "{schema}.{table}")
        return sql.SQL(text).format(schema=sql.Identifier(schema), table=sql.Identifier(self.table))

    def _query(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        if self.postgres:
            with connect(parse_postgres_url(self.location)) as conn:
                return list(conn.execute(self._sql(statement), params).fetchall())
        lite = sqlite3.connect(self.location, timeout=30)
        try:
            return list(lite.execute(self._sql(statement), params).fetchall())
        finally:
            lite.close()

    def _execute(self, statement: str, params: Sequence[Any], *, lock: bool = False) -> None:
        if self.postgres:
            from psycopg import sql

            with connect(parse_postgres_url(self.location)) as conn, conn.transaction():
                if lock:  # as the library does: notification ids commit in order
                    schema = parse_postgres_url(self.location)["schema"]
                    conn.execute(
                        sql.SQL("LOCK TABLE {}.{} IN EXCLUSIVE MODE").format(
                            sql.Identifier(schema), sql.Identifier(self.table)
                        )
                    )
                conn.execute(self._sql(statement), params)
            return
        lite = sqlite3.connect(self.location, timeout=30, isolation_level=None)
        try:
            lite.execute("BEGIN IMMEDIATE")
            try:
                lite.execute(self._sql(statement), tuple(params))
            except BaseException:
                lite.execute("ROLLBACK")
                raise
            lite.execute("COMMIT")
        finally:
            lite.close()


def _is_duplicate_key(error: Exception) -> bool:
    return isinstance(error, sqlite3.IntegrityError) or type(error).__name__ == "UniqueViolation"


def local_ports(pid: int) -> set[int]:
    """The local TCP ports of a process's sockets (Linux /proc): its database sessions'
    ``client_port`` in ``pg_stat_activity``."""
    inodes: set[str] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[9] in inodes:
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def busy_sessions(location: str, pid: int) -> int:
    """Database sessions of process ``pid`` inside a transaction or a statement: a gateway
    stopped now would hold their locks, and every writer of the store would wait."""
    ports = sorted(local_ports(pid))
    if not ports:
        return 0
    with connect(parse_postgres_url(location)) as conn:
        row = conn.execute(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE client_port = ANY(%s) "
            "AND datname = current_database() AND state IS DISTINCT FROM 'idle'",
            (ports,),
        ).fetchone()
    return int(row[0]) if row else 0


@attrs.frozen
class Poisoned:
    """One obligation whose stored history was damaged, and how."""

    obligation_id: str
    how: str  # "flipped_byte" | "unknown_event"
    version: int
    topic: str
    copies_before: int
    """Messages its user had received when it was poisoned (it was delivered)."""


# -- forget: erasure while replies are in flight ------------------------------------------------


@attrs.define
class Forgotten:
    """One erased session, timed by the driver's clock around the public API call."""

    conversation: int
    session_key: str
    chat_id: str
    began_at: float = 0.0
    finished_at: float | None = None
    abandoned: tuple[str, ...] = ()
    error: str | None = None


class Eraser:
    """Runs ``forget_session`` for each chosen session, one after another, off the driver's
    loop (an erasure may wait on the store; the kills must go on meanwhile)."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.forgotten: list[Forgotten] = []
        self._threads: list[threading.Thread] = []

    def forget(self, items: Iterable[Forgotten]) -> None:
        batch = list(items)
        self.forgotten.extend(batch)
        thread = threading.Thread(target=self._run, args=(batch,), name="sim-forget", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _run(self, batch: list[Forgotten]) -> None:
        for item in batch:
            item.began_at = time.time()
            try:
                report = forget_session(
                    self.location, item.session_key, requested_by="simulate --faults"
                )
            except Exception as e:
                item.error = f"{type(e).__name__}: {e}"
            else:
                item.abandoned = tuple(report.abandoned)
            item.finished_at = time.time()

    def wait(self, timeout: float) -> bool:
        """True when every erasure has returned."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)


def shows_placeholder(msg: Received) -> bool:
    """The message carries the erased placeholder in its text or its addressing."""
    return any(ERASED in (v or "") for v in (msg.content, msg.chat_id, msg.thread_id, msg.reply_to))


# -- pause: SIGSTOP past the lease, another gateway claims, SIGCONT ------------------------------


@attrs.define
class Pause:
    index: int
    pid: int
    stopped_at: float
    owned_in_flight: int
    """Unresolved obligations it owned when stopped (per the recoverable view)."""
    resumed_at: float | None = None


Parts = Sequence[Sequence[Received]]
"""The copies users received of each part of one reply, in part order."""

PAUSE_LIMIT = DEAD_AFTER + 6.0
"""Seconds a paused gateway stays stopped at most, even if the claiming sweep is slow
(it may wait on a lock the stopped gateway holds)."""
_PAUSE_TRIES = 60


Copies = dict[tuple[str, str, str], list[Received]]
"""Every message the platforms received, by the part it is (``order.part_key``)."""


def parts_of(turn: Turn, copies: Copies) -> list[list[Received]]:
    """The copies of each part of a turn's reply that its platform received, in send order."""
    return [copies.get((turn.inbound_id, kind, ident), []) for kind, ident in turn.expected_parts]


def poison_candidates(
    delivered: Iterable[str], turns: dict[str, Turn], forgotten: Iterable[int], copies: Copies
) -> list[str]:
    """The obligations the poison may hit: delivered, of a conversation not forgotten, and
    with every part of the reply on its platform now.

    A ``Delivered`` event alone does not say that: a part the platform took and then
    dropped (``failed_after_acceptance``) is reported after it, reopens the obligation and
    owes a re-send (ADR 0050). Poisoned then, the reply could never be re-sent (nothing
    unreadable is sent), and the run would count it lost to the fault it planted. A
    dropped message is never journalled as received, so a reply whose parts all are has
    nothing owed, now or later."""
    gone = set(forgotten)
    return sorted(
        oid
        for oid in delivered
        if (turn := turns.get(oid)) is not None
        and turn.conversation not in gone
        and all(parts_of(turn, copies))
    )


def tally(parts: Parts) -> tuple[bool, bool, int]:
    """(a part is missing, a copy carries the duplicate marker, unlabelled extra copies)."""
    notice = DUPLICATE_NOTICE
    missing = any(not got for got in parts)
    marked = any(m.content.startswith(notice) for got in parts for m in got)
    unlabelled = sum(1 for got in parts for m in got[1:] if not m.content.startswith(notice))
    return missing, marked, unlabelled


class SimulationRun(Protocol):
    """What the fault plan uses of the running simulation (``driver.Simulation``)."""

    config: SimulationConfig
    report: Report
    db: str
    rng: random.Random
    run_dir: Path
    turns: list[Turn]
    workers: dict[int, subprocess.Popen[bytes]]

    def oid(self, turn: Turn) -> str: ...

    def journals(self) -> Copies: ...

    def spawn(self, role: str, index: int) -> subprocess.Popen[bytes]: ...

    def reap(self, procs: list[subprocess.Popen[bytes]]) -> None: ...

    def done(self, index: int) -> bool: ...

    def started_for(self, index: int) -> float: ...


class FaultPlan:
    """Plants the faults during one simulation run and counts what they did.

    Order: the pause (PostgreSQL) as soon as a gateway is delivering; an erasure at the
    first kill (the victim's orphans are in flight, and a live gateway is mid-turn); the
    poison at the next kill after the pause, so the restarted gateway and the sweeper
    that start with it read a poisoned store. Steps that found no kill are planted on
    the driver's loop once the kills are spent, or before the closing sweeps at the latest.
    """

    def __init__(self, sim: SimulationRun) -> None:
        self.sim = sim
        report = sim.report.faults
        assert report is not None, "a FaultPlan reports into the run's FaultReport"
        self.report = report
        self.postgres = is_postgres_url(sim.db)
        self.steps = ["forget", "poison"]
        self.eraser = Eraser(sim.db)
        self.forgotten: dict[int, Forgotten] = {}
        self.poisoned: dict[str, Poisoned] = {}
        self.pause: Pause | None = None
        self.pause_done = not self.postgres
        self.pause_sweeper: subprocess.Popen[bytes] | None = None
        self._pause_tries = 0
        self._ledger: DeliveryLedger | None = None
        self._by_oid = {sim.oid(t): t for t in sim.turns}
        self._by_uuid = {str(obligation_uuid(o)): o for o in self._by_oid}
        self._quarantined: set[str] | None = None
        self._quarantined_count: int | None = None
        self._claimed_from_paused: set[str] = set()

    # -- the driver's hooks ---------------------------------------------------------------------

    @property
    def paused_index(self) -> int | None:
        p = self.pause
        return p.index if p is not None and p.resumed_at is None else None

    def is_forgotten(self, conversation: int) -> bool:
        return conversation in self.forgotten

    def may_kill(self, kills_left: int) -> bool:
        """The last kill waits for the poison, which waits for the pause to end."""
        return kills_left > 1 or "poison" not in self.steps or self.pause_done

    def after_kill(self, victim: int, kills_left: int, when: str) -> None:
        """Plant the next step at a kill (all that are due when it was the last kill)."""
        while self.steps:
            step = self.steps[0]
            if step == "forget":
                self._forget(victim)
            elif self.pause_done and self._poison(when):
                pass
            else:
                return
            if kills_left > 0:
                return

    def tick(self, kills_left: int) -> None:
        if not self.pause_done:
            self._pause_tick()
        if kills_left == 0:
            self.after_kill(-1, 0, "after the kills")

    def finish_mid_run(self) -> None:
        """Every worker is done: plant what found no moment yet (no pause without a worker)."""
        self.pause_done = True
        self.after_kill(-1, 0, "after the workers finished")
        if not self.eraser.wait(timeout=120):
            self.report.forget_errors.append("an erasure had not returned after 120 s")

    def close(self) -> None:
        p = self.pause
        if p is not None and p.resumed_at is None:
            self._resume()
        if self.pause_sweeper is not None and self.pause_sweeper.poll() is None:
            self.pause_sweeper.kill()
            self.pause_sweeper.wait()
        self.eraser.wait(timeout=5)
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None

    @property
    def ledger(self) -> DeliveryLedger:
        if self._ledger is None:
            self._ledger = DeliveryLedger.open(self.sim.db)
        return self._ledger

    # -- forget ---------------------------------------------------------------------------------

    def _status(self, turn: Turn) -> str:
        """'unrecorded', 'unresolved', 'resolved' or 'unreadable'."""
        try:
            state = self.ledger.get(self.sim.oid(turn)).state
        except NotFound:
            return "unrecorded"
        except Exception:
            return "unreadable"
        return "resolved" if state in ("delivered", "abandoned") else "unresolved"

    def _conversations(self, worker: int | None) -> list[int]:
        n = self.sim.config.workers
        return sorted(
            {
                t.conversation
                for t in self.sim.turns
                if (worker is None or t.conversation % n == worker)
                and t.conversation not in self.forgotten
            }
        )

    def _turns(self, conversation: int) -> list[Turn]:
        return [t for t in self.sim.turns if t.conversation == conversation]

    def _forget(self, victim: int) -> None:
        """Forget sessions with replies in flight: the victim's orphans, and a conversation a
        live gateway is still answering (its turn in progress records after the erasure)."""
        want = max(1, self.sim.config.conversations // 48)
        rng = self.sim.rng
        chosen: list[int] = []
        orphans = self._conversations(victim if victim >= 0 else None)
        rng.shuffle(orphans)
        for c in orphans:
            if len(chosen) == want:
                break
            if any(self._status(t) == "unresolved" for t in self._turns(c)):
                chosen.append(c)
        paused = self.paused_index
        live = [
            c
            for c in self._conversations(None)
            if c not in chosen and c % self.sim.config.workers not in (victim, paused)
        ]
        rng.shuffle(live)
        talking = [c for c in live[: want * 8] if self._status(self._turns(c)[-1]) == "unrecorded"]
        chosen += talking[:want]
        if not chosen:  # nothing in flight anywhere: forget one anyway
            rest = self._conversations(None)
            chosen = rest[:1]
        items: list[Forgotten] = []
        for c in chosen:
            first = self._turns(c)[0]
            forgotten_marker(self.sim.run_dir, c).touch()  # no new turn starts from here
            item = Forgotten(conversation=c, session_key=first.session_key, chat_id=first.chat_id)
            self.forgotten[c] = item
            items.append(item)
        self.eraser.forget(items)
        self.steps.remove("forget")

    # -- poison ---------------------------------------------------------------------------------

    def _poison(self, when: str) -> bool:
        recorder: Any = self.ledger.recorder  # the SQLite recorder: the simulation runs on SQLite
        table = EventTable(self.sim.db, recorder.events_table_name)
        delivered = [self._by_uuid[str(u)] for u in table.delivered() if str(u) in self._by_uuid]
        if len(delivered) < 2:
            return False  # too early (retried every tick): the journals are not read for it
        copies = self.sim.journals()
        candidates = poison_candidates(delivered, self._by_oid, self.forgotten, copies)
        if len(candidates) < 2:
            return False  # too early: try at the next moment
        rng = self.sim.rng
        flipped, unknown = rng.sample(candidates, 2)
        for oid, how in ((flipped, "flipped_byte"), (unknown, "unknown_event")):
            turn = self._by_oid[oid]
            before = sum(len(got) for got in parts_of(turn, copies))
            if how == "flipped_byte":
                version, topic = table.flip_byte(obligation_uuid(oid), rng)
            else:
                version, topic = (
                    table.append_unknown(obligation_uuid(oid), datetime.now(UTC)),
                    UNKNOWN_TOPIC,
                )
            self.poisoned[oid] = Poisoned(oid, how, version, topic, before)
        self.steps.remove("poison")
        self.report.poisoned_when = when
        return True

    # -- pause ----------------------------------------------------------------------------------

    def _pause_tick(self) -> None:
        now = time.monotonic()
        p = self.pause
        if p is None:
            self._try_pause()
            return
        if p.resumed_at is not None:
            return
        stopped_for = now - p.stopped_at
        if self.pause_sweeper is None and stopped_for >= DEAD_AFTER + 0.5:
            self.pause_sweeper = self.sim.spawn("sweeper", 500)
            self.sim.report.sweeper_runs += 1
        sweeper = self.pause_sweeper
        if (sweeper is not None and sweeper.poll() is not None) or stopped_for >= PAUSE_LIMIT:
            self._resume()

    def _try_pause(self) -> None:
        """Stop a delivering gateway that owns replies in flight (a few tries, then any)."""
        sim = self.sim
        live = [
            i
            for i, proc in sim.workers.items()
            if proc.poll() is None
            and not sim.done(i)
            and sim.started_for(i) + 0.2 <= time.monotonic()
        ]
        if not live:
            return
        index = sim.rng.choice(live)
        pid = sim.workers[index].pid
        stopped_at = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        self._pause_tries += 1
        retry = self._pause_tries < _PAUSE_TRIES
        time.sleep(0.15)  # a statement it sent just before may still be running
        if busy_sessions(sim.db, pid) and retry:
            # Stopped inside a transaction, it holds its locks: every gateway's writes (and
            # this driver's reads below) would wait for the whole pause. That is another
            # fault than the one measured here (a lease outlived): counted, tried again.
            self.report.pause_tries_in_transaction += 1
            os.kill(pid, signal.SIGCONT)
            return
        try:
            recoverable = self.ledger.recoverable
            recoverable.catch_up()
            owned = sum(1 for e in recoverable.entries() if e.owner.pid == pid)
        except Exception:
            owned = 0
        if owned == 0 and retry:
            os.kill(pid, signal.SIGCONT)  # nothing of its in flight now: try again later
            return
        self.pause = Pause(index=index, pid=pid, stopped_at=stopped_at, owned_in_flight=owned)

    def _resume(self) -> None:
        p = self.pause
        assert p is not None
        os.kill(p.pid, signal.SIGCONT)
        p.resumed_at = time.monotonic()
        self.pause_done = True
        sweeper, self.pause_sweeper = self.pause_sweeper, None
        if sweeper is not None:
            self.sim.reap([sweeper])

    # -- counting -------------------------------------------------------------------------------

    def _oid_of(self, reported: str) -> str:
        """An id as the ledger reports it (obligation id or aggregate UUID) as an obligation id."""
        if reported in self._by_oid:
            return reported
        try:
            return self._by_uuid.get(str(UUID(reported)), reported)
        except ValueError:
            return reported

    def read_quarantine(self, ledger: DeliveryLedger) -> None:
        """The ledger's own account of what it quarantined, where it gives one."""
        fallback = "the poisoned obligations the ledger cannot read"
        try:
            stats = ledger.stats()
            ids = getattr(stats, "quarantined_ids", None)
            self._quarantined_count = getattr(stats, "quarantined", None)
        except Exception as e:
            self.report.quarantined_source = (
                f"fallback: stats() failed ({type(e).__name__}); {fallback}"
            )
            return
        if ids is None:
            self.report.quarantined_source = f"fallback: stats() has no quarantined_ids; {fallback}"
            return
        self._quarantined = {self._oid_of(str(i)) for i in ids}
        self.report.quarantined_source = "stats()"

    def _quarantine(self, oid: str) -> None:
        if oid not in self.report.quarantined_ids:
            self.report.quarantined_ids.append(oid)

    def _unaccounted(self, oid: str) -> None:
        self.report.unaccounted += 1
        self.report.unaccounted_ids.append(oid)

    def count_unrecorded(self, turn: Turn) -> None:
        self.report.forgotten_turns_unrecorded += 1

    def count_unreadable(self, turn: Turn, parts: Parts) -> None:
        """A recorded obligation the ledger cannot load (poisoned, or worse)."""
        r = self.sim.report
        oid = self.sim.oid(turn)
        r.obligations += 1
        missing, _marked, unlabelled = tally(parts)
        r.lost += missing
        r.unlabelled_duplicates += unlabelled
        quarantined = (
            oid in self._quarantined if self._quarantined is not None else oid in self.poisoned
        )
        if quarantined:
            self._quarantine(oid)
        else:
            self._unaccounted(oid)

    def count_readable(
        self,
        turn: Turn,
        status: ObligationStatus,
        history: list[HistoryEntry],
        parts: Parts,
        ledger: DeliveryLedger,
    ) -> None:
        oid = self.sim.oid(turn)
        if self._quarantined is not None and oid in self._quarantined:
            self._quarantine(oid)
        elif status.state not in ("delivered", "abandoned") or not (
            status.state == "delivered" or status.abandon_reason
        ):
            self._unaccounted(oid)  # unresolved, or abandoned without a reason
        p = self.pause
        for h in history:
            if h.type == "LateResultReported":
                self.report.late_results += 1
                if p is not None and h.fields["by"].pid == p.pid:
                    self.report.paused_late_results += 1
            if h.type == "Claimed" and p is not None and h.fields["previous_owner"].pid == p.pid:
                self._claimed_from_paused.add(oid)
        forgotten = self.forgotten.get(turn.conversation)
        if forgotten is None:
            return
        if recorded_after_erasure(history, forgotten, erased=ledger.is_erased(oid)):
            # New data under a fresh key (ADR 0071): sending it is what the erasure allows.
            self.report.recorded_after_erasure += 1
            return
        taken = sum(
            1
            for got in parts
            for m in got
            if not shows_placeholder(m) and taken_after_erasure(m, history, forgotten)
        )
        if taken:
            self.report.erased_sent_after_forget += taken
            self.report.erased_sent_ids.append(oid)

    def audit(self, ledger: DeliveryLedger) -> None:
        r = self.sim.report
        try:
            audit = ledger.audit_duplicates()
        except Exception as e:
            self.report.audit_error = f"{type(e).__name__}: {e}"
            r.audit_problems = {"audit_failed": 1}
            return
        r.audit_problems = audit.counts()
        r.audit_labelled_duplicates = audit.labelled_duplicates
        explained: dict[str, int] = {}
        named: set[str] = set()
        for f in audit.findings:
            oid = self._oid_of(f.obligation_id)
            if oid in self.poisoned:
                named.add(oid)
            elif not (
                oid in self._claimed_from_paused
                and f.kind in ("late_result", "claim_from_live_owner")
            ):
                continue
            explained[f.kind] = explained.get(f.kind, 0) + 1
        self.report.audit_explained = dict(sorted(explained.items()))
        self.report.poisoned_reported_by_audit = len(named)

    def count_messages(self, copies: dict[tuple[str, str, str], list[Received]]) -> None:
        """The figures read from the journals and the fault log, once the ledger is counted."""
        f, r = self.report, self.sim.report
        every = [m for got in copies.values() for m in got]
        f.erased_sent_placeholder = sum(1 for m in every if shows_placeholder(m))
        f.erased_sent = f.erased_sent_placeholder + f.erased_sent_after_forget
        f.erased_abandoned = r.abandoned.get("erased", 0)
        for oid, poison in self.poisoned.items():
            turn = self._by_oid[oid]
            now = sum(len(got) for got in parts_of(turn, copies))
            f.poisoned_resent += now - poison.copies_before
        f.poisoned = len(self.poisoned)
        f.poisoned_ids = sorted(self.poisoned)
        f.poisoned_events = [attrs.asdict(p) for p in self.poisoned.values()]
        if self._quarantined is not None:
            for oid in sorted(self._quarantined):
                self._quarantine(oid)
        f.quarantined_ids.sort()
        count = self._quarantined_count  # the ledger's own count, where it gives one
        f.quarantined = count if isinstance(count, int) else len(f.quarantined_ids)
        f.quarantined_unplanted = sum(1 for q in f.quarantined_ids if q not in self.poisoned)
        f.forgotten = len(self.forgotten)
        f.forgotten_in_flight = sum(len(x.abandoned) for x in self.forgotten.values())
        f.forget_errors += [x.error for x in self.forgotten.values() if x.error]
        f.forget_seconds = [
            round(x.finished_at - x.began_at, 2)
            for x in self.forgotten.values()
            if x.finished_at is not None
        ]
        p = self.pause
        if p is not None:
            f.paused = 1
            f.paused_seconds = round((p.resumed_at or p.stopped_at) - p.stopped_at, 2)
            f.paused_in_flight = p.owned_in_flight
            f.paused_claimed = len(self._claimed_from_paused)


def recorded_after_erasure(
    history: list[HistoryEntry], erasure: Forgotten, *, erased: bool
) -> bool:
    """The obligation was recorded once the erasure had begun, under a key the erasure did
    not destroy (its data still opens): a new key period, which ADR 0071 allows.

    The erasure destroys the subject's key and then abandons what was recorded under it
    meanwhile; a process that no longer finds a key creates a fresh one. Such a reply is
    new data, readable and owed like any other. A reply whose data no longer opens was
    recorded under the destroyed key, and the judgment of :func:`taken_after_erasure`
    applies to it, as to anything recorded before the erasure began.
    """
    first = history[0] if history else None
    return (
        not erased
        and first is not None
        and first.type == "Recorded"
        and first.timestamp.timestamp() > erasure.began_at
    )


def taken_after_erasure(msg: Received, history: list[HistoryEntry], erasure: Forgotten) -> bool:
    """The message was handed to its platform after the erasure returned, by a gateway that
    had it from the store after the erasure began.

    A gateway sends a reply either as the one that recorded it (from memory: a turn it was
    answering, a retry) or as a claimer (from the store). A claimer whose claim came
    before the erasure began, or before the obligation was abandoned as erased, read it
    while it was still owed; any other claimer read what the erasure should have closed.
    """
    if erasure.finished_at is None or msg.sent_at <= erasure.finished_at:
        return False
    recorded = history[0] if history and history[0].type == "Recorded" else None
    if recorded is not None and recorded.fields["owner"].pid == msg.sender_pid:
        return False
    abandoned_at = next(
        (
            h.version
            for h in history
            if h.type == "Abandoned" and h.fields.get("reason") == "erased"
        ),
        None,
    )
    for h in history:
        if h.type != "Claimed" or h.fields["by"].pid != msg.sender_pid:
            continue
        if h.timestamp.timestamp() < erasure.began_at:
            return False
        if abandoned_at is not None and h.version < abandoned_at:
            return False
    return True
