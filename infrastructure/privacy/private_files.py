"""Files that hold secrets or personal data: created private, adopted only when private.

One rule for every such file (the master key, the session secret, the SQLite store, an
exported transcript): it is created owner-only (0600, whatever the umask), never through
a name another user could have planted (``O_EXCL``; ``O_NOFOLLOW`` for temporaries), and
its directory entry is flushed with it, so a power loss cannot keep data whose key is lost.
An existing secret is adopted only if this process's user owns it and nobody else may read
or write it: a key planted by another local user would let that user read everything
sealed with it.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from gateway_ledger.domain.errors import UnsafeSecretFile

PRIVATE_MODE = 0o600
MAX_SECRET_FILE_BYTES = 4096
"""A key or secret file is one short line; anything longer is not one."""

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NEW_PRIVATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC


def fsync_directory(directory: Path) -> None:
    """Make a new or renamed entry of ``directory`` survive a power loss."""
    fd = os.open(directory, os.O_RDONLY | _CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _new_private(path: Path) -> int:
    """Open a file that did not exist (not even as a symlink), owner-only whatever the umask."""
    fd = os.open(path, _NEW_PRIVATE, PRIVATE_MODE)
    try:
        os.fchmod(fd, PRIVATE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _temporary_beside(target: Path) -> Path:
    return target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")


def create_private_file(path: Path, content: bytes) -> bool:
    """Create ``path`` holding ``content`` (0600), complete or not at all; False if it
    already existed (another process's file wins, and is left untouched).

    The content goes to a fresh temporary first (``O_EXCL | O_NOFOLLOW``), is flushed,
    then linked into place: ``link`` refuses an existing name, so nobody reads a
    half-written secret and two first opens agree on one. The directory is flushed last.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = _temporary_beside(path)
    fd = _new_private(tmp)
    try:
        try:
            os.write(fd, content)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
            created = True
        except FileExistsError:
            created = False
    finally:
        tmp.unlink(missing_ok=True)
    fsync_directory(path.parent)
    return created


def read_private_file(path: Path, what: str) -> bytes | None:
    """The bytes of an existing secret file, or None if there is none.

    Refused (``UnsafeSecretFile``) unless it is a regular file owned by this process's
    user with no permission for group or others. A symlink is followed, and its target
    is what must pass (a mounted secret is often one).
    """
    try:
        fd = os.open(path, os.O_RDONLY | _CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except PermissionError:
        raise UnsafeSecretFile(
            f"{what} {path} cannot be read by this user (uid {os.geteuid()})"
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeSecretFile(f"{what} {path} is not a regular file")
        if info.st_uid != os.geteuid():
            raise UnsafeSecretFile(
                f"{what} {path} is not owned by this user (uid {info.st_uid}, "
                f"not {os.geteuid()}): refusing a file someone else may have planted"
            )
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise UnsafeSecretFile(
                f"{what} {path} is open to others (mode {mode:o}); run: chmod 600 {path}"
            )
        data = os.read(fd, MAX_SECRET_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET_FILE_BYTES:
        raise UnsafeSecretFile(f"{what} {path} is too long to be one")
    return data


def read_or_create_private_file(path: Path, what: str, make: Callable[[], bytes]) -> bytes:
    """The secret at ``path``, created from ``make()`` first if there is none."""
    data = read_private_file(path, what)
    if data is None:
        create_private_file(path, make())
        data = read_private_file(path, what)
        if data is None:  # removed between our link and our read: say so, do not loop
            raise UnsafeSecretFile(f"{what} {path} vanished as it was created")
    return data


def create_private_store_file(path: Path) -> None:
    """Create an empty store file owner-only before a database library opens it (it would
    create it with the umask's mode); an existing file keeps its mode."""
    try:
        fd = _new_private(path)
    except FileExistsError:
        return
    os.close(fd)
    fsync_directory(path.parent)


def replace_private_file(target: Path, chunks: Iterable[bytes]) -> int:
    """Write ``chunks`` to ``target`` (0600) through a fresh temporary beside it, then
    rename it into place; return the number of chunks written.

    The temporary is opened with ``O_EXCL | O_NOFOLLOW`` under an unguessable name, so a
    symlink planted in the directory is never followed, and it is removed on any error.
    """
    tmp = _temporary_beside(target)
    fd = _new_private(tmp)
    count = 0
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
                count += 1
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(target.parent)
    return count
