"""Who may still be working on an obligation: the sweep's liveness policies (ADR 0005, 0010).

``LocalLiveness`` judges by ``/proc`` alone (one host, SQLite's default);
``LeaseLiveness`` adds leases across hosts. Both are the application's ``LivenessPolicy``
port (``application/delivery/ledger_ports.py``); ``bootstrap.py`` picks one per ledger.

The lease rule (ADR 0010), for the owner recorded on an unresolved obligation:

- on this host (same host name and boot): dead when its process is gone (``/proc``, ADR
  0005), even if its lease has not run out yet; dead when its lease expired beyond the
  skew allowance (a stopped process); alive otherwise, also without a lease row (a
  lease-less local writer is still provably alive);
- on another host: alive only while its lease row exists and
  ``now <= expires_at + clock_skew`` on the store's clock. No row means released on a clean
  close (or never held, or pruned long after death): nobody vouches for it, so it is dead.

Being judged dead early costs a duplicate (sent with the marker); fencing guarantees the
old owner can start no new send after the claim. Being judged alive wrongly would strand a
reply, which is never acceptable, so a missing lease on another host counts as dead.
"""

from __future__ import annotations

import socket

import attrs

from gateway_ledger.domain.values import OwnerIdentity
from gateway_ledger.infrastructure.ownership.installation import configured_host
from gateway_ledger.infrastructure.ownership.leases import LeaseTable
from gateway_ledger.infrastructure.ownership.process_identity import is_alive_locally


def this_host() -> str:
    return configured_host() or socket.gethostname() or "localhost"


def proven_gone(owner: OwnerIdentity) -> bool:
    """The ``GoneProof`` port: the owner ran on this host and its process no longer runs
    (another boot, pid gone or reused). A lapsed lease is not proof: a paused owner may
    still land a send it started (ADR 0050)."""
    return owner.host == this_host() and not is_alive_locally(owner)


@attrs.frozen
class LocalLiveness:
    """Liveness as one host can judge it: /proc for local owners, alive for the rest.

    An owner on another host cannot be judged from here; without leases it is taken as
    alive, so a sweep never steals work from a gateway it cannot see.
    """

    host: str = attrs.field(factory=lambda: configured_host() or socket.gethostname())

    def __call__(self, owner: OwnerIdentity) -> bool:
        if owner.host != self.host:
            return True
        return is_alive_locally(owner)


@attrs.frozen
class LeaseLiveness:
    """The ``LivenessPolicy`` port (``ledger_ports.py``) judged by leases."""

    table: LeaseTable
    clock_skew: float = 2.0
    host: str = attrs.field(factory=this_host)

    def __call__(self, owner: OwnerIdentity) -> bool:
        local = owner.host == self.host
        if local and not is_alive_locally(owner):
            return False  # gone (or another boot): no need to wait for its lease
        lease = self.table.lookup(owner)
        if lease.expires_at is None:
            return local
        return not lease.expired(self.clock_skew)
