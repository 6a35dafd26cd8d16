"""What a simulation run is asked to do, and what it found (``gateway-ledger simulate``)."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class SimulationConfig:
    seed: int = 1
    conversations: int = 120
    turns: int = 4
    workers: int = 3
    kills: int = 8
    db: str | None = None
    faults: bool = False
    reconcile: bool = True
    """Adapters that can reconcile do (ADR 0050); ``--no-reconcile`` runs without."""
    backlog: int = 0
    """Replies recorded, owed and unsent, by a gateway that is killed before the workers
    start: their boot sweeps recover them all at once (``--backlog``)."""


@attrs.define
class Report:
    seed: int
    obligations: int = 0
    delivered: int = 0
    delivered_first_time: int = 0
    redelivered_with_marker: int = 0
    redelivered_plain: int = 0
    settled_by_reconciliation: int = 0
    """Delivered without a re-send: the platform said the uncertain send had arrived."""
    deduplicated_by_platform: int = 0
    abandoned: dict[str, int] = attrs.field(factory=dict)
    unresolved: int = 0
    lost: int = 0
    unlabelled_duplicates: int = 0
    audit_problems: dict[str, int] = attrs.field(factory=dict)
    """What ``audit duplicates`` finds in the ledger's own history (ADR 0011): the
    ledger's account, to set beside what the platforms received."""
    audit_labelled_duplicates: int = 0
    messages_received: int = 0
    kills: int = 0
    restarts: int = 0
    sweeper_runs: int = 0
    ledger_faults: int = 0
    gateway_failures: int = 0
    seconds: float = 0.0
    obligations_per_second: float = 0.0
    db: str = ""
    """The store; empty when it was the run's own, removed with the run's directory."""
    kept: str = ""
    """A failed run's directory, kept: the platforms' journals, the gateways' logs and,
    without ``--db``, the store. A passing run's is removed."""
    reconcile: bool = True
    platforms: dict[str, PlatformReport] = attrs.field(factory=dict)
    """Per platform: possible duplicates labelled, and what reconciliation answered."""
    reconcile_round_trips: int = 0
    """Platform requests reconciliation cost, all platforms (see ``PlatformReport``)."""
    reconcile_lost_to_kills: int = 0
    """Requests whose answer no ``Reconciled`` holds because the asking gateway was killed
    before it could record it: the gateway that claims the reply asks again."""
    reconcile_unrecorded: int = 0
    """Requests whose answer a gateway that ran to its end never recorded: must be 0
    without ``--faults`` (a fault counts in ``ledger_faults``)."""
    reconcile_bad_answers: int = 0
    conversations: int = 0
    backlog: int = 0
    """Replies owed and unsent when the workers started (``--backlog``)."""
    backlog_recorded: dict[str, int] = attrs.field(factory=dict)
    """The backlog gateway's outcomes by status (all ``queued`` when it did its part)."""
    recovered_unsent: int = 0
    """Delivered after a claim without any send before it: the backlog, recovered."""
    out_of_order: int = 0
    """Replies a user received after a later reply to the same chat, with no recorded
    release (``order.py``): must be 0."""
    out_of_order_ids: list[str] = attrs.field(factory=list)
    """The first few of them (inbound ids: ``in-CONVERSATION-TURN``)."""
    out_of_order_after_drop: int = 0
    """Replies the platform took in order, dropped (failed after acceptance) and got
    again after a later reply: out of order for the user, not for the gateway."""
    order_released: int = 0
    """``OrderReleased``: a reply sent before an earlier unresolved one, on the record."""
    order_released_by_reason: dict[str, int] = attrs.field(factory=dict)
    rate_limit_violations: int = 0
    """Sends a platform refused for its declared limits, or during a ban: must be 0."""
    bans: int = 0
    """Times a platform banned the bot for repeated violations: must be 0."""
    handoffs: int = 0
    """Sends the platforms took within their limits."""
    waits: int = 0
    """``Waited`` events: sends that waited for order, the rate budget or a pause."""
    waited_seconds: dict[str, float] = attrs.field(factory=dict)
    """Seconds waited in all, by reason (``order``, ``rate``, ``pause``)."""
    pacing_p95_seconds: float = 0.0
    """95th percentile over obligations of the seconds each waited in all."""
    pacing_max_seconds: float = 0.0
    faults: FaultReport | None = None

    @property
    def unexplained_audit_problems(self) -> int:
        explained = self.faults.audit_explained if self.faults is not None else {}
        return sum(self.audit_problems.values()) - sum(explained.values())

    @property
    def failed(self) -> list[str]:
        """The names of the judgments this run failed, so that a failure says which."""
        checks = {
            "lost": self.lost == 0,
            "unlabelled_duplicates": self.unlabelled_duplicates == 0,
            "unexplained_audit_problems": self.unexplained_audit_problems == 0,
            "unresolved": self.unresolved == 0,
            "gateway_failures": self.gateway_failures == 0,
            "out_of_order": self.out_of_order == 0,
            "rate_limit_violations": self.rate_limit_violations == 0,
            "bans": self.bans == 0,
        }
        failed = [name for name, passed in checks.items() if not passed]
        return failed + (self.faults.failed if self.faults is not None else [])

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict[str, Any]:
        # ``failed`` first: a truncated print of the report still says what failed.
        d = {"failed": self.failed, **attrs.asdict(self)}
        faults = d.pop("faults")
        if faults is not None:  # a --faults run: its figures sit beside the others
            d.update(faults)
        d["ok"] = self.ok
        return d


@attrs.define
class PlatformReport:
    """One platform's figures in a run (ADR 0050)."""

    reconciles: str = "none"
    obligations: int = 0
    labelled_duplicates: int = 0
    """Obligations the audit finds with two or more sends that may have arrived, each
    after the first labelled (the marker, or the platform's idempotency key)."""
    uncertain_sends: int = 0
    """Sends whose outcome was unknown: ambiguous failures, and claims after a send."""
    reconciled_arrived: int = 0
    reconciled_not_arrived: int = 0
    reconciled_unknown: int = 0
    round_trips: int = 0
    """Requests reconciliation made to the platform (none for webhooks already received)."""
    failed_after_acceptance: int = 0
    status_reports: int = 0
    limits: dict[str, list[float]] = attrs.field(factory=dict)
    """The limits it declared and enforced: ``{"per_chat": [sends, per_seconds]}``."""
    handoffs: int = 0
    rate_limit_violations: dict[str, int] = attrs.field(factory=dict)
    """Refused sends by kind: ``chat``, ``group``, ``bot`` (a limit), ``banned``."""
    bans: int = 0
    banned_seconds: float = 0.0


@attrs.define
class FaultReport:
    """What the planted faults did to what users got (``simulate --faults``)."""

    poisoned: int = 0
    poisoned_ids: list[str] = attrs.field(factory=list)
    poisoned_events: list[dict[str, Any]] = attrs.field(factory=list)
    poisoned_when: str = ""
    """At which kill the poison was planted (the restart and a sweeper then read it)."""
    poisoned_resent: int = 0
    """Messages users received for a poisoned obligation after it was poisoned (it had
    been delivered already): must be 0."""
    quarantined: int = 0
    quarantined_ids: list[str] = attrs.field(factory=list)
    quarantined_source: str = ""
    quarantined_unplanted: int = 0
    """Quarantined obligations that were not poisoned: replies the ledger could not read
    back although nothing damaged them."""
    forgotten: int = 0
    forgotten_in_flight: int = 0
    """Replies of the forgotten sessions recorded and unresolved when erasure began."""
    forgotten_turns_unrecorded: int = 0
    """Turns of a forgotten conversation that never became an obligation: not asked after
    the erasure, or refused under its destroyed key. Not owed, so not lost."""
    recorded_after_erasure: int = 0
    """Obligations of a forgotten session recorded once its erasure had begun, under a key
    the erasure did not destroy: a new key period (ADR 0071), readable and sent like any
    reply. Reported, not judged (a write under the destroyed key is refused; one that got
    through would not open, and its send would show the placeholder: ``erased_sent``)."""
    forget_errors: list[str] = attrs.field(factory=list)
    forget_seconds: list[float] = attrs.field(factory=list)
    """How long each erasure took (while it runs, other gateways' writes may wait)."""
    erased_sent: int = 0
    """Messages that carried the erased placeholder, or that a gateway took from the
    store after the session's erasure and sent to its chat (of a reply the erasure covered,
    not of one recorded afterwards under a fresh key): must be 0."""
    erased_sent_placeholder: int = 0
    erased_sent_after_forget: int = 0
    erased_sent_ids: list[str] = attrs.field(factory=list)
    """The obligations whose messages ``erased_sent`` counts, for reading their history."""
    erased_abandoned: int = 0
    paused: int = 0
    paused_seconds: float = 0.0
    paused_in_flight: int = 0
    pause_tries_in_transaction: int = 0
    """Pauses undone at once because the stopped gateway was inside a write transaction
    (holding locks that stall every writer of the store while it is stopped)."""
    paused_claimed: int = 0
    """Obligations another gateway claimed from the paused one."""
    paused_late_results: int = 0
    """Results the paused gateway reported after it was resumed, recorded as late."""
    late_results: int = 0
    unaccounted: int = 0
    """Recorded obligations that ended neither delivered, abandoned with a reason, nor
    quarantined."""
    unaccounted_ids: list[str] = attrs.field(factory=list)
    audit_explained: dict[str, int] = attrs.field(factory=dict)
    """Audit findings the planted faults explain: on a poisoned obligation, and the
    late result and displaced-but-alive owner of the paused gateway's claimed replies."""
    poisoned_reported_by_audit: int = 0
    """Poisoned obligations the duplicate audit names in a finding (reported, not judged)."""
    audit_error: str | None = None

    @property
    def failed(self) -> list[str]:
        """The names of the fault judgments this run failed."""
        checks = {
            "erased_sent": self.erased_sent == 0,
            "unaccounted": self.unaccounted == 0,
            "poisoned_resent": self.poisoned_resent == 0,
            "quarantined_unplanted": self.quarantined_unplanted == 0,
            "forget_errors": not self.forget_errors,
            "audit_error": self.audit_error is None,
        }
        return [name for name, passed in checks.items() if not passed]

    @property
    def ok(self) -> bool:
        return not self.failed
