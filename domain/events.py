"""Event classes whose ``__init__`` stores each field once, into the instance's ``__dict__``.

The library makes every domain event a frozen dataclass. A frozen dataclass's generated
``__init__`` has to go around the class's own ``__setattr__`` (which refuses every
assignment), so it calls ``object.__setattr__`` once per field: a slot-wrapper call and an
attribute look-up each time. A reply builds three events on the event loop, and a session
turn two or more; their ``__init__`` was the largest single piece of building them.

``@fields_set_once`` gives each event class of an aggregate an ``__init__`` with the
dataclass's own signature (the same names, order and defaults, taken from
``dataclasses.fields``) that writes the values into ``__dict__`` directly, then calls
``__post_init__`` as the dataclass's does (the library checks the originator id there).
Nothing else changes: the instance is as frozen afterwards (assigning still raises
``FrozenInstanceError``), equality, ``repr`` and the library's ``__signature__`` are the
dataclass's, and an event decoded from the store never calls ``__init__`` anyway. A class
whose fields need more than a plain default (a factory, ``init=False``, keyword-only)
keeps the dataclass's ``__init__``. ``tests/test_event_init.py`` pins, for every event
class, the same signature and the same instance as the dataclass's ``__init__`` gives.

The code is generated as the ``dataclasses`` module generates its own: one ``exec`` of a
function's text per class, at import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from eventsourcing.domain import Aggregate, DomainEvent

from gateway_ledger.domain.topics import stored_classes

T = TypeVar("T", bound=type)

FIRST_VERSION: int = Aggregate.INITIAL_VERSION
"""The version of every aggregate's first event: the library's, which no aggregate here
overrides (``tests/test_event_init.py`` pins it). Readers that tell an aggregate's first
event from the others (a view's fold, a sweep's shared reads) ask this, not a literal."""


def fields_set_once(aggregate: T) -> T:
    """Class decorator for an aggregate: its nested event classes get an ``__init__`` that
    stores each field once (see the module's docstring)."""
    for cls in stored_classes(aggregate):
        if issubclass(cls, DomainEvent) and "__init__" in vars(cls):
            initialiser = plain_initialiser(cls)
            if initialiser is not None:
                cls.__init__ = initialiser  # type: ignore[method-assign]
    return aggregate


def plain_initialiser(cls: type) -> Callable[..., None] | None:
    """An ``__init__`` for the dataclass ``cls`` with its generated one's signature that
    writes the fields into ``__dict__``; None where a field needs more than a default."""
    fields = dataclasses.fields(cls)
    defaults: dict[str, Any] = {}
    parameters = []
    for field in fields:
        if not field.init or field.kw_only or field.default_factory is not dataclasses.MISSING:
            return None
        if field.default is dataclasses.MISSING:
            parameters.append(field.name)
        else:
            defaults[f"__default_{field.name}__"] = field.default
            parameters.append(f"{field.name}=__default_{field.name}__")
    # The instance is ``self``, as in the dataclass's signature, unless a field takes that
    # name (then, as ``dataclasses`` does, another); its dict is a name no field can take.
    me = "__dataclass_self__" if any(f.name == "self" for f in fields) else "self"
    lines = [
        f"def __init__({me}, {', '.join(parameters)}):",
        f"    __fields__ = {me}.__dict__",
    ]
    lines += [f"    __fields__[{field.name!r}] = {field.name}" for field in fields]
    if hasattr(cls, "__post_init__"):
        lines.append(f"    {me}.__post_init__()")
    namespace: dict[str, Any] = {}
    exec("\n".join(lines), dict(defaults), namespace)  # as the dataclasses module does
    initialiser: Callable[..., None] = namespace["__init__"]
    generated = vars(cls)["__init__"]
    initialiser.__qualname__ = generated.__qualname__
    initialiser.__module__ = generated.__module__
    initialiser.__annotations__ = dict(generated.__annotations__)
    return initialiser
