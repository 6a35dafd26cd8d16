"""The stored names of the domain's classes: fixed forever, wherever the code lives.

Every stored event names its class by a topic (``module:qualname``), and sealed events
bind that topic into their authenticated data. Topics were written when the domain was
flat (``gateway_ledger.domain.obligation``, ...); the code now lives in capability
folders, so each aggregate declares the module it has always been stored under with
``@stored_as``: its events are written under that topic and old events resolve to it.

The library resolves topics through ``register_topic`` (public) but writes them through
``get_topic``, which consults only its private ``_type_cache`` before deriving a topic
from the module path. This module is the one place that touches that cache;
``tests/test_stored_topics.py`` pins the behaviour, so a library upgrade that changes it
fails there, not in a store.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from eventsourcing import utils as library_utils
from eventsourcing.domain import CanMutateAggregate
from eventsourcing.utils import register_topic

T = TypeVar("T", bound=type)

STORED_AGGREGATES: dict[type, str] = {}
"""Every aggregate class declared with ``@stored_as``, and the module it is stored under."""

TOPIC_ALIASES: dict[str, type] = {}
"""Topics an event class was stored under before it was renamed (``formerly``): old events
resolve to the renamed class; new ones are written under its new topic."""


def stored_classes(aggregate: type) -> list[type]:
    """The aggregate class and every event class nested in it."""
    nested = [
        value
        for value in vars(aggregate).values()
        if isinstance(value, type)
        and issubclass(value, CanMutateAggregate)
        and value.__qualname__.startswith(aggregate.__qualname__ + ".")
    ]
    return [aggregate, *nested]


def stored_as(
    module: str, *, formerly: Mapping[str, Sequence[str]] | None = None
) -> Callable[[T], T]:
    """Class decorator: write and resolve the aggregate and its events under ``module``.

    ``formerly``: for an event class that was renamed, its name (nested in the aggregate)
    -> the names it had; events stored under those still resolve to it (ADR 0055).
    """

    def pin(aggregate: T) -> T:
        STORED_AGGREGATES[aggregate] = module
        for cls in stored_classes(aggregate):
            topic = f"{module}:{cls.__qualname__}"
            register_topic(topic, cls)
            library_utils._type_cache[cls] = topic
        for name, old_names in (formerly or {}).items():
            renamed = getattr(aggregate, name)
            for old in old_names:
                alias = f"{module}:{aggregate.__qualname__}.{old}"
                register_topic(alias, renamed)
                TOPIC_ALIASES[alias] = renamed
        return aggregate

    return pin


def topics_of(cls: type) -> list[str]:
    """Every topic events of ``cls`` are stored under: its own, then its former ones."""
    return [library_utils.get_topic(cls), *(t for t, c in TOPIC_ALIASES.items() if c is cls)]
