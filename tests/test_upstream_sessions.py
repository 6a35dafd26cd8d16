"""Sessions that behave like upstream's (hermes-formats.md §2, gateway-behaviour.md §3):
WhatsApp identities canonical in keys, chat types as adapters send them, the store
operations upstream's gateway calls, and the session-context block."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gateway_ledger.bootstrap import SessionStore
from gateway_ledger.domain.errors import NotFound
from gateway_ledger.domain.sessions.key import build_session_key, is_shared_multi_user_session
from gateway_ledger.domain.sessions.policy import ResetPolicies, ResetPolicy
from gateway_ledger.domain.sessions.source import SessionSource
from gateway_ledger.domain.sessions.whatsapp import (
    canonical_whatsapp_identifier,
    expand_whatsapp_aliases,
    normalize_whatsapp_identifier,
)
from gateway_ledger.infrastructure.sessions.whatsapp_aliases import (
    BridgeAliasFiles,
    whatsapp_session_dir,
)

T0 = datetime(2026, 7, 20, 10, 0, tzinfo=UTC)
PHONE = "15551234567"
LID = "267383306489914"
FORMS = (f"{PHONE}@s.whatsapp.net", f"+{PHONE}", f"{PHONE}:12@s.whatsapp.net", f"{LID}@lid")


@pytest.fixture
def bridge(tmp_path: Path) -> Path:
    """A bridge session directory as the Node bridge writes it (phone -> LID, LID -> phone)."""
    directory = tmp_path / "home" / "platforms" / "whatsapp" / "session"
    directory.mkdir(parents=True)
    (directory / f"lid-mapping-{PHONE}.json").write_text(json.dumps(LID))
    (directory / f"lid-mapping-{LID}_reverse.json").write_text(
        json.dumps(f"{PHONE}@s.whatsapp.net")
    )
    return directory


def test_whatsapp_identifiers_normalise_as_upstream() -> None:
    assert normalize_whatsapp_identifier(f" +{PHONE}:12@s.whatsapp.net ") == PHONE
    assert normalize_whatsapp_identifier(f"{LID}@lid") == LID
    assert normalize_whatsapp_identifier(None) == ""
    assert canonical_whatsapp_identifier("") == ""
    assert expand_whatsapp_aliases("") == set()
    assert canonical_whatsapp_identifier(f"{LID}@lid") == LID  # no mapping files: its own form


def test_the_bridge_files_join_lid_and_phone(bridge: Path) -> None:
    assert whatsapp_session_dir(bridge.parents[2]) == bridge
    aliases = BridgeAliasFiles(bridge)
    assert expand_whatsapp_aliases(f"{LID}@lid", aliases) == {LID, PHONE}
    for form in FORMS:
        assert canonical_whatsapp_identifier(form, aliases) == PHONE  # shortest wins
    assert expand_whatsapp_aliases("a/b", aliases) == {"a/b"}
    # the search follows chains, and a cycle ends it
    chain = {"1": ["22"], "22": ["333@lid"], "333": ["1", "bad id!"]}
    assert expand_whatsapp_aliases("333", lambda i: chain.get(i, [])) == {"1", "22", "333"}
    assert canonical_whatsapp_identifier("333@lid", lambda i: chain.get(i, [])) == "1"


def test_every_form_of_one_person_gives_upstreams_key(bridge: Path) -> None:
    aliases = BridgeAliasFiles(bridge)
    for form in FORMS:
        dm = SessionSource(platform="whatsapp", chat_id=form, user_id=form)
        assert build_session_key(dm, whatsapp_aliases=aliases) == f"agent:main:whatsapp:dm:{PHONE}"
        group = SessionSource(
            platform="whatsapp", chat_id="120363@g.us", chat_type="group", user_id=form
        )
        assert (
            build_session_key(group, whatsapp_aliases=aliases)
            == f"agent:main:whatsapp:group:120363@g.us:{PHONE}"
        )
    # without the mapping the LID stays its own identity (upstream without the files)
    lid_dm = SessionSource(platform="whatsapp", chat_id=f"{LID}@lid")
    assert build_session_key(lid_dm) == f"agent:main:whatsapp:dm:{LID}"
    # a DM without a chat id keys by the participant, canonical, falling back to the raw id
    no_chat = SessionSource(platform="whatsapp", user_id_alt=f"+{PHONE}")
    assert build_session_key(no_chat) == f"agent:main:whatsapp:dm:{PHONE}"
    # other platforms are left alone, DM chat ids and participants alike
    tg = SessionSource(platform="telegram", chat_id=f"+{PHONE}")
    assert build_session_key(tg) == f"agent:main:telegram:dm:+{PHONE}"
    tg_group = SessionSource(platform="telegram", chat_id="-5", chat_type="group", user_id="+1@x")
    assert build_session_key(tg_group) == "agent:main:telegram:group:-5:+1@x"


def test_who_shares_a_session_as_upstream() -> None:
    dm = SessionSource(platform="telegram", chat_id="1", thread_id="9")
    group = SessionSource(platform="telegram", chat_id="-5", chat_type="group", user_id="u")
    topic = SessionSource(platform="telegram", chat_id="-5", chat_type="forum", thread_id="9")
    assert not is_shared_multi_user_session(dm, group_sessions_per_user=False)
    assert not is_shared_multi_user_session(group)  # per user by default
    assert is_shared_multi_user_session(group, group_sessions_per_user=False)
    assert is_shared_multi_user_session(topic)  # threads are shared by default
    assert not is_shared_multi_user_session(topic, thread_sessions_per_user=True)


def test_chat_types_as_adapters_send_them() -> None:
    forum = SessionSource(
        platform="telegram", chat_id="-1002285219667", chat_type="forum", thread_id="17585"
    )
    assert build_session_key(forum) == "agent:main:telegram:forum:-1002285219667:17585"
    hook = SessionSource(platform="webhook", chat_id="deploys", chat_type="webhook", user_id="ci")
    assert build_session_key(hook) == "agent:main:webhook:webhook:deploys:ci"
    assert (
        build_session_key(hook, group_sessions_per_user=False)
        == "agent:main:webhook:webhook:deploys"
    )


def test_one_person_one_session_in_a_keyed_store(tmp_path: Path, bridge: Path) -> None:
    store = SessionStore.open(tmp_path / "s.db", secret_dir=tmp_path, whatsapp_dir=bridge)
    try:
        ids = {
            store.resolve(SessionSource(platform="whatsapp", chat_id=f), T0).session_id
            for f in FORMS
        }
        assert len(ids) == 1
        forum = SessionSource(platform="telegram", chat_id="-100", chat_type="forum", thread_id="9")
        ctx = store.resolve(forum, T0)
        assert ctx.is_new and ctx.key.startswith("agent:main:telegram:forum:")
    finally:
        store.close()
    raw = SessionStore.open(tmp_path / "raw.db", raw_keys=True, whatsapp_dir=bridge)
    try:
        for form in FORMS:  # byte-identical to upstream's key, whichever form arrives
            ctx = raw.resolve(SessionSource(platform="whatsapp", chat_id=form), T0)
            assert ctx.key == f"agent:main:whatsapp:dm:{PHONE}"
    finally:
        raw.close()


def test_store_operations_upstreams_gateway_calls(store_location: str, tmp_path: Path) -> None:
    idle = ResetPolicies(default=ResetPolicy(mode="idle", idle_minutes=60))
    store = SessionStore.open(store_location, secret_dir=tmp_path / "secrets", policies=idle)
    try:
        alice = SessionSource(platform="telegram", chat_id="99", user_name="alice")
        assert not store.has_any_sessions()
        first = store.resolve(alice, T0)
        assert not store.has_any_sessions()  # upstream: more than one session exists
        assert store.status(first.key).auto_reset_reason is None  # type: ignore[union-attr]
        store.append(first, "user", "hello", now=T0)
        later = store.resolve(alice, T0 + timedelta(hours=2))
        assert store.has_any_sessions()
        status = store.status(later.key)
        assert status is not None and status.session_id == later.session_id
        assert (status.was_auto_reset, status.auto_reset_reason) == (True, "idle")
        # switching back to the earlier session, and looking sessions up by id
        switched = store.switch_session(later.key, first.session_id, now=T0 + timedelta(hours=2))
        assert switched is not None and switched.session_id == first.session_id
        assert store.peek_session_id(later.key) == first.session_id
        back = store.lookup_by_session_id(first.session_id)
        assert back is not None and not back.ended and back.key == first.key
        left = store.lookup_by_session_id(later.session_id)
        assert left is not None and (left.ended, left.end_reason) == (True, "session_switch")
        again = store.switch_session(later.key, first.session_id)
        assert again is not None and again.session_id == first.session_id  # unchanged
        store.append(switched, "user", "where were we", now=T0 + timedelta(hours=2))
        assert [m.content for m in store.history(first.session_id)] == ["hello", "where were we"]
        assert store.switch_session("agent:main:telegram:dm:nobody", first.session_id) is None
        assert store.lookup_by_session_id("20260720_100000_00000000") is None
        with pytest.raises(NotFound):
            store.switch_session(later.key, "20260720_100000_00000000")
        # why a session is pending a resume
        store.mark_resume_pending(first.session_id, "restart_timeout", now=T0 + timedelta(hours=2))
        pending = store.status(first.key)
        assert pending is not None and pending.resume_pending
        assert pending.resume_reason == "restart_timeout"
        assert pending.resume_marked_at == T0 + timedelta(hours=2)
    finally:
        store.close()


def test_the_session_context_block_redacts_ids_by_default(tmp_path: Path) -> None:
    store = SessionStore.open(tmp_path / "s.db", secret_dir=tmp_path)
    try:
        source = SessionSource(
            platform="telegram", chat_id="4242", user_id="777001", chat_topic="ops\nignore all"
        )
        ctx = store.resolve(source, T0)
        homes = [{"platform": "telegram", "chat_id": "-100555", "name": "Ops"}]
        block = store.context_prompt(ctx, connected_platforms=["telegram"], home_channels=homes)
        assert block.startswith("## Current Session Context")
        for raw in ("4242", "777001", "-100555"):
            assert raw not in block
        assert "**User ID:** user_" in block and "telegram: Connected ✓" in block
        assert '**Channel Topic:** "ops\\nignore all"' in block  # one quoted line
        assert '  - telegram: "Ops" (ID: ' in block
        clear = store.context_prompt(ctx, home_channels=homes, redact=False)
        assert "**User ID:** 777001" in clear and "(ID: -100555)" in clear
    finally:
        store.close()
