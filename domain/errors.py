"""Errors the domain raises. Each names what was refused, so a log line is enough."""

from __future__ import annotations


class LedgerError(Exception):
    """Base class of every error gateway-ledger raises on purpose."""


class InvalidInput(LedgerError, ValueError):
    """A command was given something it cannot store faithfully; nothing was written."""


class IllegalTransition(LedgerError):
    """An aggregate refused a transition its state does not allow; nothing was appended."""

    def __init__(self, aggregate: str, ident: str, state: str, transition: str, why: str = ""):
        self.aggregate = aggregate
        self.ident = ident
        self.state = state
        self.transition = transition
        self.why = why
        detail = f": {why}" if why else ""
        super().__init__(f"{aggregate} {ident} is {state}; refused {transition}{detail}")


class NotFound(LedgerError, KeyError):
    """No aggregate has the given id."""

    def __init__(self, kind: str, ident: str):
        self.kind = kind
        self.ident = ident
        super().__init__(f"no {kind} with id {ident!r}")

    def __str__(self) -> str:  # KeyError would quote the whole message otherwise
        return str(self.args[0])


class ConcurrentUpdate(LedgerError):
    """Another writer appended to the same aggregate first (optimistic concurrency lost)."""

    def __init__(self, kind: str, ident: str, transition: str):
        self.kind = kind
        self.ident = ident
        self.transition = transition
        super().__init__(
            f"{kind} {ident} was changed by another writer while {transition} was being "
            "recorded; reload and decide again"
        )


class UndecodableEvent(LedgerError):
    """A stored event this version cannot turn back into a fact: its type is unknown (a
    newer release wrote it), its bytes do not decode, or its sealed personal fields fail
    authentication. The obligation it belongs to is quarantined, never sent (ADR 0027)."""

    def __init__(self, aggregate_id: str, version: int, reason: str, detail: str = ""):
        self.aggregate_id = aggregate_id
        self.version = version
        self.reason = reason
        self.detail = detail
        why = f": {detail}" if detail else ""
        super().__init__(f"event v{version} of {aggregate_id} is {reason}{why}")
