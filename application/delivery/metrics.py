"""The Prometheus metric names of the ledger: a stable interface.

``gateway-ledger metrics`` and an embedding gateway's own registry get them from
``LedgerCollector`` (``gateway_ledger.LedgerCollector``, through ``prometheus-client``;
ADR 0057). The first group is read from the views; the last from the process that runs
the gateway (``LedgerCollector(ledger, gateway=...)``).
"""

from __future__ import annotations

PREFIX = "gateway_ledger"

METRIC_NAMES = (
    f"{PREFIX}_obligations",
    f"{PREFIX}_unresolved_obligations",
    f"{PREFIX}_quarantined_obligations",
    f"{PREFIX}_oldest_unresolved_age_seconds",
    f"{PREFIX}_abandoned_total",
    f"{PREFIX}_record_to_delivery_seconds",
    f"{PREFIX}_delivery_latency_seconds",
    f"{PREFIX}_recovery_claims_total",
    f"{PREFIX}_obligations_claimed_total",
    f"{PREFIX}_operator_retries_total",
    f"{PREFIX}_failed_after_acceptance_total",
    f"{PREFIX}_platform_status_obligations",
    f"{PREFIX}_event_log_position",
    f"{PREFIX}_projection_position",
    f"{PREFIX}_projection_lag_events",
    f"{PREFIX}_sweep_duration_seconds",
    f"{PREFIX}_dead_letters",
    f"{PREFIX}_dead_letter_oldest_age_seconds",
    f"{PREFIX}_pruned_obligations",
)
"""Every scrape: the views' figures, and the sweeps this process ran."""

GATEWAY_METRIC_NAMES = (
    f"{PREFIX}_ledger_faults_total",
    f"{PREFIX}_untracked_replies_total",
    f"{PREFIX}_retry_wait_seconds",
)
"""Only with a gateway: what exists only in the process that sends."""
