"""Structured logs: ``key=value`` or JSON lines, with the ids of the turn (ADR 0057).

Every log line of gateway-ledger names ids, states and counts, never a message body, and
the formatter adds the ids of where it was written: the turn's ``correlation_id`` and
``causation_id``, and the ``trace_id`` when a span is recording. A record may carry its
own (``extra=``): the write path logs each state change at DEBUG with the ids stored in
that event's metadata, since it runs on the writer's thread.

An embedding gateway keeps its own logging and may use :class:`ContextIds` (a filter
that adds the ids to each record, for its own format) or :class:`StructuredFormatter`;
``configure_logging`` sets both up on a handler of the ``gateway_ledger`` logger. The
console reads ``GATEWAY_LEDGER_LOG_FORMAT`` (``text``, ``kv`` or ``json``).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from typing import IO, Any

import orjson

from gateway_ledger.application.observability import causes, tracing

FORMAT_ENV = "GATEWAY_LEDGER_LOG_FORMAT"
FORMATS = ("text", "kv", "json")
IDS = ("correlation_id", "causation_id", "trace_id")
FIELDS = (
    *IDS,
    "event",
    "aggregate_id",
    "version",
    "obligation_id",
    "stage",
    "error_class",
    "store",
)
"""The record attributes a structured line carries besides time, level, logger, message."""


class ContextIds(logging.Filter):
    """Adds ``correlation_id``, ``causation_id`` and ``trace_id`` to each record (where
    the record does not carry its own): the ids of the context that logged it."""

    def filter(self, record: logging.LogRecord) -> bool:
        given = record.__dict__
        if all(name in given for name in IDS):
            return True
        cause = causes.current()
        if cause is not None:
            given.setdefault("correlation_id", cause.correlation_id)
            given.setdefault("causation_id", cause.causation_id)
        trace_id = tracing.trace_id()
        if trace_id is not None:
            given.setdefault("trace_id", trace_id)
        return True


def _kv(value: Any) -> str:
    text = str(value)
    if text and all(c.isalnum() or c in "-_.:/@+" for c in text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class StructuredFormatter(logging.Formatter):
    """One line per record: ``ts=... level=... logger=... msg=... key=value ...`` (``kv``)
    or a JSON object with the same keys (``json``)."""

    def __init__(self, style: str = "kv") -> None:
        if style not in ("kv", "json"):
            raise ValueError(f"log format {style!r}: one of kv, json")
        super().__init__()
        self.style = style

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        data: dict[str, Any] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        given: Mapping[str, Any] = record.__dict__
        for name in FIELDS:
            value = given.get(name)
            if value is not None:
                data[name] = value
        if record.exc_info and record.exc_info[0] is not None:
            data["exc"] = record.exc_info[0].__name__  # the class: a message may quote text
        return data

    def format(self, record: logging.LogRecord) -> str:
        data = self.fields(record)
        if self.style == "json":
            return orjson.dumps(data, default=str).decode()
        return " ".join(f"{k}={_kv(v)}" for k, v in data.items())


def configure_logging(
    style: str = "kv", level: int | str = logging.INFO, stream: IO[str] | None = None
) -> logging.Handler:
    """Log gateway-ledger's records to ``stream`` (stderr) in ``style`` (text, kv, json)."""
    if style not in FORMATS:
        raise ValueError(f"log format {style!r}: one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(ContextIds())
    if style == "text":
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    else:
        handler.setFormatter(StructuredFormatter(style))
    logger = logging.getLogger("gateway_ledger")
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler
