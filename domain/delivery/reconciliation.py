"""What a platform can say about a reply after the gateway lost track of a send (ADR 0050).

Two kinds of answer come from a platform:

- a **reconciliation** answer, asked before an uncertain send is repeated: the reply
  ``arrived`` (with the platform's message ids), ``not_arrived`` (the platform's answer
  covers the whole window of the send), or ``unknown`` (it cannot tell, answered too late
  or answered nonsense);
- a **status** reported after the platform accepted a send: ``delivered_to_device``,
  ``read``, or ``failed_after_acceptance`` (the platform dropped a message it had taken).

Pure values: no I/O, no clock.
"""

from __future__ import annotations

from enum import StrEnum


class ReconcileOutcome(StrEnum):
    ARRIVED = "arrived"
    NOT_ARRIVED = "not_arrived"
    UNKNOWN = "unknown"


class PlatformStatus(StrEnum):
    """A status a platform reports after it accepted a send, in the order it can happen."""

    DELIVERED_TO_DEVICE = "delivered_to_device"
    READ = "read"
    FAILED_AFTER_ACCEPTANCE = "failed_after_acceptance"

    @property
    def rank(self) -> int:
        """How far along a delivered reply is: a status never moves it back."""
        return _RANK[self]


_RANK = {
    PlatformStatus.FAILED_AFTER_ACCEPTANCE: 1,
    PlatformStatus.DELIVERED_TO_DEVICE: 1,
    PlatformStatus.READ: 2,
}
"""Accepted (no status yet) is 0. A failure after acceptance is possible only before any
other status: a message on the device or read cannot fail to arrive afterwards."""

ACCEPTED_RANK = 0
