"""Observability in the ecosystem's own terms (issue 20, ADRs 0057 and 0058): the
Prometheus collector in a fresh registry, the span tree of a delivery and of a recovery
under the OpenTelemetry SDK, and the causes every event records, through the console."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest

import gateway_ledger
from gateway_ledger.application.delivery.metrics import GATEWAY_METRIC_NAMES, METRIC_NAMES
from gateway_ledger.application.delivery.ports import Reply, ReplyContext, SendResult
from gateway_ledger.application.delivery.reconciliation import ReconcileAnswer, ReconcileQuery
from gateway_ledger.application.delivery.scheduling import ManualScheduler
from gateway_ledger.bootstrap import Gateway, SessionStore
from gateway_ledger.domain.delivery.obligation import compute_obligation_id
from gateway_ledger.domain.sessions.source import SessionSource
from gateway_ledger.domain.values import ErrorClass
from tests.gateway_fakes import ScriptedAdapter, dead_owner

CHAT = "4455667788"
KEY = f"agent:main:telegram:dm:{CHAT}"
CTX = ReplyContext(session_key=KEY, platform="telegram", chat_id=CHAT, thread_id=None)
TEXT = "the secret answer is forty-two"
SCRIPT = str(Path(sys.executable).parent / "gateway-ledger")

EXPORTER = InMemorySpanExporter()
_PROVIDER = TracerProvider()
_PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))


@pytest.fixture
def spans() -> InMemorySpanExporter:
    """The global provider, set once for the process (OpenTelemetry allows one)."""
    if trace.get_tracer_provider() is not _PROVIDER:
        trace.set_tracer_provider(_PROVIDER)
    EXPORTER.clear()
    return EXPORTER


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
    }


def test_the_collector_in_a_fresh_registry_after_a_scripted_run(store_location: str) -> None:
    async def main() -> None:
        scheduler = ManualScheduler()
        adapter = ScriptedAdapter(
            script=[
                SendResult.ok("m1"),
                SendResult.failed(ErrorClass.REJECTED, "503"),
                SendResult.ok("m3"),
                SendResult.failed(ErrorClass.DEAD_TARGET, "blocked"),
            ]
        )
        async with Gateway.open(store_location, scheduler=scheduler) as gw:
            await gw.start([adapter])
            registry = CollectorRegistry(auto_describe=True)
            registry.register(gateway_ledger.LedgerCollector(gw.ledger, gateway=gw))
            await gw.deliver(CTX, Reply("one"), "in-1")
            await gw.deliver(CTX, Reply("two"), "in-2")  # fails, a retry is scheduled
            await scheduler.advance(3600)  # the retry delivers it
            await gw.deliver(CTX, Reply("three"), "in-3")  # dead target: abandoned
            await gw.flush()
            got = samples(registry)
            text = generate_latest(registry).decode()
            stats = gw.stats()
            await_faults = stats.ledger_faults
        for name in METRIC_NAMES + GATEWAY_METRIC_NAMES:
            assert f"# TYPE {name.removesuffix('_total')}" in text, name
        state = (("platform", "telegram"), ("state", "delivered"))
        assert got[("gateway_ledger_obligations", state)] == 2
        abandoned = (("platform", "telegram"), ("state", "abandoned"))
        assert got[("gateway_ledger_obligations", abandoned)] == 1
        assert got[("gateway_ledger_abandoned_total", (("reason", "dead_target"),))] == 1
        assert got[("gateway_ledger_unresolved_obligations", ())] == 0
        assert got[("gateway_ledger_record_to_delivery_seconds_count", ())] == 2
        assert got[("gateway_ledger_delivery_latency_seconds_count", ())] == 2
        assert got[("gateway_ledger_delivery_latency_seconds_bucket", (("le", "+Inf"),))] == 2
        assert got[("gateway_ledger_sweep_duration_seconds_count", ())] == 1  # the boot sweep
        backoff = (("reason", "backoff"),)
        assert got[("gateway_ledger_retry_wait_seconds_count", backoff)] == 1
        assert got[("gateway_ledger_retry_wait_seconds_count", (("reason", "rate_limit"),))] == 0
        assert got[("gateway_ledger_ledger_faults_total", ())] == await_faults == 0
        assert got[("gateway_ledger_untracked_replies_total", ())] == 0
        lag = [v for (n, _), v in got.items() if n == "gateway_ledger_projection_lag_events"]
        assert len(lag) == 2
        assert CHAT not in text and "one" not in text.split()

    asyncio.run(main())


def test_the_console_serves_the_same_metrics_for_a_sidecar(sqlite_location: str) -> None:
    async def fill() -> None:
        async with Gateway.open(sqlite_location) as gw:
            await gw.start([ScriptedAdapter()])
            await gw.deliver(CTX, Reply("one"), "in-1")

    asyncio.run(fill())
    printed = subprocess.run(
        [SCRIPT, "metrics", "--db", sqlite_location], capture_output=True, text=True, check=True
    ).stdout
    assert 'gateway_ledger_obligations{platform="telegram",state="delivered"} 1.0' in printed
    server = subprocess.Popen(
        [SCRIPT, "metrics", "--db", sqlite_location, "--serve", "127.0.0.1:0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stderr is not None
        line = server.stderr.readline()
        url = line.rsplit(" ", 1)[-1].strip()
        import urllib.request

        served = urllib.request.urlopen(url, timeout=10).read().decode()
    finally:
        server.terminate()
        assert server.wait(timeout=10) == 0
    assert 'gateway_ledger_obligations{platform="telegram",state="delivered"} 1.0' in served
    assert "gateway_ledger_delivery_latency_seconds_bucket" in served


def _tree(finished: Any) -> dict[str, list[str]]:
    by_id = {s.context.span_id: s for s in finished}
    children: dict[str, list[str]] = {}
    for s in finished:
        parent = by_id.get(s.parent.span_id) if s.parent is not None else None
        children.setdefault(parent.name if parent else "-", []).append(s.name)
    return children


def _no_content(finished: Any) -> None:
    for s in finished:
        for name, value in (s.attributes or {}).items():
            assert name.startswith("gateway_ledger."), name
            text = str(value)
            assert TEXT not in text and "forty-two" not in text, (s.name, name)
            assert CHAT not in text and KEY not in text, (s.name, name)


def test_a_delivery_is_one_span_tree_in_the_callers_trace(
    sqlite_location: str, spans: InMemorySpanExporter
) -> None:
    async def main() -> Any:
        async with Gateway.open(sqlite_location) as gw:
            await gw.start([ScriptedAdapter()])
            spans.clear()
            tracer = trace.get_tracer("the embedding gateway")
            with tracer.start_as_current_span("handle inbound message") as caller:
                out = await gw.deliver(CTX, Reply(TEXT), "in-1")
            await gw.flush()
            return out, caller.get_span_context().trace_id, gw.ledger.history(out.obligation_id)

    out, trace_id, history = asyncio.run(main())
    finished = spans.get_finished_spans()
    tree = _tree(finished)
    assert tree["handle inbound message"] == ["gateway_ledger.deliver"]
    assert sorted(tree["gateway_ledger.deliver"]) == sorted(
        ["gateway_ledger.record", "gateway_ledger.send", "gateway_ledger.settle"]
    )
    assert {s.context.trace_id for s in finished} == {trace_id}
    deliver = next(s for s in finished if s.name == "gateway_ledger.deliver")
    assert deliver.attributes["gateway_ledger.obligation_id"] == out.obligation_id
    assert deliver.attributes["gateway_ledger.status"] == "delivered"
    send = next(s for s in finished if s.name == "gateway_ledger.send")
    assert send.attributes["gateway_ledger.attempt"] == 1
    assert send.attributes["gateway_ledger.platform"] == "telegram"
    _no_content(finished)
    # A history line links to the trace: every event of the reply names it.
    assert [h.meta.get("trace_id") for h in history] == [format(trace_id, "032x")] * 3
    correlations = {h.meta["correlation_id"] for h in history}
    assert len(correlations) == 1
    assert all(h.meta["causation_id"].startswith("inbound:") for h in history)
    assert "in-1" not in str([h.meta for h in history])


def test_a_recovery_is_a_sweep_with_its_claims_then_a_recover_span(
    sqlite_location: str, spans: InMemorySpanExporter
) -> None:
    async def main() -> Any:
        dead = Gateway.open(sqlite_location, owner=dead_owner())
        oid = compute_obligation_id(KEY, "in-1", TEXT)
        dead.ledger.record_obligation(
            obligation_id=oid,
            session_key=KEY,
            platform="telegram",
            chat_id=CHAT,
            content=TEXT,
        )
        dead.ledger.close()
        spans.clear()
        async with Gateway.open(sqlite_location) as gw:
            report = await gw.start([ScriptedAdapter()])
            await gw.flush()
            return report, gw.ledger.history(oid), oid

    report, history, oid = asyncio.run(main())
    assert report.redelivered == 1
    finished = spans.get_finished_spans()
    tree = _tree(finished)
    assert tree["gateway_ledger.sweep"] == ["gateway_ledger.claim"]
    assert sorted(tree["gateway_ledger.recover"]) == [
        "gateway_ledger.send",
        "gateway_ledger.settle",  # the recovery send's start, before the send (ADR 0070)
        "gateway_ledger.settle",  # its delivery, after it
    ]
    stages = sorted(
        str(s.attributes["gateway_ledger.stage"])
        for s in finished
        if s.name == "gateway_ledger.settle"
    )
    assert stages == ["delivered", "recovery send"]
    claim = next(s for s in finished if s.name == "gateway_ledger.claim")
    assert claim.attributes["gateway_ledger.fence"] == 1
    assert claim.attributes["gateway_ledger.state"] == "claimed"
    _no_content(finished)
    claimed = next(h for h in history if h.type == "Claimed")
    assert claimed.meta["causation_id"].startswith("sweep:")
    sweep = next(s for s in finished if s.name == "gateway_ledger.sweep")
    assert claimed.meta["trace_id"] == format(sweep.context.trace_id, "032x")
    delivered = next(h for h in history if h.type == "Delivered")
    assert delivered.meta["causation_id"] == f"recovery:{oid}"


def test_a_reconciliation_is_a_span_of_the_recovery_and_settles_without_a_send(
    sqlite_location: str, spans: InMemorySpanExporter
) -> None:
    """A dead owner's send may have arrived; the claimer asks the platform (ADR 0050),
    which finds it: ``reconcile`` and ``settle`` spans under ``recover``, the answer as its status,
    no ``send`` span, and the Reconciled event caused by the recovery."""

    class FindsIt(ScriptedAdapter):
        async def reconcile(self, query: ReconcileQuery) -> ReconcileAnswer:
            return ReconcileAnswer.arrived("tg-77", evidence="history: found")

    async def main() -> Any:
        dead = Gateway.open(sqlite_location, owner=dead_owner())
        oid = compute_obligation_id(KEY, "in-1", TEXT)
        dead.ledger.record_obligation(
            obligation_id=oid, session_key=KEY, platform="telegram", chat_id=CHAT, content=TEXT
        )
        dead.ledger.mark_attempting(oid, guard="none")  # then it died mid-send
        dead.ledger.close()
        spans.clear()
        adapter = FindsIt()
        async with Gateway.open(sqlite_location) as gw:
            await gw.start([adapter])
            await gw.flush()
            return gw.ledger.history(oid), gw.ledger.get(oid), adapter.sent, oid

    history, status, sent, oid = asyncio.run(main())
    assert status.state == "delivered" and sent == []
    finished = spans.get_finished_spans()
    tree = _tree(finished)
    assert sorted(tree["gateway_ledger.recover"]) == [
        "gateway_ledger.reconcile",
        "gateway_ledger.settle",
    ]
    reconcile = next(s for s in finished if s.name == "gateway_ledger.reconcile")
    assert reconcile.attributes["gateway_ledger.status"] == "arrived"
    assert reconcile.attributes["gateway_ledger.stage"] == "claim"
    assert reconcile.attributes["gateway_ledger.obligation_id"] == oid
    _no_content(finished)
    reconciled = next(h for h in history if h.type == "Reconciled")
    assert reconciled.meta["causation_id"] == f"recovery:{oid}"
    assert reconciled.meta["trace_id"] == format(reconcile.context.trace_id, "032x")


def test_history_correlation_shows_one_turn_across_sessions_and_the_ledger(
    sqlite_location: str,
) -> None:
    async def main() -> str:
        sessions = SessionStore.open(sqlite_location)
        source = SessionSource(platform="telegram", chat_id=CHAT, user_id="u-1")
        async with Gateway.open(sqlite_location) as gw:
            await gw.start([ScriptedAdapter(script=[SendResult.failed(ErrorClass.REJECTED, "no")])])
            with gateway_ledger.turn() as turn:
                ctx = sessions.resolve(source)
                sessions.append(ctx, "user", "what is the answer?", "in-9")
                out = await gw.deliver(CTX, Reply(TEXT), "in-9")
                sessions.append(ctx, "assistant", TEXT)
            # another chat: a reply to the same one would wait for the failed one's retry
            elsewhere = attrs.evolve(CTX, chat_id="5566778899")
            other = await gw.deliver(elsewhere, Reply("another turn"), "in-10")
            await gw.flush()
            assert out.status == "failed" and other.obligation_id != out.obligation_id
            gw.ledger.retry(out.obligation_id, by_operator="alice")
        sessions.close()
        return turn.correlation_id, out.obligation_id

    correlation, oid = asyncio.run(main())
    abandon = [SCRIPT, "abandon", oid, "--reason", "asked to stop", "--db", sqlite_location]
    subprocess.run(abandon, capture_output=True, text=True, check=True)
    done = subprocess.run(
        [SCRIPT, "history", "--correlation", correlation, "--db", sqlite_location, "--json"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    events = json.loads(done.stdout)["events"]
    stores = [e["store"] for e in events]
    assert "sessions" in stores and "ledger" in stores
    ledger = [e for e in events if e["store"] == "ledger"]
    assert [e["type"] for e in ledger] == [
        "Recorded",
        "Attempting",
        "Failed",
        "RetryRequested",
        "Abandoned",
    ]
    assert len({e["name"] for e in ledger}) == 1  # the other turn's reply is not there
    retry, abandoned = ledger[-2:]
    assert retry["meta"]["causation_id"] == "operator:retry:alice" and not retry["direct"]
    assert abandoned["meta"]["causation_id"].startswith("operator:abandon:")
    assert all(e["direct"] for e in events if e not in (retry, abandoned))
    shown = subprocess.run(
        [SCRIPT, "history", "--correlation", correlation, "--db", sqlite_location],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "RetryRequested" in shown and "operator:retry:alice" in shown
    assert TEXT not in shown and CHAT not in shown


def test_logs_are_structured_with_the_turns_ids_and_never_a_body(sqlite_location: str) -> None:
    """One DEBUG line per state change, a WARNING per fault, JSON with the same ids as the
    events; never the text. A reply under an id already recorded is a fault: it goes out
    untracked, and the collector counts both."""
    import io
    import logging

    from gateway_ledger.domain.values import MediaItem
    from gateway_ledger.infrastructure.observability.logs import configure_logging

    stream = io.StringIO()
    handler = configure_logging("json", logging.DEBUG, stream)

    async def main() -> Any:
        async with Gateway.open(sqlite_location) as gw:
            await gw.start([ScriptedAdapter()])
            registry = CollectorRegistry()
            registry.register(gateway_ledger.LedgerCollector(gw.ledger, gateway=gw))
            with gateway_ledger.turn("turn-42"):
                first = await gw.deliver(CTX, Reply(TEXT), "in-1")
                await gw.flush()
                image = MediaItem(kind="image", uri="file:///cat.png")
                await gw.deliver(CTX, Reply(TEXT, media=(image,)), "in-1")
            await gw.flush()
            return first, samples(registry)

    try:
        first, got = asyncio.run(main())
    finally:
        logging.getLogger("gateway_ledger").removeHandler(handler)
        logging.getLogger("gateway_ledger").setLevel(logging.NOTSET)
    assert got[("gateway_ledger_ledger_faults_total", ())] == 1
    assert got[("gateway_ledger_untracked_replies_total", ())] == 1
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    changes = [line for line in lines if line["logger"] == "gateway_ledger.events"]
    assert [c["event"] for c in changes] == ["Recorded", "Attempting", "Delivered"]
    assert all(c["level"] == "DEBUG" and c["correlation_id"] == "turn-42" for c in changes)
    assert all(c["causation_id"].startswith("inbound:") for c in changes)
    warnings = [line for line in lines if line["level"] == "WARNING"]
    assert all(w["correlation_id"] == "turn-42" for w in warnings)
    faults = [w for w in warnings if w["msg"].startswith("ledger fault")]
    assert len(faults) == 1
    assert faults[0]["obligation_id"] == first.obligation_id
    assert faults[0]["correlation_id"] == "turn-42" and faults[0]["stage"] == "record"
    text = stream.getvalue()
    assert TEXT not in text and "forty-two" not in text and CHAT not in text


def test_without_opentelemetry_installed_deliveries_work_and_open_no_span(
    sqlite_location: str,
) -> None:
    """The extra is optional: with no ``opentelemetry`` package at all (hidden here in a
    child process), a reply is delivered, and its events still record their causes."""
    child = f"""
import asyncio, sys
sys.modules["opentelemetry"] = None  # as if the extra were not installed
from gateway_ledger.application.observability import tracing
from gateway_ledger.application.delivery.ports import Reply, ReplyContext
from gateway_ledger.bootstrap import Gateway
from tests.gateway_fakes import ScriptedAdapter
assert tracing._otel is None
with tracing.span("deliver") as opened:
    assert opened is None and tracing.trace_id() is None

async def main():
    async with Gateway.open({sqlite_location!r}) as gw:
        await gw.start([ScriptedAdapter()])
        ctx = ReplyContext(session_key="k", platform="telegram", chat_id="1")
        out = await gw.deliver(ctx, Reply("hi"), "in-1")
        await gw.flush()
        history = gw.ledger.history(out.obligation_id)
        assert [h.type for h in history] == ["Recorded", "Attempting", "Delivered"]
        assert all(h.meta["causation_id"].startswith("inbound:") for h in history)
        assert not any("trace_id" in h.meta for h in history)

asyncio.run(main())
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", child],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
