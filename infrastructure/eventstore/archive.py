"""Archive of pruned obligations and sessions: gzip'd JSON lines, a stream a line (ADR 0053).

A file is one or more gzip members (each prune appends one; ``gzip`` reads them as one
stream). Its first line of each member is a header::

    {"archive": "gateway-ledger", "format": 1, "release": "0.3.0", "written_at": ISO}

then one line per obligation::

    {"aggregate_id": UUID, "obligation_id": ID, "state": S, "tombstone": {...},
     "events": [{"v": 1, "topic": T, "state": BASE64}, ...]}

A pruned session's line (ADR 0053, ``prune --sessions``) is marked ``"kind": "session"``
and holds ``session_id`` in place of ``obligation_id``; readers of obligations pass over
it, ``archived_sessions`` reads only those.

``state`` is the stored event as it was in the store: its personal fields still sealed
under the session's data key, so an archive is no more readable than the store, and
forgetting a session (destroying its key) reaches the archive too. A reader decodes
them through the ledger's own mapper (``history --archive``) or reads their clear facts
(``audit duplicates --archive``). The file is written owner-only and fsynced before a
single event is deleted from the store; a stream found twice (a prune interrupted after
its archive was written) is the same stream, and readers keep its last copy.
"""

from __future__ import annotations

import base64
import gzip
import os
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import attrs
import orjson

from gateway_ledger.domain.delivery.retention import Tombstone
from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.domain.sessions.retention import ENDED, SessionTombstone

ARCHIVE_FORMAT = 1
MAGIC = "gateway-ledger"
SESSION_KIND = "session"


@attrs.frozen
class ArchivedStream:
    aggregate_id: UUID
    obligation_id: str
    state: str
    events: tuple[tuple[int, str, bytes], ...]


def write_archive(
    path: str | Path,
    streams: Sequence[tuple[Tombstone, Sequence[tuple[int, str, bytes]]]],
    *,
    release: str,
) -> None:
    """Append one gzip member holding ``streams`` to ``path`` (created 0600), durably."""
    _append_member(
        path,
        [
            {
                "aggregate_id": stone.aggregate_id,
                "obligation_id": stone.obligation_id,
                "state": stone.state,
                "tombstone": attrs.asdict(stone),
                "events": _events(events),
            }
            for stone, events in streams
        ],
        release=release,
    )


def write_session_archive(
    path: str | Path,
    streams: Sequence[tuple[SessionTombstone, Sequence[tuple[int, str, bytes]]]],
    *,
    release: str,
) -> None:
    """Append one gzip member holding pruned sessions' ``streams`` (``"kind": "session"``
    lines; readers of obligations pass over them) to ``path``, durably."""
    _append_member(
        path,
        [
            {
                "kind": SESSION_KIND,
                "aggregate_id": stone.aggregate_id,
                "session_id": stone.session_id,
                "state": ENDED,
                "tombstone": attrs.asdict(stone),
                "events": _events(events),
            }
            for stone, events in streams
        ],
        release=release,
    )


def _events(events: Sequence[tuple[int, str, bytes]]) -> list[dict[str, Any]]:
    return [
        {"v": v, "topic": topic, "state": base64.b64encode(state).decode()}
        for v, topic, state in events
    ]


def _append_member(path: str | Path, lines: Sequence[dict[str, Any]], *, release: str) -> None:
    target = Path(path)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as raw:
        with gzip.GzipFile(fileobj=raw, mode="ab") as out:
            header = {
                "archive": MAGIC,
                "format": ARCHIVE_FORMAT,
                "release": release,
                "written_at": datetime.now(UTC).isoformat(),
            }
            out.write(orjson.dumps(header) + b"\n")
            for line in lines:
                out.write(orjson.dumps(line, default=str) + b"\n")
        raw.flush()
        os.fsync(raw.fileno())


def read_archive(path: str | Path, *, sessions: bool = False) -> Iterator[ArchivedStream]:
    """Every obligation stream of the archive (``sessions``: every session stream instead),
    in the order written (a repeated stream twice)."""
    source = Path(path)
    if not source.is_file():
        raise InvalidInput(f"no archive at {source}")
    try:
        with gzip.open(source, "rb") as f:
            for number, raw in enumerate(f, start=1):
                line: dict[str, Any] = orjson.loads(raw)
                if "archive" in line:
                    if line["archive"] != MAGIC or int(line["format"]) > ARCHIVE_FORMAT:
                        raise InvalidInput(
                            f"{source} line {number}: archive format {line.get('format')} "
                            f"of {line.get('release')} is newer than this release reads"
                        )
                    continue
                if line.get("kind") == SESSION_KIND:
                    if sessions:
                        yield _session_stream(line)
                    continue
                if sessions:
                    continue
                yield ArchivedStream(
                    aggregate_id=UUID(line["aggregate_id"]),
                    obligation_id=str(line["obligation_id"]),
                    state=str(line["state"]),
                    events=tuple(
                        (int(e["v"]), str(e["topic"]), base64.b64decode(e["state"]))
                        for e in line["events"]
                    ),
                )
    except (OSError, EOFError, orjson.JSONDecodeError, KeyError) as e:
        raise InvalidInput(f"{source} is not a readable gateway-ledger archive: {e}") from None


def archived_streams(path: str | Path) -> dict[UUID, ArchivedStream]:
    """The archive's streams by aggregate, the last copy of each."""
    return {s.aggregate_id: s for s in read_archive(path)}


def _session_stream(line: dict[str, Any]) -> ArchivedStream:
    """A pruned session's line; its ``obligation_id`` field holds the session id."""
    return ArchivedStream(
        aggregate_id=UUID(line["aggregate_id"]),
        obligation_id=str(line["session_id"]),
        state=str(line["state"]),
        events=tuple(
            (int(e["v"]), str(e["topic"]), base64.b64decode(e["state"])) for e in line["events"]
        ),
    )


def archived_sessions(path: str | Path) -> dict[UUID, ArchivedStream]:
    """The archive's pruned sessions by aggregate, the last copy of each."""
    return {s.aggregate_id: s for s in read_archive(path, sessions=True)}
