"""Every event class's ``__init__`` (domain/events.py) is the frozen dataclass's, done with
one store per field: the same signature, the same instance, still frozen. And every
aggregate begins at ``FIRST_VERSION``, which readers take as an aggregate's first event."""

from __future__ import annotations

import dataclasses
import inspect
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from eventsourcing.domain import DomainEvent

from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.events import FIRST_VERSION, plain_initialiser
from gateway_ledger.domain.privacy.erasure import Erasure
from gateway_ledger.domain.sessions.route import InboundMessage, SessionKeying, SessionRoute
from gateway_ledger.domain.sessions.session import Session
from gateway_ledger.domain.topics import STORED_AGGREGATES, stored_classes
from gateway_ledger.domain.values import DeliveryTarget, OwnerIdentity

AGGREGATES = (DeliveryObligation, Session, SessionRoute, SessionKeying, InboundMessage, Erasure)
EVENT_CLASSES = [
    cls
    for aggregate in AGGREGATES
    for cls in stored_classes(aggregate)
    if issubclass(cls, DomainEvent)
]


def twin(cls: type) -> type:
    """A subclass of ``cls`` that the library's metaclass makes a dataclass again: its
    ``__init__`` is the one ``dataclasses`` generates for the same fields."""
    made: type = type(cls.__name__, (cls,), {"__module__": cls.__module__})
    assert "__init__" in vars(made) and vars(made)["__init__"] is not vars(cls)["__init__"]
    return made


def arguments(cls: type) -> dict[str, Any]:
    """A value for every field without a default: a UUID for the originator, else a
    distinct object (``__init__`` stores what it is given; the commands validate)."""
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if field.default is dataclasses.MISSING:
            values[field.name] = uuid.uuid4() if field.name == "originator_id" else object()
    return values


def test_every_aggregate_is_covered() -> None:
    assert set(AGGREGATES) == set(STORED_AGGREGATES)
    assert len(EVENT_CLASSES) > 20


@pytest.mark.parametrize("cls", EVENT_CLASSES, ids=lambda c: c.__qualname__)
def test_the_dataclass_signature_and_instance(cls: type) -> None:
    generated = twin(cls)
    # Not the dataclass's: that one reaches ``object.__setattr__`` through a closure.
    assert "__dataclass_builtins_object__" in vars(generated)["__init__"].__code__.co_freevars
    assert vars(cls)["__init__"].__code__.co_freevars == ()
    assert inspect.signature(cls.__init__) == inspect.signature(generated.__init__)
    assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"
    assert cls.__signature__ == inspect.signature(generated)  # type: ignore[attr-defined]

    given = arguments(cls)
    ours, theirs = cls(**given), generated(**given)
    assert vars(ours) == vars(theirs)
    assert list(vars(ours)) == [f.name for f in dataclasses.fields(cls)]  # field order
    # Positionally too, as the dataclass's ``__init__`` takes them.
    in_order = [given.get(f.name, f.default) for f in dataclasses.fields(cls)]
    assert vars(cls(*in_order)) == vars(ours)


@pytest.mark.parametrize("cls", EVENT_CLASSES, ids=lambda c: c.__qualname__)
def test_still_frozen_and_still_checked(cls: type) -> None:
    given = arguments(cls)
    event = cls(**given)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.originator_version = 7
    with pytest.raises(TypeError, match="non-UUID originator_id"):  # the library's check
        cls(**{**given, "originator_id": "not-a-uuid"})
    missing = dict(given)
    missing.pop("originator_version")
    with pytest.raises(TypeError, match="originator_version"):
        cls(**missing)
    with pytest.raises(TypeError, match="unexpected keyword"):
        cls(**given, not_a_field=1)


def test_a_field_that_needs_more_than_a_default_keeps_the_dataclass_init() -> None:
    @dataclasses.dataclass(frozen=True)
    class WithFactory:
        items: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True)
    class KeywordOnly:
        name: str = dataclasses.field(kw_only=True)

    @dataclasses.dataclass(frozen=True)
    class NotInInit:
        name: str = dataclasses.field(default="x", init=False)

    assert plain_initialiser(WithFactory) is None
    assert plain_initialiser(KeywordOnly) is None
    assert plain_initialiser(NotInInit) is None


def test_a_default_is_the_fields_own_object() -> None:
    attempting = DeliveryObligation.Attempting
    given = arguments(attempting)
    event = attempting(**given)
    assert event.guard is None and event.needs_marker is None
    assert vars(event) == vars(twin(attempting)(**given))


def test_fields_named_like_the_initialisers_own_names() -> None:
    @dataclasses.dataclass(frozen=True)
    class Odd:
        self: int
        state: str = "s"

    initialiser = plain_initialiser(Odd)
    assert initialiser is not None
    assert inspect.signature(initialiser) == inspect.signature(Odd.__init__)
    odd = Odd.__new__(Odd)
    initialiser(odd, 1, "x")
    assert vars(odd) == vars(Odd(1, "x")) == {"self": 1, "state": "x"}
    plain = Odd.__new__(Odd)
    initialiser(plain, 2)
    assert vars(plain) == {"self": 2, "state": "s"}


@pytest.mark.parametrize("aggregate", AGGREGATES, ids=lambda a: a.__name__)
def test_every_aggregate_begins_at_the_first_version(aggregate: type) -> None:
    """Readers tell an aggregate's first event by ``FIRST_VERSION`` (a view's fold, a
    sweep's shared reads, ADRs 0080 and 0081): no aggregate begins anywhere else."""
    assert aggregate.INITIAL_VERSION == FIRST_VERSION  # type: ignore[attr-defined]


def test_a_new_obligation_is_at_the_first_version() -> None:
    obligation = DeliveryObligation.record(
        obligation_id="first-version",
        session_key="agent:main:telegram:dm:1",
        target=DeliveryTarget(platform="telegram", chat_id="1"),
        content="hello",
        owner=OwnerIdentity(host="h", boot_id="b", pid=1),
        now=datetime(2026, 12, 7, tzinfo=UTC),
    )
    assert [e.originator_version for e in obligation.collect_events()] == [FIRST_VERSION]
