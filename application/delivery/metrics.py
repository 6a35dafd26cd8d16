"""Prometheus text exposition of :class:`LedgerStats` (the names are a stable interface).

An embedding gateway calls ``ledger.stats()`` and either uses the figures directly or
serves ``prometheus_text(stats)`` from its own metrics endpoint.
"""

from __future__ import annotations

from gateway_ledger.application.delivery.operations import LedgerStats

PREFIX = "gateway_ledger"

METRIC_NAMES = (
    f"{PREFIX}_obligations",
    f"{PREFIX}_unresolved_obligations",
    f"{PREFIX}_quarantined_obligations",
    f"{PREFIX}_oldest_unresolved_age_seconds",
    f"{PREFIX}_abandoned_total",
    f"{PREFIX}_record_to_delivery_seconds",
    f"{PREFIX}_recovery_claims_total",
    f"{PREFIX}_obligations_claimed_total",
    f"{PREFIX}_operator_retries_total",
    f"{PREFIX}_event_log_position",
    f"{PREFIX}_projection_position",
    f"{PREFIX}_projection_lag_events",
    f"{PREFIX}_dead_letters",
    f"{PREFIX}_dead_letter_oldest_age_seconds",
    f"{PREFIX}_pruned_obligations",
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value: float | int | None) -> str:
    if value is None:
        return "NaN"
    return repr(float(value)) if isinstance(value, float) else str(value)


def prometheus_text(stats: LedgerStats) -> str:
    out: list[str] = []

    def family(name: str, kind: str, text: str) -> None:
        out.append(f"# HELP {PREFIX}_{name} {text}")
        out.append(f"# TYPE {PREFIX}_{name} {kind}")

    def sample(name: str, value: float | int | None, **labels: str) -> None:
        inner = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        out.append(
            f"{PREFIX}_{name}{{{inner}}} {_num(value)}"
            if inner
            else f"{PREFIX}_{name} {_num(value)}"
        )

    family("obligations", "gauge", "Obligations by platform and state.")
    for platform, per in stats.by_platform.items():
        for state, n in per.items():
            sample("obligations", n, platform=platform, state=state)
    family("unresolved_obligations", "gauge", "Obligations still owed.")
    sample("unresolved_obligations", stats.unresolved)
    family(
        "quarantined_obligations",
        "gauge",
        "Obligations with an event this version cannot read: never sent (ADR 0027).",
    )
    sample("quarantined_obligations", stats.quarantined)
    family("oldest_unresolved_age_seconds", "gauge", "Age of the oldest unresolved obligation.")
    sample("oldest_unresolved_age_seconds", stats.oldest_unresolved_age_seconds or 0)
    family("abandoned_total", "counter", "Obligations abandoned, by reason.")
    for reason, n in stats.abandoned_by_reason.items():
        sample("abandoned_total", n, reason=reason)
    times = stats.delivery_seconds
    family("record_to_delivery_seconds", "summary", "Seconds from record to delivery.")
    sample("record_to_delivery_seconds", times.p50, quantile="0.5")
    sample("record_to_delivery_seconds", times.p95, quantile="0.95")
    sample("record_to_delivery_seconds", times.max, quantile="1")
    sample("record_to_delivery_seconds_sum", times.total)
    sample("record_to_delivery_seconds_count", times.count)
    family("recovery_claims_total", "counter", "Claims by recovery sweeps.")
    sample("recovery_claims_total", stats.recovery_claims)
    family("obligations_claimed_total", "counter", "Obligations claimed at least once.")
    sample("obligations_claimed_total", stats.obligations_claimed)
    family("operator_retries_total", "counter", "Retries requested by operators.")
    sample("operator_retries_total", stats.operator_retries)
    family("event_log_position", "gauge", "Id of the newest event notification.")
    sample("event_log_position", stats.log_position)
    family("projection_position", "gauge", "Last notification a projection reflects.")
    for p in stats.projections:
        sample("projection_position", p.position, projection=p.name)
    family("projection_lag_events", "gauge", "Notifications a projection is behind the log.")
    for p in stats.projections:
        sample("projection_lag_events", p.lag, projection=p.name)
    return "\n".join(out) + "\n"


def retention_text(dead_letters: int, oldest_age: float | None, pruned: int) -> str:
    """The dead letters and the tombstones, in the same exposition (``metrics`` appends it)."""
    return (
        "\n".join(
            [
                f"# HELP {PREFIX}_dead_letters Replies abandoned or quarantined (dead letters).",
                f"# TYPE {PREFIX}_dead_letters gauge",
                f"{PREFIX}_dead_letters {dead_letters}",
                f"# HELP {PREFIX}_dead_letter_oldest_age_seconds Age of the oldest dead letter.",
                f"# TYPE {PREFIX}_dead_letter_oldest_age_seconds gauge",
                f"{PREFIX}_dead_letter_oldest_age_seconds {_num(oldest_age)}",
                f"# HELP {PREFIX}_pruned_obligations Resolved obligations pruned (tombstones).",
                f"# TYPE {PREFIX}_pruned_obligations gauge",
                f"{PREFIX}_pruned_obligations {pruned}",
            ]
        )
        + "\n"
    )
