"""An orjson transcoder for the event store, with the library's Transcoding protocol.

The library's JSONTranscoder calls a Python hook for every object it cannot encode and
for every dict it decodes. Here orjson does the bulk in C: custom values (datetimes,
attrs value objects) are tagged ``{"_type_": name, "_data_": ...}`` exactly like the
library does, and decoding walks the loaded tree only when a tag is present.
See ADR 0004 for the measurements behind the choice.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import attrs
import orjson
from eventsourcing.persistence import Transcoder, Transcoding, TranscodingNotRegisteredError

_TYPE = "_type_"
_DATA = "_data_"
_TAG_BYTES = b'"_type_"'
_MEMO_SIZE = 64
_DECODED_SIZE = 1024
"""Frozen values kept decoded (owners, targets): then emptied, refilled as read."""
_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def isoformat(value: datetime) -> str:
    """``value.isoformat()``. For a time in UTC (every time the ledger makes) the same
    characters from orjson's RFC 3339 writer: ``isoformat`` builds them with printf-style
    formatting, which costs more than the rest of an event's encoding."""
    if value.tzinfo is UTC and type(value) is datetime:
        return orjson.dumps(value)[1:-1].decode()
    return value.isoformat()


class DatetimeAsISO(Transcoding):
    type = datetime
    name = "datetime_iso"

    def encode(self, obj: datetime) -> str:
        return isoformat(obj)

    def decode(self, data: str) -> datetime:
        return datetime.fromisoformat(data)


class AttrsTranscoding(Transcoding):
    """Encodes a flat attrs value object as a dict of its fields (nested values recurse)."""

    def __init__(self, cls: type, name: str | None = None) -> None:
        if not attrs.has(cls):
            raise TypeError(f"{cls!r} is not an attrs class")
        self.type = cls
        self.name = name or cls.__name__
        self.fields = tuple(f.name for f in attrs.fields(cls))
        # A frozen value's fields never change, so its encoding may be reused.
        self.frozen = getattr(cls.__setattr__, "__name__", "") == "_frozen_setattrs"

    def encode(self, obj: Any) -> dict[str, Any]:
        return {name: getattr(obj, name) for name in self.fields}

    def decode(self, data: dict[str, Any]) -> Any:
        return self.type(**data)


class OrjsonTranscoder(Transcoder):
    """Drop-in replacement for the library's JSONTranscoder, built on orjson."""

    def __init__(self) -> None:
        self.types: dict[type, Transcoding] = {}
        self.names: dict[str, Transcoding] = {}
        # id -> (value, its tagged encoding), for frozen attrs values: the same owner
        # identity is in nearly every event. Holding the value keeps its id unique.
        self._memo: dict[int, tuple[Any, dict[str, Any]]] = {}
        # (name, its data as JSON) -> the frozen value decoded from that data.
        self._decoded: dict[tuple[str, bytes], Any] = {}
        self.register(DatetimeAsISO())

    def register(self, transcoding: Transcoding) -> None:
        self.types[transcoding.type] = transcoding
        self.names[transcoding.name] = transcoding
        # Timestamps are in every event: encode and decode them without the generic lookup.
        self._iso_datetimes = type(self.types.get(datetime)) is DatetimeAsISO
        iso = self.names.get(DatetimeAsISO.name)
        self._iso_transcoding = iso if type(iso) is DatetimeAsISO else None

    def encode(self, obj: Any) -> bytes:
        try:
            return orjson.dumps(obj, default=self._encode_obj, option=_OPTIONS)
        except orjson.JSONEncodeError as e:
            # orjson wraps what ``default`` raises; give callers the library's own error.
            if isinstance(e.__cause__, TranscodingNotRegisteredError):
                raise e.__cause__ from None
            raise

    def decode(self, data: bytes) -> Any:
        obj = orjson.loads(data)
        if _TAG_BYTES in data:
            return self._walk(obj)
        return obj

    def tagged_with(self, value: Any, changes: Mapping[str, Any]) -> dict[str, Any] | None:
        """What a copy of the attrs ``value`` with ``changes`` encodes to, without the copy.

        For stored placeholders (sealing, ADR 0012): the same bytes as encoding the copy,
        without building a value its validators would refuse. None: not an attrs type here.
        """
        transcoding = self.types.get(type(value))
        if not isinstance(transcoding, AttrsTranscoding):
            return None
        data = {n: changes[n] if n in changes else getattr(value, n) for n in transcoding.fields}
        return {_TYPE: transcoding.name, _DATA: data}

    def _encode_obj(self, o: Any) -> dict[str, Any]:
        if type(o) is datetime and self._iso_datetimes:
            return {_TYPE: "datetime_iso", _DATA: isoformat(o)}
        hit = self._memo.get(id(o))
        if hit is not None and hit[0] is o:
            return hit[1]
        try:
            transcoding = self.types[type(o)]
        except KeyError:
            raise TranscodingNotRegisteredError(
                f"Object of type {type(o)} is not serializable. Please define and "
                "register a custom transcoding for this type."
            ) from None
        tagged = {_TYPE: transcoding.name, _DATA: transcoding.encode(o)}
        if getattr(transcoding, "frozen", False):
            if len(self._memo) >= _MEMO_SIZE:
                self._memo.clear()
            self._memo[id(o)] = (o, tagged)
        return tagged

    def _walk(self, obj: Any) -> Any:
        """Replace tagged dicts, bottom-up, in place; ``type() is`` keeps the hot loop cheap,
        and an empty container (an event's empty parts, media, metadata) is not entered."""
        if type(obj) is dict:
            if len(obj) == 2 and _TYPE in obj and _DATA in obj:
                return self._untag(obj)
            for key, value in obj.items():
                kind = type(value)
                if (kind is dict or kind is list) and value:
                    obj[key] = self._walk(value)
        elif type(obj) is list:
            for i, value in enumerate(obj):
                kind = type(value)
                if (kind is dict or kind is list) and value:
                    obj[i] = self._walk(value)
        return obj

    def _untag(self, tagged: dict[str, Any]) -> Any:
        try:
            transcoding = self.names[tagged[_TYPE]]
        except (KeyError, TypeError):
            raise TranscodingNotRegisteredError(
                f"Data serialized with name {tagged[_TYPE]!r} is not deserializable. "
                "Please register a custom transcoding for this type."
            ) from None
        data = tagged[_DATA]
        kind = type(data)
        if kind is dict and getattr(transcoding, "frozen", False):
            return self._frozen(transcoding, data)
        if transcoding is self._iso_transcoding and kind is str:
            return datetime.fromisoformat(data)  # every event's time: no call in between
        if kind is dict or kind is list:
            data = self._walk(data)
        return transcoding.decode(data)

    def _frozen(self, transcoding: Transcoding, data: dict[str, Any]) -> Any:
        """A frozen value read again (the same owner is in nearly every event, the same
        target in every event of a chat): the value already built, validated once. It is
        found by its data as read, written back as JSON (types and order included: ``1``,
        ``1.0`` and ``true`` differ), before anything inside is decoded. Only a value of
        plain fields is kept: one holding a list or a dict is built each time, so no two
        events share a container."""
        key = (transcoding.name, orjson.dumps(data))  # what orjson parsed, it writes back
        value = self._decoded.get(key)
        if value is None:
            kinds = set(map(type, data.values()))
            value = transcoding.decode(self._walk(data))
            if dict not in kinds and list not in kinds:
                if len(self._decoded) >= _DECODED_SIZE:
                    self._decoded.clear()
                self._decoded[key] = value
        return value
