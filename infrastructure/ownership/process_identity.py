"""Who this process is, and whether the process behind an OwnerIdentity is still alive.

Linux facts: ``/proc/<pid>/stat`` field 22 is the start time in clock ticks since boot;
``/proc/sys/kernel/random/boot_id`` changes at every boot. Together with the pid they
tell a live owner from a dead one, and from an unrelated process that reused its pid.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from gateway_ledger.domain.values import OwnerIdentity

_BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


_boot_id: str | None = None


def boot_id() -> str:
    """This boot's id, read once per process (it changes only with a reboot)."""
    global _boot_id
    if _boot_id is None:
        try:
            _boot_id = _BOOT_ID_PATH.read_text().strip()
        except OSError:
            _boot_id = ""
    return _boot_id


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat, or None when the process is gone or /proc is absent.

    A zombie (state ``Z``: exited, not yet reaped by its parent) is gone: it will never
    send what it claimed, so its claims must not wait for the reaping.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself contain spaces or ')'.
    after_name = raw[raw.rfind(b")") + 2 :].split()
    if after_name[:1] in ([b"Z"], [b"X"]):  # field 3, the state: zombie or dead
        return None
    try:
        return int(after_name[19])  # fields 3.. are after the name; 22 is index 19
    except (IndexError, ValueError):
        return None


def current_owner(installation_id: str = "", host: str | None = None) -> OwnerIdentity:
    """This process; the host name may be configured (``GATEWAY_LEDGER_HOST``)."""
    from gateway_ledger.infrastructure.ownership.installation import configured_host

    pid = os.getpid()
    return OwnerIdentity(
        host=host or configured_host() or socket.gethostname() or "localhost",
        boot_id=boot_id(),
        pid=pid,
        start_time=process_start_time(pid),
        installation_id=installation_id,
    )


def is_alive_locally(owner: OwnerIdentity) -> bool:
    """True only when this host can prove the owner's process still runs.

    Dead when: another boot; no such pid; the pid now belongs to a process that started
    at another time (reuse); or the start time was never known (cannot prove identity).
    """
    if owner.boot_id and owner.boot_id != boot_id():
        return False
    if owner.start_time is None:
        return False
    return process_start_time(owner.pid) == owner.start_time
