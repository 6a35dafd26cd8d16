"""What one event does to a view, as values: the projection decides, the store executes.

A projection turns each event into one of these changes of one row, keyed by the
aggregate's id. It says nothing of tables, statements or transactions: the store that
keeps the view (``infrastructure/views/``) turns a change into its own statements and
commits it together with the view's position. So the same projection is kept in SQLite
and in PostgreSQL, and a rebuild replays exactly the changes the live view made.

An update gives its columns' new values, and may give some columns a value relative to
the row as it was before the change (:class:`Add`, :class:`Previous`, :class:`Case`), so
that no change needs the row to be read first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import attrs


class Add(NamedTuple):
    """The column's value before the change, plus ``amount`` (a counter)."""

    amount: int = 1


class Previous(NamedTuple):
    """The value ``column`` held before the change (an earlier value kept aside)."""

    column: str


class Case(NamedTuple):
    """A value chosen by what the row held in ``columns`` before the change: ``choices``
    pairs each combination of their (integer) values, in the order of ``columns``, with
    the new (integer) value; for any other combination the column keeps its value."""

    columns: tuple[str, ...]
    choices: tuple[tuple[tuple[int, ...], int], ...]


Value = object
"""A column's new value, as the store holds it (text, integers, NULL)."""

Relative = Add | Previous | Case

NO_RELATIVE: Mapping[str, Relative] = {}


# Changes are made once per event, on the views' hot path: plain slotted classes (a
# frozen attrs class costs several times as much to make). Nothing mutates them.


@attrs.define(slots=True)
class Insert:
    """A new row; a row the key already has is kept as it is (a replayed first event)."""

    key: str
    values: Mapping[str, Value]


@attrs.define(slots=True)
class Update:
    """Change some columns of the row, if there is one and it still takes changes:
    ``values`` are their new values, ``relative`` (usually a constant of the projection)
    the columns whose new value depends on the row before the change."""

    key: str
    values: Mapping[str, Value]
    relative: Mapping[str, Relative] = NO_RELATIVE


@attrs.define(slots=True)
class Delete:
    """The row leaves the view, if it still takes changes."""

    key: str


@attrs.define(slots=True)
class Upsert:
    """A whole row for a key seen for the first time; for a row the key already has
    (and that still takes changes), only the columns named in ``replace``."""

    key: str
    values: Mapping[str, Value]
    replace: tuple[str, ...]


RowChange = Insert | Update | Delete | Upsert
