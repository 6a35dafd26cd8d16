"""The upstream-compatible face of the delivery ledger: loose arguments in, dicts out.

An existing gateway calls the ledger as it called the upstream module: a receipt as one
message id or a list of them, media as mappings, an error classification or an abandon
reason as a string, and a sweep that answers with plain dicts. That looseness is
accepted here, and only here (as eventsourcing's ``cargoshipping/interface.py`` does
for its application), so the use cases and the domain below take and return typed
values. ``DeliveryLedger``'s upstream-named methods call these functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.domain.values import AbandonReason, ErrorClass, MediaItem, is_item_list


@attrs.frozen
class Claim:
    """An obligation the sweep claimed for this owner to send again."""

    obligation: DeliveryObligation
    needs_marker: bool


def claimed_item(claim: Claim) -> dict[str, Any]:
    """What the gateway needs to send it again, as upstream's dict (plus ``parts`` when
    the reply was chunked)."""
    obligation = claim.obligation
    target = obligation.target
    item: dict[str, Any] = {
        "obligation_id": obligation.obligation_id,
        "session_key": obligation.session_key,
        "platform": target.platform,
        "chat_id": target.chat_id,
        "thread_id": target.thread_id,
        "content": obligation.content,
        "needs_marker": claim.needs_marker,
        "attempts": obligation.recovery_attempts,
        "reply_to": target.reply_to,
        "media": [attrs.asdict(m) for m in obligation.media],
        "metadata": dict(obligation.metadata),
    }
    if obligation.parts:
        item["parts"] = list(obligation.parts)
    return item


def media_items(media: object) -> list[MediaItem]:
    """Media as ``MediaItem`` values or mappings of their fields; one item alone, a string
    or a mapping is refused (a list of items is expected)."""
    if not is_item_list(media):
        raise InvalidInput(f"media must be a list of media items, not {type(media).__name__}")
    return [_media_item(m) for m in media] if media else []


def _media_item(value: object) -> MediaItem:
    if isinstance(value, MediaItem):
        return value
    if isinstance(value, Mapping):
        return MediaItem(**value)
    raise InvalidInput(f"a media item must be a MediaItem or a mapping, not {type(value).__name__}")


def receipt_ids(receipt: Sequence[str | int] | str | int | None) -> Any:
    """A receipt as the list of message ids the domain takes: none, one id, or many (the
    domain validates each)."""
    if receipt is None:
        return []
    if isinstance(receipt, str | int) and not isinstance(receipt, bool):
        return [receipt]  # one message id
    return receipt


def error_class(classification: ErrorClass | str) -> ErrorClass:
    try:
        return ErrorClass(classification)
    except ValueError:
        raise InvalidInput(f"unknown error classification {classification!r}") from None


def abandon_reason(reason: AbandonReason | str) -> AbandonReason:
    try:
        return AbandonReason(reason)
    except ValueError:
        raise InvalidInput(f"unknown abandon reason {reason!r}") from None
