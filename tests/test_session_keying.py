"""How a store makes its keys (application/sessions/keying.py), on its own: no store.

The keying mode is recorded in every store and compared at open, and inbound ids are
looked up by their hashes, so each mode's spelling and hashing are pinned here.
"""

from __future__ import annotations

import pytest

from gateway_ledger.application.sessions.keying import (
    INBOUND_IDS_PURPOSE,
    RAW_KEYS_MODE,
    SessionKeys,
    is_raw_keys_mode,
)
from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.domain.privacy.hashing import KeyedHasher, keyed_hash_id
from gateway_ledger.domain.sessions.key import build_session_key
from gateway_ledger.domain.sessions.source import SessionSource

SECRET = b"s" * 32
DERIVED = b"d" * 32
GROUP = SessionSource(platform="slack", chat_id="C1", chat_type="group", user_id="U1")


class Secrets:
    """The derived-secret port, counting what it is asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, purpose: str) -> bytes:
        self.asked.append(purpose)
        return DERIVED


def keys(hasher: object = None, *, group: bool = True, thread: bool = False) -> SessionKeys:
    return SessionKeys(
        hasher,  # type: ignore[arg-type]
        group_sessions_per_user=group,
        thread_sessions_per_user=thread,
        derived_secret=Secrets(),
    )


def test_the_mode_names_raw_keys_or_the_secrets_fingerprint() -> None:
    hasher = KeyedHasher(SECRET)
    assert keys().mode == RAW_KEYS_MODE == "raw"
    assert keys(hasher).mode == f"keyed:{hasher.fingerprint}"
    assert keys(lambda value: value[::-1]).mode == "keyed:custom"
    assert is_raw_keys_mode("raw") and not is_raw_keys_mode(keys(hasher).mode)


def test_keys_follow_the_sessions_per_user_settings_and_hash_ids() -> None:
    hasher = KeyedHasher(SECRET)
    for group in (True, False):
        assert keys(group=group).key_of(GROUP) == build_session_key(
            GROUP, group_sessions_per_user=group
        )
    assert keys(hasher).key_of(GROUP) == build_session_key(GROUP, hasher=hasher)
    assert "C1" not in keys(hasher).key_of(GROUP).split(":")
    thread = SessionSource(
        platform="slack", chat_id="C1", chat_type="thread", thread_id="T", user_id="U1"
    )
    assert keys(thread=True).key_of(thread) == build_session_key(
        thread, thread_sessions_per_user=True
    )
    assert keys(thread=True).key_of(thread) != keys().key_of(thread)


def test_keyed_inbound_ids_use_the_session_secret_and_never_the_derived_one() -> None:
    store_keys = keys(KeyedHasher(SECRET))
    assert store_keys.inbound_ids("99", "101") == (
        keyed_hash_id(SECRET, "99"),
        keyed_hash_id(SECRET, "101"),
    )
    assert isinstance(store_keys.derived_secret, Secrets)
    assert store_keys.derived_secret.asked == []


def test_raw_keys_inbound_ids_use_a_derived_secret_asked_once() -> None:
    store_keys = keys()
    first = store_keys.inbound_ids("99", "101")
    assert first == (keyed_hash_id(DERIVED, "99"), keyed_hash_id(DERIVED, "101"))
    assert store_keys.inbound_ids("99", "102")[0] == first[0]
    assert isinstance(store_keys.derived_secret, Secrets)
    assert store_keys.derived_secret.asked == [INBOUND_IDS_PURPOSE]
    assert INBOUND_IDS_PURPOSE == "gateway-ledger/inbound-ids/v1"  # stored marks use it


def test_a_store_made_another_way_is_refused_by_name() -> None:
    keyed = keys(KeyedHasher(SECRET))
    keyed.check_recorded(keyed.mode)  # the same way: accepted
    keys().check_recorded("raw")
    with pytest.raises(InvalidInput, match=r"created with raw upstream keys \(raw\); opening it"):
        keyed.check_recorded("raw")
    with pytest.raises(InvalidInput, match=r"keyed hashes \(keyed, another secret\).* as raw"):
        keys().check_recorded(keyed.mode)
    other = keys(KeyedHasher(b"o" * 32)).mode
    with pytest.raises(InvalidInput, match=r"another secret.*orphan every conversation"):
        keyed.check_recorded(other)
