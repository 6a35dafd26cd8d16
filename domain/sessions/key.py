"""Session keys: which conversation a message belongs to, as one stable string.

The layout is upstream's (``agent:main:<platform>:<chat_type>:<chat_id>[:<thread>][:<user>]``),
byte-identical when no component contains ``:`` or ``%``. Upstream joined raw components with
``:``, so chat ``a:b`` + thread ``c`` collided with chat ``a`` + thread ``b:c`` (reference §2
item 13); here every component is escaped (``%`` -> ``%25``, ``:`` -> ``%3A``) first.

With a ``hasher`` (the SessionStore passes its keyed one) no raw platform id appears in the
key: chat ids become ``<hash>``, thread ids ``t<hash>`` and users ``user_<hash>``. The prefixes
cannot occur in hex, so a hashed key also tells a thread slot from a user slot, which the raw
layout (with its optional slots) cannot.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.domain.sessions.source import SessionSource
from gateway_ledger.domain.sessions.whatsapp import (
    WHATSAPP_PLATFORM,
    AliasLookup,
    canonical_whatsapp_identifier,
)

Hasher = Callable[[str], str]

DEFAULT_NAMESPACE = "agent:main"


def is_path_unsafe(value: object) -> bool:
    """True if ``value`` could traverse outside a directory when used as a file name.

    Strict (upstream ``_is_path_unsafe``): ``..``, any ``/`` or ``\\``, or a leading drive
    letter (``C:``). Empty values are safe.
    """
    if not value:
        return False
    s = str(value)
    if ".." in s or "/" in s or "\\" in s:
        return True
    return len(s) >= 2 and s[0].isalpha() and s[1] == ":"


def is_session_key_unsafe(value: object) -> bool:
    """True if a *logical* session key could be a traversal vector.

    Relaxed (upstream ``_is_session_key_unsafe``): only ``..``, a leading ``/`` or ``\\``, or a
    leading drive letter. Interior ``/`` is legal, so Google Chat keys
    (``spaces/<id>/threads/<id>``) survive (reference §2 item 14). Empty values are safe.
    """
    if not value:
        return False
    s = str(value)
    if ".." in s:
        return True
    if s.startswith("/") or s.startswith("\\"):
        return True
    return len(s) >= 2 and s[0].isalpha() and s[1] == ":"


def escape_component(value: str) -> str:
    """Make a component free of ``:`` so the key splits back into exactly its components."""
    return value.replace("%", "%25").replace(":", "%3A")


def session_key_namespace(profile: str | None) -> str:
    """``agent:main`` for the default profile, else ``agent:<profile>``.

    A profile literally named ``main`` is marked ``main~`` (as upstream does) so it can never
    share the default profile's sessions.
    """
    if not profile or profile == "default":
        return DEFAULT_NAMESPACE
    if profile == "main":
        return "agent:main~"
    return f"agent:{escape_component(profile)}"


def is_shared_multi_user_session(
    source: SessionSource,
    *,
    group_sessions_per_user: bool = True,
    thread_sessions_per_user: bool = False,
) -> bool:
    """Do several people share this session (upstream's rule)? A DM never; in a thread
    unless threads are per user; otherwise unless groups are per user."""
    if source.chat_type == "dm":
        return False
    if source.thread_id:
        return not thread_sessions_per_user
    return not group_sessions_per_user


def build_session_key(
    source: SessionSource,
    *,
    group_sessions_per_user: bool = True,
    thread_sessions_per_user: bool = False,
    profile: str | None = None,
    hasher: Hasher | None = None,
    whatsapp_aliases: AliasLookup | None = None,
) -> str:
    """The deterministic key of the conversation ``source`` belongs to (upstream rules).

    DM: ``<ns>:<platform>:dm:<chat_id>[:<thread_id>]``; without a chat id the sender id takes
    its place, then the thread id, then nothing. Group/channel/thread:
    ``<ns>:<platform>:<chat_type>[:<chat_id>][:<thread_id>][:<user>]``; the user is added when
    ``group_sessions_per_user`` and not in a thread (threads are shared unless
    ``thread_sessions_per_user``). ``profile`` defaults to ``source.profile``.

    On WhatsApp the DM chat id and the participant id are canonical
    (``canonical_whatsapp_identifier`` over ``whatsapp_aliases``), so every form of one
    person gives one key; a group chat id (``...@g.us``) is kept as it is. Any non-empty chat
    type other than ``dm`` (``forum``, ``webhook``, ...) is keyed like a group.

    Raises InvalidInput if the key could traverse (``is_session_key_unsafe``).
    """
    if not isinstance(source, SessionSource):
        raise InvalidInput("source must be a SessionSource")

    def chat(value: str) -> str:
        return escape_component(hasher(value) if hasher else value)

    def thread(value: str) -> str:
        return escape_component(f"t{hasher(value)}" if hasher else value)

    def user(value: str) -> str:
        return escape_component(f"user_{hasher(value)}" if hasher else value)

    whatsapp = source.platform == WHATSAPP_PLATFORM

    def person(value: str | None) -> str | None:
        if not value or not whatsapp:
            return value
        return canonical_whatsapp_identifier(value, whatsapp_aliases) or value

    ns = session_key_namespace(profile if profile is not None else source.profile)
    parts = [ns, escape_component(source.platform), escape_component(source.chat_type)]
    participant = person(source.user_id_alt or source.user_id)
    if source.chat_type == "dm":
        dm_chat = (
            canonical_whatsapp_identifier(source.chat_id, whatsapp_aliases)
            if whatsapp
            else source.chat_id
        )
        if dm_chat:
            parts.append(chat(dm_chat))
        elif participant:
            parts.append(user(participant))
        if source.thread_id:
            parts.append(thread(source.thread_id))
    else:
        if source.chat_id:
            parts.append(chat(source.chat_id))
        if source.thread_id:
            parts.append(thread(source.thread_id))
        isolate_user = not is_shared_multi_user_session(
            source,
            group_sessions_per_user=group_sessions_per_user,
            thread_sessions_per_user=thread_sessions_per_user,
        )
        if isolate_user and participant:
            parts.append(user(participant))
    key = ":".join(parts)
    if is_session_key_unsafe(key):
        raise InvalidInput(
            f"refused session key for {source.platform}/{source.chat_type}: an id contains a "
            "path traversal ('..', a leading separator or a drive letter); such a key would "
            "be dropped at every restart"
        )
    return key
