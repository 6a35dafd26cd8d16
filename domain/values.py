"""Value objects of the delivery ledger: immutable, validated, free of I/O."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, TypeGuard, TypeVar

import attrs

from gateway_ledger.domain.errors import InvalidInput

ERROR_TEXT_LIMIT = 500
"""Upstream cuts ``last_error`` to 500 characters; so do we."""

MAX_CONTENT_BYTES = 8 * 1024 * 1024
"""A reply larger than this is refused: no chat platform accepts it, and events stay small."""

MAX_METADATA_BYTES = 64 * 1024
"""A reply's metadata (an adapter's options: parse mode, buttons, ...) larger than this,
counted as its strings' and keys' UTF-8 bytes plus 8 bytes per other value, is refused:
it rides in the same event as the reply, which every recovery reads again, and no
platform takes options a thousand times larger than its largest message."""

MAX_NAME_CHARS = 256
"""Ids, platform names, owner fields and operators' names are kept in clear and indexed:
one longer than this (a hostname is at most 253) is a caller's bug, not a name."""

MAX_REASON_CHARS = ERROR_TEXT_LIMIT
"""An operator's abandon reason or a session's resume reason is a sentence, kept with
the event for every later reader: longer is refused, like upstream's error text is cut."""


_Choice = TypeVar("_Choice", bound=StrEnum)

KNOWN_LISTS = (list, tuple)
"""What a caller passes as a list (of items, of parts) nearly always: known sequences, accepted
without asking the ABCs (whose checks cost more than the rest of the validation)."""


def is_item_list(value: object) -> TypeGuard[Iterable[Any]]:
    """``value`` can be a list of items (media): a list or tuple, or another iterable that is
    not text, bytes or a mapping (one item alone is not a list of them). The application
    checks it before it turns mappings into items, the domain before it records them."""
    return type(value) in KNOWN_LISTS or (
        not isinstance(value, str | bytes | Mapping) and isinstance(value, Iterable)
    )


def require_choice(name: str, value: object, choices: type[_Choice]) -> _Choice:
    """``value`` as a member of ``choices``; anything else is refused by name with the
    accepted values, before anything is written (a bare ``ValueError`` names nothing)."""
    if isinstance(value, choices):  # a member already: nothing to look up
        return value
    if isinstance(value, str):  # a member is a str too
        try:
            return choices(value)
        except ValueError:
            pass
    accepted = ", ".join(c.value for c in choices)
    raise InvalidInput(f"unknown {name} {value!r} (one of: {accepted})")


class ObligationState(StrEnum):
    PENDING = "pending"
    ATTEMPTING = "attempting"
    DELIVERED = "delivered"
    FAILED = "failed"
    CLAIMED = "claimed"
    ABANDONED = "abandoned"

    @property
    def is_final(self) -> bool:
        return self in (ObligationState.DELIVERED, ObligationState.ABANDONED)


UNRESOLVED_STATES = frozenset(
    {
        ObligationState.PENDING,
        ObligationState.ATTEMPTING,
        ObligationState.FAILED,
        ObligationState.CLAIMED,
    }
)


class ErrorClass(StrEnum):
    """How a failed send is judged (reference §2 item 6)."""

    REJECTED = "rejected"  # the platform definitely refused it: it did not arrive
    RATE_LIMITED = "rate_limited"  # refused for now; honour retry_after, spend no attempt
    AMBIGUOUS = "ambiguous"  # timeout / reset after the request left: it may have arrived
    DEAD_TARGET = "dead_target"  # bot blocked, chat gone: never retry

    @property
    def may_have_arrived(self) -> bool:
        return self is ErrorClass.AMBIGUOUS


class SendGuard(StrEnum):
    """What protected a send from being an unannounced duplicate, as the sender chose it."""

    NONE = "none"  # nothing could have arrived before: sent plain
    MARKER = "marker"  # an earlier send may have arrived: the "may be a duplicate" notice
    IDEMPOTENCY_KEY = "idempotency_key"  # the platform deduplicates on the obligation id


class AbandonReason(StrEnum):
    MAX_ATTEMPTS = "max_attempts"
    STALE = "stale"
    DEAD_TARGET = "dead_target"
    OPERATOR = "operator"
    ERASED = "erased"


class QuarantineReason(StrEnum):
    """Why an obligation is quarantined: not claimed, not sent, not delivered (ADR 0027)."""

    UNKNOWN_TOPIC = "unknown_topic"  # an event type this version does not know
    UNDECODABLE = "undecodable"  # stored bytes that do not decode into a well-formed event
    UNREADABLE = "unreadable"  # sealed personal fields that fail authentication


QUARANTINED = "quarantined"
"""The obligation index's state value for a quarantined obligation (not an
``ObligationState``: the aggregate keeps its state; the index shows this one instead)."""


def require_text(name: str, value: object, *, allow_empty: bool = False) -> str:
    """Refuse what cannot be stored and read back exactly (wrong type, lone surrogates).

    For text carried inside an event's JSON (message text, chat ids, metadata), which
    both stores keep as bytes: any Unicode text, NUL included. Text that is also kept in
    clear in a column of its own goes through :func:`require_clear_text`."""
    if not isinstance(value, str):
        raise InvalidInput(f"{name} must be a str, not {type(value).__name__}")
    if not allow_empty and (not value or value.isspace()):  # blank, without a stripped copy
        raise InvalidInput(f"{name} must not be empty")
    if value.isascii():  # the usual case: no surrogates possible, no encoded copy needed
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidInput(f"{name} is not valid Unicode text ({e.reason})") from None
    return value


def require_content(name: str, value: object) -> str:
    """A reply's text: anything :func:`require_text` keeps (empty too, a media-only reply),
    at most :data:`MAX_CONTENT_BYTES` in UTF-8."""
    text = require_text(name, value, allow_empty=True)
    # Four bytes a character at most: only a long text is encoded to be measured.
    if len(text) * 4 > MAX_CONTENT_BYTES and len(text.encode("utf-8")) > MAX_CONTENT_BYTES:
        raise InvalidInput(f"{name} is larger than {MAX_CONTENT_BYTES} bytes")
    return text


def require_clear_text(
    name: str, value: object, *, allow_empty: bool = False, max_chars: int = MAX_NAME_CHARS
) -> str:
    """Text kept in clear: ids, platform names, owner fields, operators' names and reasons.

    Such text reaches the views' and the lease table's text columns and operators'
    output, so besides what :func:`require_text` refuses it refuses NUL, which a
    PostgreSQL text column cannot hold (SQLite can: refused on both, so both stores take
    the same input), and more than ``max_chars`` characters.
    """
    text = require_text(name, value, allow_empty=allow_empty)
    if "\x00" in text:
        raise InvalidInput(f"{name} must not contain NUL (\\x00)")
    if len(text) > max_chars:
        raise InvalidInput(f"{name} is longer than {max_chars} characters")
    return text


def optional_text(name: str, value: object) -> str | None:
    if value is None:
        return None
    return require_text(name, _id_text(value))


def require_aware(name: str, value: object) -> datetime:
    if not isinstance(value, datetime):
        raise InvalidInput(f"{name} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInput(f"{name} must be timezone-aware")
    return value


_JSON_SCALARS = (str, int, float, bool, type(None))


def require_metadata(name: str, value: object) -> dict[str, Any]:
    """A reply's metadata: a mapping that survives a JSON round trip unchanged, at most
    :data:`MAX_METADATA_BYTES` (see there how it is counted)."""
    if not value and (value is None or type(value) is dict):
        return {}  # the usual case: none given, nothing to walk or weigh
    if value is not None and not isinstance(value, Mapping):
        raise InvalidInput(f"{name} must be a mapping, not {type(value).__name__}")
    meta = dict(value or {})
    require_json_like(name, meta)
    if _weight(meta) > MAX_METADATA_BYTES:
        raise InvalidInput(f"{name} is larger than {MAX_METADATA_BYTES} bytes")
    return meta


def _weight(value: object) -> int:
    """Roughly its JSON size: strings and keys in UTF-8 bytes, 8 bytes per other value."""
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode("utf-8"))
    if isinstance(value, dict):
        return 8 + sum(_weight(k) + _weight(v) for k, v in value.items())
    if isinstance(value, list):
        return 8 + sum(_weight(v) for v in value)
    return 8


def require_json_like(name: str, value: object, _depth: int = 0) -> Any:
    """Metadata must survive a JSON round trip unchanged: str keys, plain values only."""
    if _depth > 32:
        raise InvalidInput(f"{name} is nested too deeply")
    if isinstance(value, str):
        return require_text(name, value, allow_empty=True)
    if isinstance(value, float) and not math.isfinite(value):
        # JSON has no spelling for NaN or infinity; orjson would store null in their place.
        raise InvalidInput(f"{name} holds {value!r}, which JSON cannot carry")
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        raise InvalidInput(f"{name} holds an integer outside the 64-bit range")
    if isinstance(value, _JSON_SCALARS):
        return value
    if isinstance(value, dict):
        if set(value) == {"_type_", "_data_"}:
            raise InvalidInput(f"{name} uses the keys reserved for typed values (_type_, _data_)")
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidInput(f"{name} keys must be str, not {type(k).__name__}")
            require_text(f"{name} key", k, allow_empty=True)
            require_json_like(f"{name}[{k!r}]", v, _depth + 1)
        return value
    if isinstance(value, list):
        for i, v in enumerate(value):
            require_json_like(f"{name}[{i}]", v, _depth + 1)
        return value
    raise InvalidInput(f"{name} holds a {type(value).__name__}, which JSON cannot carry")


def _text(name: str, *, allow_empty: bool = False) -> Any:
    """An attrs validator that applies :func:`require_text`."""

    def check(_: object, __: attrs.Attribute[Any], value: object) -> None:
        require_text(name, value, allow_empty=allow_empty)

    return check


def _clear_text(name: str, *, allow_empty: bool = False) -> Any:
    """An attrs validator that applies :func:`require_clear_text`."""

    def check(_: object, __: attrs.Attribute[Any], value: object) -> None:
        require_clear_text(name, value, allow_empty=allow_empty)

    return check


def _id_text(value: object) -> object:
    """Platforms hand out numeric ids; they are keys, not numbers, so keep them as str."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def _non_negative(_: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if value < 0:
        raise InvalidInput(f"{attribute.name} must be >= 0")


@attrs.frozen
class OwnerIdentity:
    """Who holds an obligation: enough to tell a live process from a dead or reused one.

    ``start_time`` is the process start time in clock ticks since boot (``/proc`` field
    22); ``None`` when unknown, which liveness checks must treat as "cannot prove alive".
    """

    host: str = attrs.field(validator=_clear_text("host"))
    boot_id: str = attrs.field(validator=_clear_text("boot_id", allow_empty=True))
    pid: int = attrs.field(validator=[attrs.validators.instance_of(int), _non_negative])
    start_time: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(int))
    )
    installation_id: str = attrs.field(
        default="", validator=_clear_text("installation_id", allow_empty=True)
    )

    def same_process(self, other: OwnerIdentity) -> bool:
        return self == other

    def describe(self) -> str:
        return f"{self.host}/{self.pid}"


@attrs.frozen
class DeliveryTarget:
    """Where a reply goes: everything an adapter needs to address it again after a crash."""

    platform: str = attrs.field(validator=_clear_text("platform"))
    chat_id: str = attrs.field(converter=_id_text, validator=_text("chat_id"))
    thread_id: str | None = attrs.field(default=None)
    reply_to: str | None = attrs.field(default=None)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "thread_id", optional_text("thread_id", self.thread_id))
        object.__setattr__(self, "reply_to", optional_text("reply_to", self.reply_to))


@attrs.frozen
class MediaItem:
    """One attachment of a reply, by reference: the ledger stores where it is, not its bytes."""

    kind: str = attrs.field(validator=_text("media kind"))
    uri: str = attrs.field(validator=_text("media uri"))
    caption: str | None = attrs.field(default=None)
    mime_type: str | None = attrs.field(default=None)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "caption", optional_text("media caption", self.caption))
        object.__setattr__(self, "mime_type", optional_text("media mime_type", self.mime_type))


@attrs.frozen
class LedgerPolicy:
    """The upstream constants, as one value so tests and operators can change them."""

    max_attempts: int = attrs.field(default=3, validator=_non_negative)
    stale_after: timedelta = attrs.field(default=timedelta(hours=24))
    retry_backoff: tuple[timedelta, ...] = attrs.field(
        default=(timedelta(seconds=30), timedelta(seconds=120))
    )
    max_retry_after: timedelta = attrs.field(default=timedelta(minutes=15))
    order_wait: timedelta = attrs.field(default=timedelta(minutes=2))
    """How long a reply waits behind an earlier unresolved reply to the same chat before
    it goes anyway, recording ``OrderReleased`` (ADR 0065)."""

    def is_stale(self, recorded_at: datetime, now: datetime) -> bool:
        return now - recorded_at >= self.stale_after


def cut_error(text: str) -> str:
    """Diagnostic text is kept, never refused (a ledger fault must not lose a failure):
    lone surrogates become ``?`` so it can be stored, then it is cut like upstream's."""
    return text.encode("utf-8", "replace").decode("utf-8")[:ERROR_TEXT_LIMIT]


def receipt_ids(receipt: object) -> list[str]:
    """Platform message ids as text; a platform hands out ints or strs, nothing else."""
    if isinstance(receipt, str | bytes) or not isinstance(receipt, list | tuple):
        raise InvalidInput(f"receipt must be a list of message ids, not {type(receipt).__name__}")
    ids = []
    for i, item in enumerate(receipt):
        if isinstance(item, bool) or not isinstance(item, str | int):
            raise InvalidInput(f"receipt[{i}] must be a str or int, not {type(item).__name__}")
        ids.append(require_text(f"receipt[{i}]", _id_text(item)))
    return ids
