"""Runs a simulation: worker processes killed with SIGKILL and restarted, concurrent
sweepers, then a report counted from the ledger and from what the platforms received.

With ``faults``, the run also plants a poisoned store, erasures and (on PostgreSQL) a
paused gateway (``faults.py``), and the report says what each did to what users got."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.delivery.obligation import compute_obligation_id
from gateway_ledger.domain.errors import NotFound
from gateway_ledger.entrypoints.simulation.faults import (
    LEASE_ENV,
    Copies,
    FaultPlan,
    parts_of,
    tally,
)
from gateway_ledger.entrypoints.simulation.limits import read_enforcement
from gateway_ledger.entrypoints.simulation.order import (
    OrderTally,
    part_key,
    percentile,
    read_arrivals,
)
from gateway_ledger.entrypoints.simulation.platform import (
    count_deduplicated,
    read_journal,
    read_reconcile_requests,
)
from gateway_ledger.entrypoints.simulation.report import (
    FaultReport,
    PlatformReport,
    Report,
    SimulationConfig,
)
from gateway_ledger.entrypoints.simulation.workload import (
    Turn,
    backlog_conversations,
    backlog_depths,
    build_turns,
    default_platforms,
)

WORKER_MODULE = "gateway_ledger.entrypoints.simulation.worker"
BACKLOG_TIMEOUT = 300.0
"""Seconds the backlog gateway may take to record its replies."""


class Simulation:
    def __init__(
        self, config: SimulationConfig, progress: Callable[[str], None] | None = None
    ) -> None:
        self.config = config
        self.progress = progress or (lambda _: None)
        self.rng = random.Random(config.seed)
        self.run_dir = Path(tempfile.mkdtemp(prefix="gateway-ledger-sim-"))
        self.db = config.db or str(self.run_dir / "ledger.db")
        conversations = backlog_conversations(config.conversations, config.turns, config.backlog)
        self.backlog = backlog_depths(conversations, config.turns, config.backlog)
        self.turns, dead = build_turns(config.seed, conversations, config.turns)
        self.platforms = default_platforms(dead)
        self.report = Report(
            seed=config.seed,
            db=self.db,
            reconcile=config.reconcile,
            conversations=conversations,
            backlog=config.backlog,
        )
        self.report.platforms = {
            name: PlatformReport(
                reconciles=b.reconcile if config.reconcile else "none",
                limits={name: [sends, per] for name, sends, per in b.limits},
            )
            for name, b in self.platforms.items()
        }
        self.spec_path = self.run_dir / "spec.json"
        self.workers: dict[int, subprocess.Popen[bytes]] = {}
        spec: dict[str, Any] = {
            "db": self.db,
            "seed": config.seed,
            "journal_dir": str(self.run_dir),
            "run_dir": str(self.run_dir),
            "workers": config.workers,
            "reconcile": config.reconcile,
            "platforms": {n: b.to_dict() for n, b in self.platforms.items()},
            "turns": [t.to_dict() for t in self.turns],
            "backlog": self.backlog if config.backlog else None,
        }
        self.faults: FaultPlan | None = None
        self.env: dict[str, str] | None = None
        if config.faults:
            spec["faults"] = True
            self.report.faults = FaultReport()
            self.faults = FaultPlan(self)
            if self.faults.postgres:
                self.env = {**os.environ, **LEASE_ENV}
        self.spec_path.write_text(json.dumps(spec))

    def spawn(self, role: str, index: int) -> subprocess.Popen[bytes]:
        with open(self.run_dir / f"{role}-{index}.log", "ab") as log_file:
            return subprocess.Popen(
                [sys.executable, "-m", WORKER_MODULE, str(self.spec_path), role, str(index)],
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                env=self.env,
            )

    def reap(self, procs: list[subprocess.Popen[bytes]]) -> None:
        for proc in procs:
            if proc.wait(timeout=60) != 0:
                self.report.gateway_failures += 1

    def done(self, index: int) -> bool:
        return (self.run_dir / f"done-{index}").exists()

    def started_for(self, index: int) -> float:
        """Seconds on the monotonic clock since worker INDEX began delivering (inf if not yet)."""
        marker = self.run_dir / f"started-{index}"
        try:
            age = time.time() - marker.stat().st_mtime
        except FileNotFoundError:
            return float("inf")
        return time.monotonic() - age

    def run(self) -> Report:
        try:
            report = self._run()
        finally:
            if self.faults is not None:
                self.faults.close()
        self.tidy(report)
        return report

    def tidy(self, report: Report) -> None:
        """A passing run's directory goes (its store too, unless ``--db`` named one): it
        holds a store and its key file. A failed run's stays, named in the report: its
        journals, logs and store are what tells which send went wrong."""
        if not report.ok:
            report.kept = str(self.run_dir)
            return
        shutil.rmtree(self.run_dir, ignore_errors=True)
        if self.config.db is None:
            report.db = ""

    def record_backlog(self) -> None:
        """The backlog phase (``--backlog``): one gateway with no platform connected records
        the backlog's replies (owed, unsent), then dies by SIGKILL, owning them all."""
        proc = self.spawn("backlog", 0)
        marker = self.run_dir / "backlog.json"
        deadline = time.monotonic() + BACKLOG_TIMEOUT
        while not marker.exists():
            code = proc.poll()
            if code is not None:
                raise RuntimeError(f"the backlog gateway failed with exit code {code}")
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise RuntimeError("the backlog gateway did not record its replies in time")
            self.progress(f"recording a backlog of {self.config.backlog} replies")
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()  # reaped: a zombie's /proc entry would look alive to the sweeps
        self.report.kills += 1
        self.report.backlog_recorded = json.loads(marker.read_text())

    def _run(self) -> Report:
        started = time.monotonic()
        if self.config.backlog:
            self.record_backlog()
        workers = self.workers
        workers.update({i: self.spawn("worker", i) for i in range(self.config.workers)})
        sweepers: list[subprocess.Popen[bytes]] = []
        kills_left = self.config.kills
        # Kills are timed from the moment a worker is really delivering (its started-INDEX
        # marker), not from the driver's start: a slow interpreter start-up on a loaded
        # machine must not let every worker finish before the first kill.
        kill_delay = self.rng.uniform(0.05, 0.4)
        while True:
            for i, proc in list(workers.items()):
                code = proc.poll()
                if code is not None and not self.done(i):
                    raise RuntimeError(f"simulated worker {i} failed with exit code {code}")
            if all(self.done(i) for i in workers):
                break
            now = time.monotonic()
            paused = self.faults.paused_index if self.faults is not None else None
            live = [
                i
                for i, p in workers.items()
                if p.poll() is None and self.started_for(i) + kill_delay <= now and i != paused
            ]
            if kills_left and live and (self.faults is None or self.faults.may_kill(kills_left)):
                victim = self.rng.choice(live)
                os.kill(workers[victim].pid, signal.SIGKILL)
                workers[victim].wait()  # reaped: a zombie's /proc entry would look alive
                (self.run_dir / f"started-{victim}").unlink(missing_ok=True)
                self.report.kills += 1
                kills_left -= 1
                if self.faults is not None:
                    # before the restart and its sweeper start, so both meet the fault
                    self.faults.after_kill(victim, kills_left, f"kill {self.report.kills}")
                # The replacement and a sweeper start together: two gateways sweep at once.
                workers[victim] = self.spawn("worker", victim)
                sweepers.append(self.spawn("sweeper", 100 + self.report.kills))
                self.report.restarts += 1
                self.report.sweeper_runs += 1
                kill_delay = self.rng.uniform(0.1, 0.6)
            if self.faults is not None:
                self.faults.tick(kills_left)
            self._show(started)
            time.sleep(0.05)
        if self.faults is not None:
            self.faults.finish_mid_run()
        self.reap(list(workers.values()) + sweepers)  # an exiting owner still looks alive
        # Closing time: two gateways sweep the same store at once until nothing is owed.
        for _ in range(8):
            if self._unresolved_count() == 0:
                break
            pair = [self.spawn("sweeper", 900 + n) for n in range(2)]
            self.reap(pair)
            self.report.sweeper_runs += 2
            self._show(started)
        self.report.seconds = round(time.monotonic() - started, 2)
        self._count()
        return self.report

    def _show(self, started: float) -> None:
        done = sum(self.done(i) for i in range(self.config.workers))
        self.progress(
            f"{time.monotonic() - started:5.1f}s  kills {self.report.kills}/{self.config.kills}"
            f"  sweeper runs {self.report.sweeper_runs}"
            f"  workers done {done}/{self.config.workers}"
        )

    def _unresolved_count(self) -> int:
        ledger = DeliveryLedger.open(self.db)
        try:
            n = 0
            for turn in self.turns:
                try:
                    status = ledger.get(self.oid(turn))
                except NotFound:
                    if self.faults is None or not self.faults.is_forgotten(turn.conversation):
                        n += 1
                    continue
                except Exception:
                    if self.faults is None:
                        raise
                    continue  # unreadable: no sweep can settle it; the count says what it is
                n += status.state not in ("delivered", "abandoned")
            return n
        finally:
            ledger.close()

    @staticmethod
    def oid(turn: Turn) -> str:
        return compute_obligation_id(turn.session_key, turn.inbound_id, turn.content)

    def journals(self) -> Copies:
        """Every message the platforms received, by (reply_to, kind, identity) of its part."""
        copies: Copies = {}
        for platform in self.platforms:
            journal = self.run_dir / f"{platform}.db"
            for msg in read_journal(journal):
                copies.setdefault(part_key(msg), []).append(msg)
        return copies

    def _count(self) -> None:
        r = self.report
        copies: Copies = {}
        asked: Counter[tuple[str, int]] = Counter()
        for platform in self.platforms:
            journal = self.run_dir / f"{platform}.db"
            r.deduplicated_by_platform += count_deduplicated(journal)
            requests = read_reconcile_requests(journal)
            r.platforms[platform].round_trips = len(requests)
            r.reconcile_round_trips += len(requests)
            asked.update(requests)
            for msg in read_journal(journal):
                r.messages_received += 1
                copies.setdefault(part_key(msg), []).append(msg)
        for got in copies.values():
            # The original is the copy handed to the platform first, not the first to land:
            # a send stopped mid-flight (SIGSTOP) may land after the marked copy of its
            # claimer, yet it was sent before the claim and is no re-send.
            got.sort(key=lambda m: (m.sent_at, m.seq))
        abandoned: Counter[str] = Counter()
        answered: Counter[tuple[str, int]] = Counter()
        read: set[str] = set()
        order = OrderTally(inbound_of={self.oid(t): t.inbound_id for t in self.turns})
        ledger = DeliveryLedger.open(self.db)
        try:
            if self.faults is not None:
                self.faults.read_quarantine(ledger)
            for turn in self.turns:
                got_by_part = parts_of(turn, copies)
                try:
                    status = ledger.get(self.oid(turn))
                    history = ledger.history(self.oid(turn))
                except NotFound:
                    if self.faults is not None and self.faults.is_forgotten(turn.conversation):
                        self.faults.count_unrecorded(turn)
                        continue
                    r.lost += 1
                    continue
                except Exception:
                    if self.faults is None:
                        raise
                    self.faults.count_unreadable(turn, got_by_part)
                    continue
                r.obligations += 1
                tally_platform(r.platforms[turn.platform], history)
                read.add(self.oid(turn))
                answered.update(answers_recorded(self.oid(turn), history))
                order.add(turn.inbound_id, turn.index, history)
                missing, marked, unlabelled = tally(got_by_part)
                r.unlabelled_duplicates += unlabelled
                if self.faults is not None:
                    self.faults.count_readable(turn, status, history, got_by_part, ledger)
                types = [h.type for h in history]
                if status.state == "abandoned":
                    abandoned[status.abandon_reason or "?"] += 1
                    continue
                if status.state != "delivered":
                    r.unresolved += 1
                    r.lost += missing
                    continue
                r.delivered += 1
                r.lost += missing
                first_time = (
                    types.count("Attempting") == 1
                    and "Claimed" not in types
                    and "Failed" not in types
                )
                settled = any(h.type == "Reconciled" and h.fields.get("completes") for h in history)
                claimed_unsent = (
                    "Claimed" in types and "Attempting" not in types[: types.index("Claimed")]
                )
                if first_time:
                    r.delivered_first_time += 1
                elif claimed_unsent:
                    r.recovered_unsent += 1  # owed and never sent when its owner died
                elif settled:
                    r.settled_by_reconciliation += 1  # the platform said it arrived: not re-sent
                elif marked:
                    r.redelivered_with_marker += 1
                else:
                    r.redelivered_plain += 1
            if self.faults is None:
                audit = ledger.audit_duplicates()
                r.audit_problems = audit.counts()
                r.audit_labelled_duplicates = audit.labelled_duplicates
                platform_of = {self.oid(t): t.platform for t in self.turns}
                for dup in audit.possible_duplicates:
                    if dup.labelled and dup.obligation_id in platform_of:
                        r.platforms[platform_of[dup.obligation_id]].labelled_duplicates += 1
            else:
                self.faults.audit(ledger)
        finally:
            ledger.close()
        r.abandoned = dict(sorted(abandoned.items()))
        self._count_order(order)
        if self.faults is not None:
            self.faults.count_messages(copies)
        finished: set[int] = set()
        for path in self.run_dir.glob("*-*-*.json"):  # one per gateway process that finished
            finished.add(int(path.stem.rsplit("-", 1)[1]))
            figures = json.loads(path.read_text())
            r.ledger_faults += figures.get("ledger_faults", 0)
            r.reconcile_bad_answers += figures.get("reconcile_bad_answers", 0)
        r.reconcile_lost_to_kills, r.reconcile_unrecorded = unrecorded_requests(
            asked, answered, read, finished
        )
        r.obligations_per_second = round(r.obligations / r.seconds, 1) if r.seconds else 0.0

    def _count_order(self, order: OrderTally) -> None:
        """Order as users saw it, against the histories; the platforms' enforcement."""
        r = self.report
        arrivals = [a for p in self.platforms for a in read_arrivals(self.run_dir / f"{p}.db")]
        overtaken = order.overtaken(arrivals)
        r.out_of_order = len(overtaken)
        r.out_of_order_ids = overtaken[:10]
        as_seen = order.overtaken(arrivals, with_dropped=False)
        r.out_of_order_after_drop = len(set(as_seen) - set(overtaken))
        r.order_released = order.order_released
        r.order_released_by_reason = dict(sorted(order.released_by_reason.items()))
        r.waits = order.waits
        r.waited_seconds = {k: round(v, 3) for k, v in sorted(order.waited_by_reason.items())}
        r.pacing_p95_seconds = round(percentile(order.waited, 0.95), 3)
        r.pacing_max_seconds = round(max(order.waited, default=0.0), 3)
        for name in self.platforms:
            enforced = read_enforcement(self.run_dir / f"{name}.db")
            p = r.platforms[name]
            p.handoffs = enforced.handoffs
            p.rate_limit_violations = enforced.violations
            p.bans = enforced.bans
            p.banned_seconds = enforced.banned_seconds
            r.handoffs += enforced.handoffs
            r.rate_limit_violations += enforced.violation_count
            r.bans += enforced.bans


def answers_recorded(oid: str, history: list[Any]) -> Counter[tuple[str, int]]:
    """The reconciliation answers in one obligation's history, by the pid that recorded
    each: what the platform's requests are matched against."""
    return Counter((oid, h.fields["by"].pid) for h in history if h.type == "Reconciled")


def unrecorded_requests(
    asked: Counter[tuple[str, int]],
    answered: Counter[tuple[str, int]],
    read: set[str],
    finished: set[int],
) -> tuple[int, int]:
    """Requests a platform answered that no ``Reconciled`` of the asking process holds,
    among the obligations ``read``: (those whose asker never finished, killed before it
    could record the answer; those whose asker finished, which nothing explains)."""
    lost_to_kills = unexplained = 0
    for (oid, pid), n in asked.items():
        missing = n - answered[(oid, pid)]
        if oid not in read or missing <= 0:
            continue
        if pid in finished:
            unexplained += missing
        else:
            lost_to_kills += missing
    return lost_to_kills, unexplained


def tally_platform(p: PlatformReport, history: list[Any]) -> None:
    """One obligation's history, counted into its platform's figures (ADR 0050)."""
    p.obligations += 1
    for entry in history:
        fields = entry.fields
        ambiguous = entry.type == "Failed" and fields.get("classification") == "ambiguous"
        if ambiguous or (entry.type == "Claimed" and fields.get("needs_marker")):
            p.uncertain_sends += 1
        elif entry.type == "Reconciled":
            outcome = fields.get("outcome")
            if outcome == "arrived":
                p.reconciled_arrived += 1
            elif outcome == "not_arrived":
                p.reconciled_not_arrived += 1
            else:
                p.reconciled_unknown += 1
        elif entry.type == "StatusReported":
            p.status_reports += 1
            if fields.get("status") == "failed_after_acceptance":
                p.failed_after_acceptance += 1
