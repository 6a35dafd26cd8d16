"""What one event does to a view, as values: the projection decides, the store executes.

A projection turns each event into one of these changes of one row, keyed by the
aggregate's id. It says nothing of tables, statements or transactions: the store that
keeps the view (``infrastructure/views/``) turns a change into its own statements and
commits it together with the view's position. So the same projection is kept in SQLite
and in PostgreSQL, and a rebuild replays exactly the changes the live view made.

A column's new value is a plain value, or one of the column operations below, which
describe a value relative to the row as it was before the change (so that a change
never needs the row to be read first).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs


@attrs.frozen(slots=True)
class Add:
    """The column's value before the change, plus ``amount`` (a counter)."""

    amount: int = 1


@attrs.frozen(slots=True)
class Previous:
    """The value ``column`` held before the change (an earlier value kept aside)."""

    column: str


Value = object
"""A column's new value: a plain value, an :class:`Add` or a :class:`Previous`."""


@attrs.frozen(slots=True)
class Insert:
    """A new row; a row the key already has is kept as it is (a replayed first event)."""

    key: str
    values: Mapping[str, Value]


@attrs.frozen(slots=True)
class Update:
    """Change some columns of the row, if there is one and it still takes changes."""

    key: str
    values: Mapping[str, Value]


@attrs.frozen(slots=True)
class Delete:
    """The row leaves the view, if it still takes changes."""

    key: str


@attrs.frozen(slots=True)
class Upsert:
    """A whole row for a key seen for the first time; for a row the key already has
    (and that still takes changes), only the columns named in ``replace``."""

    key: str
    values: Mapping[str, Value]
    replace: tuple[str, ...]


RowChange = Insert | Update | Delete | Upsert
