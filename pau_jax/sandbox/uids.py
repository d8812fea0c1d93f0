"""Machine-wide claims on the user ids sandbox workers run as: one uid per live worker.

A root parent runs each worker as its own user and group (`SandboxConfig.worker_uids`), so the
kernel keeps workers apart below the audit hook: a process without capabilities may signal
only processes of its own user, and a worker's directory (mode 0700, owned by its user) cannot
be listed or read by another worker, wherever a reference source is written there. A uid is
claimed with an exclusive ``flock`` on ``<tmp>/pau_uid_claims/<uid>`` that the parent holds
for the worker's life, so executors in one process or in several never give one uid to two
live workers, and a parent that dies releases its claims with its file descriptors.
"""

import fcntl
import logging
import os
import stat
import tempfile

_DIRECTORY = "pau_uid_claims"
log = logging.getLogger(__name__)


class UidClaim:
    """A uid held for one worker until `release`."""

    def __init__(self, uid: int, fd: int):
        self.uid = uid
        self._fd = fd

    def release(self) -> None:
        """Gives the uid back (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def validate(first_stop: tuple[int, int] | None) -> None:
    """Raises ValueError unless ``first_stop`` is None or a range of non-root uids."""
    if first_stop is None:
        return
    if (
        not isinstance(first_stop, (tuple, list))
        or len(first_stop) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in first_stop)
        or not 0 < first_stop[0] < first_stop[1] <= 2**32 - 1
    ):
        raise ValueError(
            "SandboxConfig.worker_uids must be None or (first, stop) with "
            f"0 < first < stop <= 2**32 - 1 (a half-open range of uids), got {first_stop!r}"
        )


def _mapped(first: int, stop: int, path: str) -> bool:
    """Whether ids [first, stop) all lie in one extent of a /proc/self/{u,g}id_map file."""
    try:
        with open(path, encoding="ascii") as f:
            extents = [tuple(int(x) for x in line.split()) for line in f if line.strip()]
    except (OSError, ValueError):
        return True  # No user namespaces here: every id is the kernel's own.
    return any(inside <= first and stop <= inside + count for inside, _, count in extents)


def usable_range(first_stop: tuple[int, int] | None) -> tuple[int, int] | None:
    """The uid range to claim from, or None (one shared ``sandbox_uid``), with one log line.

    Distinct uids need a root parent and a range mapped in this user namespace (a container
    with a 65,536-id map, say, cannot switch to uid 100000).
    """
    if first_stop is None or os.geteuid() != 0:
        return None
    first, stop = first_stop
    if not all(_mapped(first, stop, f"/proc/self/{k}id_map") for k in ("u", "g")):
        log.warning(
            "sandbox: worker uids [%d, %d) are not all mapped in this user namespace; every "
            "worker runs as SandboxConfig.sandbox_uid (workers can then signal one another "
            "below the audit hook); set SandboxConfig.worker_uids to a mapped range",
            first,
            stop,
        )
        return None
    return first, stop


def _directory() -> str:
    path = os.path.join(tempfile.gettempdir(), _DIRECTORY)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise RuntimeError(
            f"{path} is not a directory private to user {os.geteuid()}; remove it and retry"
        )
    return path


def claim(first: int, stop: int) -> UidClaim:
    """Claims the lowest free uid of [first, stop) for one worker.

    Raises:
      RuntimeError: every uid of the range is held by a live worker, or the claim directory
        is not private.
    """
    directory = _directory()
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    for uid in range(first, stop):
        fd = os.open(os.path.join(directory, str(uid)), flags, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return UidClaim(uid, fd)
    raise RuntimeError(
        f"every worker uid in [{first}, {stop}) is held by a live sandbox worker; "
        "widen SandboxConfig.worker_uids or start fewer workers"
    )
