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


class UnsafeSecretFile(InvalidInput):
    """A key or secret file that others can read, or that another user owns (and so may
    have planted): adopting it would hand them the sealed data; nothing was read or written."""


class MasterKeyMissing(LedgerError):
    """The store holds data sealed under a master key that is nowhere to be found: a new
    key could not open it, so none is made and nothing is written."""


class NotAStore(LedgerError):
    """A command that works on an existing store was given something else: a missing
    path, a directory, another application's file, or a store it cannot reach."""


class ReadOnlyStore(LedgerError):
    """A command that appends was given a store this process may only read."""


class ConflictingRecord(LedgerError):
    """An obligation id was recorded again with other content; nothing was appended.

    The id is a hash of the turn and the reply, so this is a caller's bug (two replies
    given one id), never a retry: the first record stands. Names the fields, not values.
    """

    def __init__(self, ident: str, fields: tuple[str, ...]):
        self.ident = ident
        self.fields = fields
        super().__init__(
            f"obligation {ident} is recorded already with another {', '.join(fields)}; "
            "the first record stands and nothing was appended"
        )


class SessionErased(LedgerError):
    """A session's data key was destroyed (``sessions forget``, maybe in another process)
    while this process still held it: a write sealed with it is refused, nothing appended.

    Data sealed under a key belongs to that key's period of the session; once the key is
    gone that period is erased and takes no more data (ADR 0028). The destroyed key is
    forgotten here too, so a later write for the session starts a new key.
    """

    def __init__(self, subject_ids: tuple[str, ...]) -> None:
        self.subject_ids = tuple(subject_ids)
        super().__init__(
            f"subject(s) {', '.join(self.subject_ids)} erased while this write was sealed "
            "with their key; nothing was written"
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
