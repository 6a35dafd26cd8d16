"""Every OpenTelemetry span of gateway-ledger is opened here (ADR 0058).

Only the OpenTelemetry *API* is used, and only if it is installed (the extra
``gateway-ledger[otel]``); spans go to the global tracer provider, so they appear as
soon as the application sets one, with no flag. Until then (or without the package)
``span`` costs a function call and opens nothing.

A span continues the caller's trace: it is a child of whatever span is current where
``deliver``, a sweep or an operator command is called.

Attributes are ids and facts only, by name (``ATTRIBUTES``): never reply text, never a
chat, thread or session id in clear. Anything else passed is dropped.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import Any

try:  # the optional extra
    from opentelemetry import trace as _otel
except ImportError:  # pragma: no cover - exercised where the extra is not installed
    _otel = None  # type: ignore[assignment]

TRACER_NAME = "gateway_ledger"
PREFIX = "gateway_ledger."

ATTRIBUTES = frozenset(
    {
        "obligation_id",
        "platform",
        "state",
        "status",
        "error_class",
        "attempt",
        "fence",
        "part",
        "run_id",
        "claimed",
        "abandoned",
        "correlation_id",
        "recovery_attempt",
        "subject_id",
        "command",
        "stage",
    }
)
"""The only attribute names a span may carry (prefixed ``gateway_ledger.``)."""

_cached: tuple[Any, Any] | None = None


def _tracer() -> Any:
    """The tracer of the global provider; None while the application has set none."""
    global _cached
    if _otel is None:
        return None
    provider = _otel.get_tracer_provider()
    cached = _cached
    if cached is not None and cached[0] is provider:
        return cached[1]
    if isinstance(provider, _otel.ProxyTracerProvider | _otel.NoOpTracerProvider):
        return None
    tracer = provider.get_tracer(TRACER_NAME)
    _cached = (provider, tracer)
    return tracer


def _value(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _attributes(attributes: dict[str, Any], obligation: Any = None) -> dict[str, Any]:
    if obligation is not None:
        attributes = {**span_facts(obligation), **attributes}
    return {
        PREFIX + k: _value(v) for k, v in attributes.items() if v is not None and k in ATTRIBUTES
    }


_NO_SPAN: contextlib.nullcontext[None] = contextlib.nullcontext(None)
"""What ``span`` returns within an untraced span: nothing opened, nothing made."""

_UNTRACED: ContextVar[bool] = ContextVar("gateway_ledger_untraced", default=False)
"""Set within a span that found no tracer provider: the spans and trace ids asked for
inside it (the rest of a reply's path, in its task) do not ask the provider again. Asking
costs a look-up in ``os.environ`` while none is set, and a reply asked six times."""


class _Untraced:
    """What ``span`` returns while no tracer provider is set: opens nothing, yields None,
    and marks what runs within as untraced (one decision per reply, not per span)."""

    __slots__ = ("token",)

    def __enter__(self) -> None:
        self.token = _UNTRACED.set(True)

    def __exit__(self, *exc: object) -> None:
        _UNTRACED.reset(self.token)


def _current_tracer() -> Any:
    """The tracer, unless an enclosing span already found none."""
    if _UNTRACED.get():
        return None
    return _tracer()


def span(name: str, obligation: Any = None, **attributes: Any) -> AbstractContextManager[Any]:
    """Open the span ``gateway_ledger.<name>`` as the current one, a child of the
    caller's; yields it (None when no tracer provider is set). ``obligation``: an
    aggregate whose facts (``span_facts``) it carries, read only when a span is opened.
    An exception leaving it is recorded on it, with its class (never its message: it
    may quote content). A provider set while an untraced span is open is used from the
    next span opened outside it."""
    if _UNTRACED.get():
        return _NO_SPAN
    tracer = _tracer()
    if tracer is None:
        return _Untraced()
    return _opened(tracer, name, _attributes(attributes, obligation))


@contextlib.contextmanager
def _opened(tracer: Any, name: str, attributes: dict[str, Any]) -> Iterator[Any]:
    with tracer.start_as_current_span(
        PREFIX + name,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as opened:
        try:
            yield opened
        except BaseException as e:
            opened.set_attribute(PREFIX + "error_class", type(e).__name__)
            opened.set_status(_otel.Status(_otel.StatusCode.ERROR, type(e).__name__))
            raise


def annotate(opened: Any, **attributes: Any) -> None:
    """Add attributes to a span ``span`` yielded (nothing when it yielded None)."""
    if opened is not None:
        opened.set_attributes(_attributes(attributes))


def trace_id() -> str | None:
    """The id of the trace recording now (32 hex), or None."""
    if _otel is None or _UNTRACED.get():
        return None  # within a span that found no provider: nothing records a trace here
    # The current span first (a context variable): with none, no provider is asked.
    context = _otel.get_current_span().get_span_context()
    if not context.is_valid or _current_tracer() is None:
        return None
    return format(context.trace_id, "032x")


def mark(name: str, obligation: Any = None, **attributes: Any) -> None:
    """A span that opens and ends at once: a step already done, such as a claim committed
    in a batch, or a result handed to the writer behind the send."""
    if _current_tracer() is not None:
        with span(name, obligation, **attributes):
            pass


def span_facts(obligation: Any) -> dict[str, Any]:
    """The attributes every span about one obligation carries: its id, platform, state,
    send attempt and fence (never its text or target)."""
    return {
        "obligation_id": obligation.obligation_id,
        "platform": obligation.platform,
        "state": obligation.state,
        "attempt": obligation.send_attempts,
        "fence": obligation.fence,
    }
