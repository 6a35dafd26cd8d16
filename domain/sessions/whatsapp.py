"""WhatsApp identities: one person, one identifier, whichever form the bridge hands over.

The same person reaches the gateway as ``15551234567@s.whatsapp.net``, ``+15551234567``,
``15551234567:12@s.whatsapp.net`` (a device) and a LID ``267383306489914@lid``. Upstream
(``gateway/whatsapp_identity.py``) normalises each form and, through the bridge's
``lid-mapping-*.json`` files, maps LID and phone forms to the shortest (then smallest)
member of their alias set. These are the same rules, pure: the mapping files are read by
``infrastructure/sessions/whatsapp_aliases.py`` and arrive here as ``AliasLookup``.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable

WHATSAPP_PLATFORM = "whatsapp"

AliasLookup = Callable[[str], Iterable[str]]
"""The ids one normalised id is directly mapped to (the bridge's forward and reverse
mapping files for it); an id without a mapping gives nothing."""

_SAFE_ID = re.compile(r"^[A-Za-z0-9@.+\-]+$")


def normalize_whatsapp_identifier(value: object) -> str:
    """Upstream's ``normalize_whatsapp_identifier``: stripped, the first ``+`` removed, then
    everything from the first ``:`` (device) and from the first ``@`` (server) dropped."""
    text = str(value or "").strip().replace("+", "", 1)
    return text.split(":", 1)[0].split("@", 1)[0]


def is_safe_whatsapp_id(value: str) -> bool:
    """Ids that may name a mapping file (``^[A-Za-z0-9@.+\\-]+$``)."""
    return bool(_SAFE_ID.match(value))


def expand_whatsapp_aliases(value: object, lookup: AliasLookup | None = None) -> set[str]:
    """Every id ``value`` is known by: breadth-first over the mapping, always including the
    normalised input; empty input gives an empty set."""
    start = normalize_whatsapp_identifier(value)
    if not start:
        return set()
    found = {start}
    if lookup is None:
        return found
    queue = deque([start])
    while queue:  # ends: each id is queued once
        current = queue.popleft()
        if not is_safe_whatsapp_id(current):
            continue
        for alias in lookup(current):
            normalised = normalize_whatsapp_identifier(alias)
            if normalised and normalised not in found and is_safe_whatsapp_id(normalised):
                found.add(normalised)
                queue.append(normalised)
    return found


def canonical_whatsapp_identifier(value: object, lookup: AliasLookup | None = None) -> str:
    """The shortest, then lexicographically smallest, member of the alias set (upstream's
    ``canonical_whatsapp_identifier``); ``""`` for empty input."""
    aliases = expand_whatsapp_aliases(value, lookup)
    return min(aliases, key=lambda a: (len(a), a)) if aliases else ""
