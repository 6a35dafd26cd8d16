"""What caused the events being written, and which turn they belong to (ADR 0058).

Every event the ledger or the session store writes carries, in its stored metadata
(not in the domain event's fields), three ids taken from the context of the code that
made it:

- ``correlation_id``: shared by every event of one turn (an inbound message and all that
  follows from it: its session events, its reply's record, sends, retries, settle), or of
  one sweep run or operator command when no turn is open;
- ``causation_id``: what directly caused it: ``inbound:<digest>`` (the inbound message,
  keyed, never in clear), ``sweep:<run id>``, ``operator:<command>:<who>``;
- ``trace_id``: the OpenTelemetry trace the write happened in, when one is recording.

An embedding gateway that wants its session events and its reply in one turn opens the
turn itself, around both (``gateway_ledger.turn(correlation_id)``); otherwise ``deliver``
opens one for the reply. The context is a ``ContextVar``, so it follows asyncio tasks and
callbacks scheduled from them; the group-commit writer stamps each event when it is
handed over, on the caller's side, since it writes on its own thread.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import attrs

from gateway_ledger.application.observability import tracing

META = "_meta_"
"""The stored state's key for an event's metadata, and the event attribute it is read into."""


@attrs.frozen
class Cause:
    correlation_id: str
    causation_id: str


_CAUSE: ContextVar[Cause | None] = ContextVar("gateway_ledger_cause", default=None)


def current() -> Cause | None:
    return _CAUSE.get()


def new_id() -> str:
    return uuid.uuid4().hex


class caused_by:
    """Within: events written are caused by ``causation_id``, in the turn ``correlation_id``
    (default: the turn already open, else a new one). A class, not a generator: it is
    on the path of every reply."""

    __slots__ = ("cause", "token")

    def __init__(self, causation_id: str, correlation_id: str | None = None) -> None:
        if correlation_id is None:
            outer = _CAUSE.get()
            correlation_id = outer.correlation_id if outer is not None else new_id()
        self.cause = Cause(str(correlation_id), str(causation_id))

    def __enter__(self) -> Cause:
        self.token = _CAUSE.set(self.cause)
        return self.cause

    def __exit__(self, *exc: object) -> None:
        _CAUSE.reset(self.token)


@contextlib.contextmanager
def turn(correlation_id: str | None = None, cause: str = "") -> Iterator[Cause]:
    """Open a turn: every event written within shares ``correlation_id`` (a new one if
    None). The public form (``gateway_ledger.turn``) for an embedding gateway."""
    with caused_by(cause or "turn", correlation_id or new_id()) as opened:
        yield opened


def metadata() -> dict[str, str] | None:
    """The metadata of an event written now: the open cause and the recording trace."""
    cause = _CAUSE.get()
    trace_id = tracing.trace_id()
    if cause is None and trace_id is None:
        return None
    meta: dict[str, str] = {}
    if cause is not None:
        meta["correlation_id"] = cause.correlation_id
        meta["causation_id"] = cause.causation_id
    if trace_id is not None:
        meta["trace_id"] = trace_id
    return meta


def stamp(events: Any) -> None:
    """Give each event not stamped yet the metadata of the current context (the caller's
    side of a write that another thread carries out). The context is read only if some
    event needs it: the writer thread's events were stamped where they were handed over."""
    meta: dict[str, str] | None = None
    for event in events:
        state = event.__dict__
        if META not in state:
            if meta is None:
                meta = metadata()
                if meta is None:
                    return
            state[META] = meta


def of(event: Any) -> dict[str, str]:
    """An event's metadata as stored ({} for an event written before events had any)."""
    found = event.__dict__.get(META)
    return dict(found) if found else {}


def inbound(ledger: Any, session_key: str, inbound_message_id: str | None) -> str:
    """The cause of a reply: its inbound message, named by a keyed digest of the session
    key and message id (the ledger's keyring: stable, not reversible by enumeration),
    never the id in clear. ``inbound:-`` when there is none, or no keyring to name it."""
    if not inbound_message_id:
        return "inbound:-"
    try:
        digest = ledger.private_mapper.keyring.keyed_name(f"{session_key}\0{inbound_message_id}")
    except Exception:  # no key, store down: the reply goes out all the same
        return "inbound:-"
    return f"inbound:{digest[:24]}"


def open_turn_or(cause: str) -> str:
    """The correlation id of the turn already open (the embedding gateway's), else one
    named after ``cause`` (the same inbound message gives the same turn, in any process)."""
    outer = _CAUSE.get()
    if outer is not None:
        return outer.correlation_id
    _, _, ref = cause.partition(":")
    return ref if ref and ref != "-" else new_id()
