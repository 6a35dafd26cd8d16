"""Encrypt personal fields at the edge: a Mapper that seals them on the way to the store.

The domain stays pure and its aggregates hold clear text in memory. On the way out, for
each event type named in a :class:`PrivacyPolicy`, the personal fields are gathered into
one AES-GCM ciphertext under the subject's data key, and the stored event keeps, in
their place, exactly what a reader sees once the key is destroyed: ``[erased]`` for
text, empty lists and mappings for collections. The ciphertext is bound (AAD) to its
subject, key, aggregate, version and event type, so it cannot be moved to another
event. Everything else (states, times, attempts, platform, owner, classification,
hashes) stays in clear: projections, sweeps and audits never need a key.

Declaring a new event type private is one line in a policy::

    SealedEvent(Session.MessageAppended, ("content", "source.user_name"))

and an aggregate whose state keeps personal data seals it in its snapshots too::

    SealedSnapshot(Session, ("key", "source.user_name"))
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from binascii import a2b_base64, b2a_base64
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from datetime import datetime
from typing import Any
from uuid import UUID

import attrs
import orjson
from cryptography.exceptions import InvalidTag
from eventsourcing.domain import Snapshot
from eventsourcing.persistence import (
    Mapper,
    MapperDeserialisationError,
    StoredEvent,
    Transcoder,
    find_id_convertor,
)
from eventsourcing.utils import TopicError, get_topic, resolve_topic

from gateway_ledger.application.observability.causes import META
from gateway_ledger.application.privacy.policy import PrivacyPolicy, SealedEvent
from gateway_ledger.domain.errors import UndecodableEvent
from gateway_ledger.domain.events import FIRST_VERSION
from gateway_ledger.domain.values import QuarantineReason
from gateway_ledger.infrastructure.privacy.keyring import KeyRing, WriteKeys
from gateway_ledger.infrastructure.randomness import shared_pool

log = logging.getLogger("gateway_ledger.privacy")

ERASED = "[erased]"
"""What readers see where personal data was, once its subject's key is gone."""

UNREADABLE = "[unreadable]"
"""What readers see where sealed personal data fails authentication (tampered, bit rot):
unlike ``[erased]``, the key exists and the ciphertext does not open with it."""

SEALED = "_sealed_"
ENCRYPT_ENV = "GATEWAY_LEDGER_ENCRYPT"
MAX_REMEMBERED_SUBJECTS = 8_192
"""Aggregate -> subject kept for the next event of an aggregate in flight (oldest go
first); a later event of one forgotten reads its subject from its first event once. At
100,000 this held about 190 bytes per reply long after the reply settled (19 MB)."""
_STATE_ONLY: ContextVar[bool] = ContextVar("gateway_ledger_state_only", default=False)
_KEEP_SEALED: ContextVar[bool] = ContextVar("gateway_ledger_keep_sealed", default=False)


@attrs.define
class Openings:
    """What opening sealed fields found while watched (see ``PrivateMapper.watching``):
    the aggregates with a field whose key is destroyed, and those with a field that fails
    authentication (first version). A sender asks this before handing text to a platform."""

    erased: set[UUID] = attrs.field(factory=set)
    unreadable: dict[UUID, int] = attrs.field(factory=dict)


_WATCH: ContextVar[Openings | None] = ContextVar("gateway_ledger_openings", default=None)
_Parsed = tuple[StoredEvent, type, dict[str, Any], dict[str, str] | None]
"""One stored event as read, and its parse: class, state (top level copied), envelope."""
_SHARED: ContextVar[dict[tuple[Any, int], _Parsed] | None] = ContextVar(
    "gateway_ledger_shared_parses", default=None
)
MAX_SHARED_PARSES = 512
"""Parses left by sealed reads for an opening read at most, within one ``sharing_parses``."""


@attrs.frozen
class Undecodable:
    """A stored event that did not decode, in place of its domain event (ADR 0027)."""

    originator_id: UUID
    originator_version: int
    topic: str
    reason: QuarantineReason
    detail: str
    obligation_id: str | None = None
    """Read from the bytes on a best-effort basis when the first event is the bad one."""

    @classmethod
    def of(cls, stored: StoredEvent, error: BaseException) -> Undecodable:
        if isinstance(error, UndecodableEvent):
            reason = QuarantineReason(error.reason)
            detail = error.detail
        elif isinstance(error, TopicError):
            reason, detail = QuarantineReason.UNKNOWN_TOPIC, f"unknown event type {stored.topic}"
        else:
            reason, detail = QuarantineReason.UNDECODABLE, f"{type(error).__name__}: {error}"
        return cls(
            originator_id=stored.originator_id,  # type: ignore[arg-type]
            originator_version=stored.originator_version,
            topic=stored.topic,
            reason=reason,
            detail=detail.splitlines()[0][:200] if detail else "",
            obligation_id=_named_id(stored),
        )

    def error(self) -> UndecodableEvent:
        return UndecodableEvent(
            str(self.originator_id), self.originator_version, self.reason.value, self.detail
        )


def _named_id(stored: StoredEvent) -> str | None:
    """The ``obligation_id`` a first event's bytes still name, if they parse at all."""
    if stored.originator_version != 1 or not stored.state:
        return None
    try:
        value = orjson.loads(stored.state).get("obligation_id")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return value if isinstance(value, str) and value.isprintable() else None


DECODING_ERRORS: tuple[type[BaseException], ...] = (
    UndecodableEvent,
    TopicError,
    MapperDeserialisationError,
    TypeError,
    ValueError,
    KeyError,
    AttributeError,
    IndexError,
)
"""What stored bytes that are not a well-formed event raise while decoded (a store or
key fault, such as ``PersistenceError`` or ``MasterKeyMismatch``, is none of these)."""


def _well_formed(envelope: Any) -> bool:
    """A sealed envelope names its subject, and its key and ciphertext when it has one."""
    if type(envelope) is not dict or type(envelope.get("s")) is not str:
        return False
    if "c" in envelope or "k" in envelope:
        return type(envelope.get("c")) is str and type(envelope.get("k")) is str
    return True


class _KeyFault(Exception):
    """A fault of the keyring (bad master key, store down) met while opening an event: not
    bad bytes, so never a quarantine; re-raised as the original error."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


_SHAPES: dict[type, frozenset[str]] = {}


def _fields_of(cls: type) -> frozenset[str]:
    """The fields an event of ``cls`` may have. (Which it must have the class does not
    say: a field added later has a default in its mutator, not in the event class, so a
    missing one is found when the event is applied.)"""
    allowed = _SHAPES.get(cls)
    if allowed is None:
        fields = dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ()
        allowed = _SHAPES[cls] = frozenset(f.name for f in fields)
    return allowed


def placeholder(value: Any) -> Any:
    if isinstance(value, str):
        return ERASED
    if isinstance(value, list | tuple):
        return []
    if isinstance(value, dict):
        return {}
    return None


_EMPTYABLE = (str, list, tuple, dict)
"""Types whose empty values (like ``None``) are stored as they are, not sealed."""


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _undecodable(stored: StoredEvent, detail: str) -> UndecodableEvent:
    return UndecodableEvent(
        str(stored.originator_id),
        stored.originator_version,
        QuarantineReason.UNDECODABLE.value,
        detail,
    )


def _malformed_value(state: dict[str, Any], type_names: Mapping[str, Any]) -> str | None:
    """The field whose value is one of our typed values that lost its shape (a flipped bit
    in ``"_data_"``, say), or None. The transcoder leaves such a value a plain dict, as it
    must for user metadata that only looks like a tag; in an event's own clear fields (an
    owner, a target, a time) it would pass for a value and break a reader later."""
    for name, value in state.items():
        if type(value) is dict and value.get("_type_") in type_names:
            return name
    return None


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in attrs.fields(cls))
    return names


def _with_placeholders(value: Any, changes: dict[str, Any]) -> Any:
    """A copy of an attrs value with some fields replaced, skipping its validators.

    For the stored copy's placeholders (``[erased]``, ``None``, empty), which a validator
    may not expect, and for fields just opened; ``attrs.evolve`` would re-run them.
    """
    cls = type(value)
    copy = object.__new__(cls)
    for name in _field_names(cls):
        object.__setattr__(copy, name, changes[name] if name in changes else getattr(value, name))
    return copy


@attrs.frozen
class _SealPlan:
    """A spec's field paths, split once: plain fields, and attrs fields per holder."""

    plain: tuple[str, ...]
    nested: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]  # head, ((attr, path), ...)

    @classmethod
    def of(cls, fields: tuple[str, ...]) -> _SealPlan:
        plain: list[str] = []
        nested: dict[str, list[tuple[str, str]]] = {}
        for path in fields:
            head, _, attr = path.partition(".")
            if attr:
                nested.setdefault(head, []).append((attr, path))
            else:
                plain.append(head)
        return cls(tuple(plain), tuple((h, tuple(a)) for h, a in nested.items()))


def _parse_key(stored_event: StoredEvent) -> tuple[Any, int]:
    """Which event a kept parse is of: its aggregate (``_aggregate_key``) and version."""
    return _aggregate_key(stored_event.originator_id), stored_event.originator_version


def _aggregate_key(originator_id: Any) -> Any:
    """An aggregate in the kept parses' keys: a UUID by its integer (hashed in C, a UUID's
    hash is a Python call)."""
    return originator_id.int if type(originator_id) is UUID else originator_id


@attrs.frozen
class _EventClass:
    """What mapping needs to know of one event class, worked out once per mapper."""

    topic: str
    class_version: int
    snapshot: bool
    spec: SealedEvent | None
    plan: _SealPlan | None


_PLANS: dict[tuple[str, ...], _SealPlan] = {}


def _plan(fields: tuple[str, ...]) -> _SealPlan:
    plan = _PLANS.get(fields)
    if plan is None:
        plan = _PLANS[fields] = _SealPlan.of(fields)
    return plan


def _aad(subject: str, key_id: str, originator_id: Any, version: int, topic: str) -> bytes:
    return f"gateway-ledger/event/v1|{subject}|{key_id}|{originator_id}|{version}|{topic}".encode()


class PrivateMapper(Mapper[UUID]):
    """The library's Mapper, plus sealing and opening of the policy's personal fields."""

    def __init__(
        self,
        transcoder: Transcoder,
        policy: PrivacyPolicy,
        keyring: KeyRing,
        *,
        encrypt: bool = True,
        first_event: Callable[[UUID], StoredEvent | None] | None = None,
    ) -> None:
        super().__init__(transcoder=transcoder)
        self.policy = policy
        self.keyring = keyring
        self.encrypt = encrypt
        self.first_event = first_event
        self._subjects: OrderedDict[str, str] = OrderedDict()  # oldest first
        self._random = shared_pool
        self._classes: dict[type, _EventClass] = {}
        self._tagged_with = getattr(transcoder, "tagged_with", None)
        self._type_names: Mapping[str, Any] = getattr(transcoder, "names", {})

    def _event_class(self, cls: type) -> _EventClass:
        facts = self._classes.get(cls)
        if facts is None:
            topic = get_topic(cls)
            spec = self.policy.by_topic.get(topic)
            facts = self._classes[cls] = _EventClass(
                topic=topic,
                class_version=getattr(cls, "class_version", 1),
                snapshot=issubclass(cls, Snapshot),
                spec=spec,
                plan=_plan(spec.fields) if spec is not None else None,
            )
        return facts

    def seals(self, cls: type) -> bool:
        """Whether events of this class keep anything sealed at rest: a reader that must
        see one as the store holds it (a view decodes with its personal fields left
        sealed) can take an event of a class that seals nothing from memory as it is."""
        facts = self._event_class(cls)
        return self.encrypt and (facts.spec is not None or facts.snapshot)

    # -- subjects of aggregates -------------------------------------------------------------

    def subject_of(self, originator_id: UUID) -> str | None:
        """The subject of an aggregate, from its sealed first event (None: none recorded)."""
        key = str(originator_id)
        subject = self._subjects.get(key)
        if subject is None and self.first_event is not None:
            stored = self.first_event(originator_id)
            if stored is not None and SEALED.encode() in stored.state:
                subject = orjson.loads(stored.state)[SEALED]["s"]
                self._remember(key, subject)
        return subject

    def remembered_subject(self, originator_id: UUID) -> str | None:
        """The subject of an aggregate whose sealed events this mapper sealed or opened
        (None: not known here); never reads the store."""
        return self._subjects.get(str(originator_id))

    def _remember(self, originator_id: str, subject: str) -> None:
        subjects = self._subjects
        if originator_id not in subjects and len(subjects) >= MAX_REMEMBERED_SUBJECTS:
            try:  # noqa: SIM105 - not contextlib.suppress: three calls more, once per reply
                subjects.popitem(last=False)
            except KeyError:  # another thread emptied it meanwhile
                pass
        subjects[originator_id] = subject

    # -- writing ----------------------------------------------------------------------------

    def to_stored_event(self, domain_event: Any, keys: WriteKeys | None = None) -> StoredEvent:
        """The stored event, its personal fields sealed; with the data keys of the write
        that stores it (``keys``, see ``KeyRing.writing``), or, outside any write, with
        keys stored at once."""
        facts = self._event_class(domain_event.__class__)
        topic = facts.topic
        state = domain_event.__dict__.copy()
        originator_id = state.pop("originator_id")
        originator_version = state.pop("originator_version")
        if facts.class_version > 1:
            state["class_version"] = facts.class_version
        if self.encrypt:
            if facts.snapshot:
                shot = self.policy.snapshot_by_topic.get(state["topic"])
                if shot is not None:
                    subject = self.subject_of(originator_id)
                    if subject is not None:  # else: its events were stored in clear
                        state["state"] = dict(state["state"])
                        envelope = self._seal(
                            _plan(shot.fields),
                            state["state"],
                            subject,
                            originator_id,
                            originator_version,
                            topic,
                            keys,
                            None,
                        )
                        state[SEALED] = envelope
            elif facts.spec is not None:
                assert facts.plan is not None
                oid_text = str(originator_id)  # once: subject lookup and AAD
                found = self._subject_for(facts.spec, state, originator_id, oid_text)
                if found is not None:
                    state[SEALED] = self._seal(
                        facts.plan,
                        state,
                        found,
                        oid_text,
                        originator_version,
                        topic,
                        keys,
                        domain_event.timestamp if facts.spec.dated_by_the_ledger else None,
                    )
        return StoredEvent(
            originator_id=originator_id,
            originator_version=originator_version,
            topic=topic,
            state=self.transcoder.encode(state),
        )

    def _subject_for(
        self, spec: SealedEvent, state: dict[str, Any], originator_id: Any, oid_text: str
    ) -> str | None:
        if spec.subject_from:
            subject = self.keyring.subject_id(str(state[spec.subject_from]))
            self._remember(oid_text, subject)
            return subject
        found = self._subjects.get(oid_text)
        if found is None:
            found = self.subject_of(originator_id)
        if found is None:
            log.debug("aggregate %s has no subject (stored in clear before)", originator_id)
        return found

    def _seal(
        self,
        plan: _SealPlan,
        state: dict[str, Any],
        subject: str,
        originator_id: Any,
        version: int,
        topic: str,
        keys: WriteKeys | None,
        made_at: datetime | None,
    ) -> dict[str, str]:
        """Move the fields' values out of ``state`` into one ciphertext; return the envelope.
        ``made_at`` (an event dated by the ledger's clock) lets the key ring refuse one
        made before an erasure of its subject (ADR 0071)."""
        secret: dict[str, Any] = {}
        for head in plan.plain:
            value = state.get(head)
            if value is None or (not value and isinstance(value, _EMPTYABLE)):
                continue
            secret[head] = value
            state[head] = ERASED if type(value) is str else placeholder(value)
        for head, attributes in plan.nested:
            holder = state.get(head)
            changes: dict[str, Any] = {}
            for attr, path in attributes:
                value = getattr(holder, attr, None)
                if value is None or (not value and isinstance(value, _EMPTYABLE)):
                    continue
                secret[path] = value
                changes[attr] = ERASED if type(value) is str else placeholder(value)
            if changes:
                state[head] = self._placeholders(holder, changes)
        if not secret:
            return {"s": subject}
        key_id, aead = self.keyring.sealing_key(subject, keys, made_at)
        nonce = self._random.take(12)
        aad = _aad(subject, key_id, originator_id, version, topic)
        sealed = aead.encrypt(nonce, self.transcoder.encode(secret), aad)
        return {"s": subject, "k": key_id, "c": b2a_base64(nonce + sealed, newline=False).decode()}

    def _placeholders(self, holder: Any, changes: dict[str, Any]) -> Any:
        """The stored form of an attrs value with some fields replaced by placeholders."""
        tagged_with = self._tagged_with
        if tagged_with is not None:
            tagged = tagged_with(holder, changes)
            if tagged is not None:
                return tagged
        return _with_placeholders(holder, changes)

    # -- reading ----------------------------------------------------------------------------

    @staticmethod
    @contextlib.contextmanager
    def state_only() -> Iterator[None]:
        """Within: events declared ``state_free`` keep their placeholders (not decrypted).

        For rebuilding an aggregate, which never reads those fields: a session's load
        then costs no decryption per transcript message. Readers of the fields (history,
        exports) read outside this context and get them opened.
        """
        token = _STATE_ONLY.set(True)
        try:
            yield
        finally:
            _STATE_ONLY.reset(token)

    @staticmethod
    @contextlib.contextmanager
    def sealed() -> Iterator[None]:
        """Within: no event is decrypted; every personal field keeps its placeholder.

        For readers that never look at personal fields (the recoverable view): they need
        no data key, and never hold the text in memory.
        """
        token = _KEEP_SEALED.set(True)
        try:
            yield
        finally:
            _KEEP_SEALED.reset(token)

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        """The domain event; ``UndecodableEvent`` (a ``LedgerError`` naming the event) when
        the stored bytes are not one this version can read."""
        try:
            return self._built(stored_event, *self._decoded(stored_event))
        except _KeyFault as fault:
            raise fault.original from None
        except DECODING_ERRORS as e:
            raise Undecodable.of(stored_event, e).error() from e

    def to_domain_events(self, stored_events: Sequence[StoredEvent]) -> list[Any]:
        """Like ``to_domain_event`` for each, with the data keys they need read in one go."""
        found = self.decode_each(stored_events)
        for event in found:
            if type(event) is Undecodable:
                raise event.error()
        return found

    def decode_each(self, stored_events: Sequence[StoredEvent]) -> list[Any]:
        """Like ``to_domain_events``, but an event that does not decode is returned as an
        :class:`Undecodable` in its place instead of failing the others (ADR 0027)."""
        decoded: list[Any] = []
        for stored in stored_events:
            try:
                decoded.append(self._decoded(stored))
            except DECODING_ERRORS as e:
                decoded.append(Undecodable.of(stored, e))
        self.keyring.prefetch_opening(
            (d[2]["s"], d[2]["k"])
            for d in decoded
            if type(d) is tuple and d[2] is not None and "c" in d[2]
        )
        events: list[Any] = []
        for stored, d in zip(stored_events, decoded, strict=True):
            if type(d) is not tuple:
                events.append(d)
                continue
            try:
                events.append(self._built(stored, *d))
            except _KeyFault as fault:
                raise fault.original from None
            except DECODING_ERRORS as e:
                events.append(Undecodable.of(stored, e))
        return events

    @staticmethod
    @contextlib.contextmanager
    def sharing_parses() -> Iterator[None]:
        """Within: a sealed read (a view's) leaves each stored event it read and its parse
        for the next read that opens the same bytes (a sweep's view catches up over the
        orphans' events, then its load takes them, ``shared_history``, to open what the
        view left sealed): that read skips the transcoder's parse and the checks of its
        shape, and does the rest (opening, building) itself. A parse left serves one read
        and is gone; at most ``MAX_SHARED_PARSES`` wait at once (the first ones: beyond
        them, a long catch-up pays only a length check per event); all go when the block
        ends. A snapshot's parse is not left (opening one writes into its nested state)."""
        token = _SHARED.set({})
        try:
            yield
        finally:
            _SHARED.reset(token)

    @staticmethod
    def shared_history(originator_id: UUID, version: int) -> list[StoredEvent] | None:
        """Within ``sharing_parses``: the aggregate's stored events, from its first version
        (``FIRST_VERSION``) to ``version``, as the sealed reads that left their parses read
        them; None unless every one of them was left (the reader then reads them from the
        store)."""
        shared = _SHARED.get()
        if not shared:
            return None
        key = _aggregate_key(originator_id)
        found: list[StoredEvent] = []
        for v in range(FIRST_VERSION, version + 1):
            left = shared.get((key, v))
            if left is None:
                return None
            found.append(left[0])
        return found

    @staticmethod
    @contextlib.contextmanager
    def watching() -> Iterator[Openings]:
        """Within: every aggregate whose sealed fields could not be opened is noted."""
        openings = Openings()
        token = _WATCH.set(openings)
        try:
            yield openings
        finally:
            _WATCH.reset(token)

    def _decoded(
        self, stored_event: StoredEvent
    ) -> tuple[type, dict[str, Any], dict[str, str] | None]:
        """The event's class, its state, and its envelope if it is to be opened."""
        shared = _SHARED.get()
        if shared is None:
            cls, event_state, envelope = self._parsed(stored_event)
        else:
            cls, event_state, envelope = self._shared_parse(stored_event, shared)
        if envelope is not None and (_STATE_ONLY.get() or _KEEP_SEALED.get()):
            spec = self.policy.by_topic.get(stored_event.topic)
            if _KEEP_SEALED.get() or (spec is not None and spec.state_free):
                self._remember(str(stored_event.originator_id), envelope["s"])
                envelope = None
        return cls, event_state, envelope

    def _shared_parse(
        self, stored_event: StoredEvent, shared: dict[tuple[Any, int], _Parsed]
    ) -> tuple[type, dict[str, Any], dict[str, str] | None]:
        """Within ``sharing_parses``: a sealed read parses and leaves its parse; an opening
        read takes the parse left for the same bytes, or parses its own."""
        if _KEEP_SEALED.get():
            cls, event_state, envelope = self._parsed(stored_event)
            if len(shared) < MAX_SHARED_PARSES and not self._event_class(cls).snapshot:
                # A copy of the top level: the reader's build replaces top-level fields.
                kept = dict(event_state)
                shared[_parse_key(stored_event)] = (stored_event, cls, kept, envelope)
            return cls, event_state, envelope
        left = shared.pop(_parse_key(stored_event), None)
        if left is not None and left[0].state == stored_event.state:
            return left[1], dict(left[2]), left[3]
        return self._parsed(stored_event)

    def _parsed(
        self, stored_event: StoredEvent
    ) -> tuple[type, dict[str, Any], dict[str, str] | None]:
        """The event's class, its state and its envelope, as stored, its shape checked."""
        cls = resolve_topic(stored_event.topic)
        try:
            event_state: dict[str, Any] = self.transcoder.decode(stored_event.state)
        except Exception as e:
            msg = (
                f"Failed to deserialise state of stored event with topic "
                f"'{stored_event.topic}', originator_id '{stored_event.originator_id}' and "
                f"originator_version {stored_event.originator_version}: {e}"
            )
            raise MapperDeserialisationError(msg) from e
        envelope = event_state.pop(SEALED, None)
        if envelope is not None and not _well_formed(envelope):
            raise _undecodable(stored_event, "malformed sealed envelope")
        malformed = _malformed_value(event_state, self._type_names)
        if malformed is not None:
            raise _undecodable(stored_event, f"malformed typed value in {malformed!r}")
        return cls, event_state, envelope

    def _built(
        self,
        stored_event: StoredEvent,
        cls: type,
        event_state: dict[str, Any],
        envelope: dict[str, str] | None,
    ) -> Any:
        meta = event_state.pop(META, None)  # the write's metadata: not a field (ADR 0058)
        facts = self._event_class(cls)  # what the class says, looked up once per mapper
        if envelope is not None:
            target = event_state["state"] if facts.snapshot else event_state
            self._open(envelope, target, stored_event, cls)
        id_convertor = find_id_convertor(cls, type(stored_event.originator_id))  # type: ignore[arg-type]
        event_state["originator_id"] = id_convertor(stored_event.originator_id)
        event_state["originator_version"] = stored_event.originator_version
        class_version = facts.class_version
        from_version = event_state.pop("class_version", 1)
        while from_version < class_version:
            getattr(cls, f"upcast_v{from_version}_v{from_version + 1}")(event_state)
            from_version += 1
        allowed = _fields_of(cls)
        if allowed and not event_state.keys() <= allowed:
            unknown = sorted(event_state.keys() - allowed)
            raise _undecodable(stored_event, f"{cls.__name__} with unknown fields {unknown}")
        if meta is not None:
            event_state[META] = meta
        domain_event: Any = object.__new__(cls)
        object.__setattr__(domain_event, "__dict__", event_state)
        return domain_event

    def _open(
        self, envelope: dict[str, str], state: dict[str, Any], stored: StoredEvent, cls: type
    ) -> None:
        subject = envelope["s"]
        originator_id = str(stored.originator_id)  # for the memo and the AAD: one str() call
        self._remember(originator_id, subject)
        if "c" not in envelope:
            return
        key_id = envelope["k"]
        try:
            key = self.keyring.opening_key(subject, key_id)
        except Exception as e:
            raise _KeyFault(e) from e
        if key is None:
            watch = _WATCH.get()
            if watch is not None:
                watch.erased.add(stored.originator_id)  # type: ignore[arg-type]
            return  # erased: the clear placeholders are what remains
        _, aead = key
        blob = a2b_base64(envelope["c"])
        try:
            plain = aead.decrypt(
                blob[:12],
                blob[12:],
                _aad(subject, key_id, originator_id, stored.originator_version, stored.topic),
            )
        except InvalidTag:
            log.warning(
                "sealed fields of %s v%d fail authentication; shown as %s",
                stored.originator_id,
                stored.originator_version,
                UNREADABLE,
            )
            watch = _WATCH.get()
            if watch is not None:
                watch.unreadable.setdefault(stored.originator_id, stored.originator_version)  # type: ignore[arg-type]
            self._mark_unreadable(state, stored, cls)
            return
        secret: dict[str, Any] = self.transcoder.decode(plain)
        nested: dict[str, dict[str, Any]] = {}
        for path, value in secret.items():
            head, _, attr = path.partition(".")
            if attr:
                nested.setdefault(head, {})[attr] = value
            else:
                state[head] = value
        for head, changes in nested.items():
            # A copy with the opened fields, without re-running validators: GCM has just
            # authenticated these values, which were valid when they were sealed.
            state[head] = _with_placeholders(state[head], changes)

    def _mark_unreadable(self, state: dict[str, Any], stored: StoredEvent, cls: type) -> None:
        """Text placeholders of fields that fail authentication read ``[unreadable]``."""
        spec = None if issubclass(cls, Snapshot) else self.policy.by_topic.get(stored.topic)
        if spec is None:  # a snapshot keeps its placeholders; the watcher has noted it
            return
        plan = _plan(spec.fields)
        for head in plan.plain:
            if state.get(head) == ERASED:
                state[head] = UNREADABLE
        for head, attributes in plan.nested:
            holder = state.get(head)
            changes = {
                attr: UNREADABLE for attr, _ in attributes if getattr(holder, attr, None) == ERASED
            }
            if changes:
                state[head] = _with_placeholders(holder, changes)
