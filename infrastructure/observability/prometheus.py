"""``LedgerCollector``: the ledger's figures as a ``prometheus_client`` collector.

An embedding gateway registers it in its own registry::

    registry.register(LedgerCollector(ledger, gateway=gateway))

Each scrape reads the views (``ledger.stats()``: the obligation index, caught up first)
and this process's own measures; it never replays history. The metric names are a
stable interface (``METRIC_NAMES``); the README lists them for dashboards.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gateway_ledger.application.delivery.measures import Buckets, Histogram
from gateway_ledger.application.delivery.metrics import PREFIX
from gateway_ledger.application.delivery.operations import LedgerStats
from gateway_ledger.application.delivery.pacing import PacingStats


def _buckets(buckets: Buckets) -> list[tuple[str, float]]:
    bounds = [repr(float(b)) for b in buckets.bounds] + ["+Inf"]
    return list(zip(bounds, map(float, buckets.cumulative), strict=True))


def _histogram(name: str, text: str, buckets: Buckets, **labels: str) -> HistogramMetricFamily:
    family = HistogramMetricFamily(f"{PREFIX}_{name}", text, labels=list(labels))
    family.add_metric(list(labels.values()), _buckets(buckets), buckets.total)
    return family


def _by_reason(name: str, text: str, histograms: Mapping[str, Histogram]) -> Metric:
    """One histogram family, a series per reason."""
    family = HistogramMetricFamily(f"{PREFIX}_{name}", text, labels=["reason"])
    for reason, histogram in histograms.items():
        buckets = histogram.read()
        family.add_metric([reason], _buckets(buckets), buckets.total)
    return family


def stats_metrics(stats: LedgerStats) -> Iterator[Metric]:
    """The figures of ``status`` (every name that ``metrics`` printed before it came
    through this library), then the record-to-delivery histogram."""

    def gauge(name: str, text: str, value: float | None = None, **kw: Any) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"{PREFIX}_{name}", text, value=value, **kw)

    def counter(name: str, text: str, value: float | None = None, **kw: Any) -> Any:
        return CounterMetricFamily(f"{PREFIX}_{name}", text, value=value, **kw)

    obligations = gauge(
        "obligations", "Obligations by platform and state.", labels=["platform", "state"]
    )
    for platform, per in stats.by_platform.items():
        for state, n in per.items():
            obligations.add_metric([platform, state], n)
    yield obligations
    yield gauge("unresolved_obligations", "Obligations still owed.", stats.unresolved)
    yield gauge(
        "quarantined_obligations",
        "Obligations with an event this version cannot read: never sent (ADR 0027).",
        stats.quarantined,
    )
    yield gauge(
        "oldest_unresolved_age_seconds",
        "Age of the oldest unresolved obligation.",
        stats.oldest_unresolved_age_seconds or 0,
    )
    abandoned = counter("abandoned", "Obligations abandoned, by reason.", labels=["reason"])
    for reason, n in stats.abandoned_by_reason.items():
        abandoned.add_metric([reason], n)
    yield abandoned
    times = stats.delivery_seconds
    summary = Metric(
        f"{PREFIX}_record_to_delivery_seconds", "Seconds from record to delivery.", "summary"
    )
    for quantile, value in (("0.5", times.p50), ("0.95", times.p95), ("1", times.max)):
        summary.add_sample(
            summary.name, {"quantile": quantile}, float("nan") if value is None else value
        )
    summary.add_sample(f"{summary.name}_sum", {}, times.total)
    summary.add_sample(f"{summary.name}_count", {}, times.count)
    yield summary
    yield _histogram(
        "delivery_latency_seconds",
        "Seconds from record to delivery, as a histogram (the obligation index).",
        stats.delivery_histogram,
    )
    yield counter("recovery_claims", "Claims by recovery sweeps.", stats.recovery_claims)
    yield counter(
        "obligations_claimed", "Obligations claimed at least once.", stats.obligations_claimed
    )
    yield counter("operator_retries", "Retries requested by operators.", stats.operator_retries)
    yield counter(
        "failed_after_acceptance",
        "Sends a platform dropped after accepting them; each reopened its obligation.",
        stats.failed_after_acceptance,
    )
    by_status = gauge(
        "platform_status_obligations",
        "Delivered obligations by platform status (ADR 0050).",
        labels=["status"],
    )
    for status, n in stats.by_platform_status.items():
        by_status.add_metric([status], n)
    yield by_status
    yield gauge("event_log_position", "Id of the newest event notification.", stats.log_position)
    position = gauge(
        "projection_position", "Last notification a projection reflects.", labels=["projection"]
    )
    lag = gauge(
        "projection_lag_events",
        "Notifications a projection is behind the log.",
        labels=["projection"],
    )
    for p in stats.projections:
        position.add_metric([p.name], p.position)
        lag.add_metric([p.name], p.lag)
    yield position
    yield lag


def retention_metrics(figures: dict[str, Any]) -> Iterator[Metric]:
    """The dead letters and the tombstones (ADR 0053), read from the index and the
    tombstone table."""
    dead = figures["dead_letters"]
    oldest = dead["oldest_age_seconds"]
    yield GaugeMetricFamily(
        f"{PREFIX}_dead_letters", "Replies abandoned or quarantined (dead letters).", dead["count"]
    )
    yield GaugeMetricFamily(
        f"{PREFIX}_dead_letter_oldest_age_seconds",
        "Age of the oldest dead letter.",
        float("nan") if oldest is None else oldest,
    )
    yield GaugeMetricFamily(
        f"{PREFIX}_pruned_obligations",
        "Resolved obligations pruned (tombstones).",
        figures.get("pruned", 0),
    )


def pacing_families(pacing: PacingStats | None) -> Iterator[Metric]:
    """This gateway's pacer now (ADR 0065): replies waiting, the oldest wait, pauses."""
    if pacing is None:
        return
    waiting = GaugeMetricFamily(
        f"{PREFIX}_paced_replies",
        "Replies waiting for their turn in their chat or for the rate budget.",
        labels=["platform"],
    )
    for platform, count in sorted(pacing.queued.items()):
        waiting.add_metric([platform], count)
    yield waiting
    yield GaugeMetricFamily(
        f"{PREFIX}_pacing_oldest_wait_seconds",
        "How long the longest-waiting reply in the pacer has waited.",
        value=pacing.oldest_wait,
    )
    pauses = GaugeMetricFamily(
        f"{PREFIX}_pacing_pauses",
        "Pauses a platform's retry_after set, in force now, by platform and scope.",
        labels=["platform", "scope"],
    )
    counted: dict[tuple[str, str], int] = {}
    for pause in pacing.pauses:
        counted[(pause.platform, pause.scope)] = counted.get((pause.platform, pause.scope), 0) + 1
    for (platform, scope), count in sorted(counted.items()):
        pauses.add_metric([platform, scope], count)
    yield pauses
    yield CounterMetricFamily(
        f"{PREFIX}_order_released",
        "Replies sent before an earlier unresolved reply to their chat (recorded).",
        value=pacing.order_released,
    )


class LedgerCollector(Collector):
    """The ledger's metrics for a ``prometheus_client`` registry.

    ``ledger``: figures from its views, and the sweep durations this process measured.
    ``gateway`` (optional): this gateway's own counters and waits, which exist only in the
    process that runs it: ledger faults, untracked replies, and the time spent waiting
    for a runtime retry or a platform's rate limit.
    """

    def __init__(self, ledger: Any, gateway: Any = None) -> None:
        self.ledger = ledger
        self.gateway = gateway

    def describe(self) -> list[Metric]:
        """Nothing: registering must not read the store (the library then calls
        ``collect`` only when scraped)."""
        return []

    def collect(self) -> Iterator[Metric]:
        yield from stats_metrics(self.ledger.stats())
        yield from retention_metrics(self.ledger.retention_status())
        yield _histogram(
            "sweep_duration_seconds",
            "Seconds a recovery sweep of this process took.",
            self.ledger.measures.sweeps.read(),
        )
        if self.gateway is None:
            return
        stats = self.gateway.stats()
        yield CounterMetricFamily(
            f"{PREFIX}_ledger_faults",
            "Ledger faults of this gateway (each logged; the reply still went out).",
            value=stats.ledger_faults,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_untracked_replies",
            "Replies this gateway sent without a record (the ledger refused or failed).",
            value=stats.untracked,
        )
        measures = self.ledger.measures
        yield _by_reason(
            "retry_wait_seconds",
            "Seconds scheduled before a runtime retry, by reason (backoff, rate_limit).",
            measures.waits,
        )
        yield _by_reason(
            "pacing_wait_seconds",
            "Seconds a send waited in the pacer, by reason (order, rate, pause; ADR 0065).",
            measures.paced,
        )
        yield from pacing_families(stats.pacing)
