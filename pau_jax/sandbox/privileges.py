"""Dropping a sandbox worker's privileges: the directories it reads made reachable, the user switch, no capabilities.

A worker started as root runs its untrusted code as ``SandboxConfig.sandbox_uid`` (and the
group of the same number, with no supplementary groups) holding no capability at all (the
effective, permitted, inheritable, ambient and bounding sets are empty), so the kernel's
ordinary file permissions apply to it: files only root may read (``/etc/shadow``), files of
other users that are not readable by others, and the ``/proc`` files of other processes (their
environment, memory and descriptors) cannot be opened. The interpreter keeps working after
the switch because what it reads later, lazily imported modules included, stays reachable:
a directory above them that the sandbox user may not search (``/root`` above a Python
installed by pyenv, for instance) is covered, in the worker's own mount namespace, by a small
read-only tmpfs holding only the entries on the way to those paths, each a bind mount of the
original; the rest of that directory is hidden from the worker.
"""

import itertools
import os
import stat
import sys

from pau_jax.sandbox import syscalls

_CAPABILITY_SETS = {
    "CapInh": "inheritable",
    "CapPrm": "permitted",
    "CapEff": "effective",
    "CapBnd": "bounding",
    "CapAmb": "ambient",
}


def needed_paths(root: str) -> tuple[list[str], list[str]]:
    """What the worker reads after confining itself.

    Args:
      root: the worker's private directory.

    Returns:
      (essential, other): ``root`` and the standard library, without which the worker cannot
      work; and the other existing ``sys.path`` entries and installation prefixes.
    """
    essential = [os.path.abspath(root), os.path.dirname(os.path.abspath(os.__file__))]
    other = []
    for path in (*sys.path, sys.prefix, sys.base_prefix):
        path = os.path.abspath(path) if path else ""
        if path and path not in essential and path not in other and os.path.exists(path):
            other.append(path)
    return essential, other


def _searchable(directory: str, uid: int) -> bool:
    """Whether user ``uid`` (in group ``uid`` only) may search ``directory`` (mode bits only)."""
    st = os.stat(directory)
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == uid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def expose(libc: syscalls.Libc, paths: list[str], uid: int) -> list[str]:
    """Makes ``paths`` reachable for ``uid`` in this process's (new, private) mount namespace.

    Every directory above one of ``paths`` that ``uid`` may not search is covered by a tmpfs
    (mode 0755) that holds only the entries leading to ``paths``, each a recursive bind mount
    of the original entry. Call before the user switch (mounting needs CAP_SYS_ADMIN).

    Args:
      libc: the C library.
      paths: absolute paths the worker reads.
      uid: the user the worker will run as.

    Returns:
      The directories covered.

    Raises:
      OSError: a mount was refused.
    """
    covers: dict[str, set[str]] = {}
    for path in paths:
        for form in {os.path.abspath(path), os.path.realpath(path)}:
            parts = form.strip(os.sep).split(os.sep)
            for depth in range(1, len(parts)):
                directory = os.path.realpath(os.sep + os.path.join(*parts[:depth]))
                if directory not in paths and not _searchable(directory, uid):
                    covers.setdefault(directory, set()).add(parts[depth])
    originals: dict[str, int] = {}
    try:
        for directory, names in covers.items():
            for name in names:
                entry = os.path.join(directory, name)
                originals[entry] = os.open(entry, os.O_PATH | os.O_CLOEXEC)
        for directory in sorted(covers, key=lambda d: d.count(os.sep)):
            flags = syscalls.MS_NOSUID | syscalls.MS_NODEV | syscalls.MS_NOEXEC
            libc.mount("tmpfs", directory, flags, "tmpfs", "mode=0755,size=64k")
            for name in sorted(covers[directory]):
                entry = os.path.join(directory, name)
                if stat.S_ISDIR(os.fstat(originals[entry]).st_mode):
                    os.mkdir(entry)
                else:
                    os.close(os.open(entry, os.O_CREAT | os.O_WRONLY, 0o644))
                source = f"/proc/self/fd/{originals[entry]}"
                libc.mount(source, entry, syscalls.MS_BIND | syscalls.MS_REC)
    finally:
        for fd in originals.values():
            os.close(fd)
    return sorted(covers)


def switch_user(root: str, uid: int) -> None:
    """Gives ``root`` to ``uid`` and runs the process as user and group ``uid``, no other groups.

    The kernel clears the permitted and effective capabilities with the switch (no
    PR_SET_KEEPCAPS); `drop_capabilities` empties the remaining sets.

    Raises:
      RuntimeError: the switch was refused.
    """
    try:
        for directory, _, files in os.walk(root):
            os.chown(directory, uid, uid)
            for name in files:
                os.chown(os.path.join(directory, name), uid, uid)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    except OSError as exc:
        raise RuntimeError(
            f"cannot run the worker as uid {uid} ({exc}); set SandboxConfig(drop_privileges=False)"
        ) from exc


def drop_bounding_set(libc: syscalls.Libc) -> list[str]:
    """Removes every capability from the bounding set (needs CAP_SETPCAP); returns notes.

    Without CAP_SETPCAP (a worker not started as root) the set stays as inherited; with
    PR_SET_NO_NEW_PRIVS and empty permitted and inheritable sets, nothing can use it.
    """
    for cap in itertools.count():
        try:
            present = libc.prctl(syscalls.PR_CAPBSET_READ, cap)
        except OSError:
            return []  # EINVAL: past the last capability this kernel knows.
        if present:
            try:
                libc.prctl(syscalls.PR_CAPBSET_DROP, cap)
            except OSError as exc:
                return [f"capability bounding set kept: {exc}"]
    return []


def drop_capabilities(libc: syscalls.Libc) -> list[str]:
    """Empties the ambient, inheritable, permitted and effective sets; returns notes on refusals."""
    notes = []
    try:
        libc.prctl(syscalls.PR_CAP_AMBIENT, syscalls.PR_CAP_AMBIENT_CLEAR_ALL)
    except OSError as exc:  # EINVAL before Linux 4.3, which has no ambient set.
        notes.append(f"ambient capabilities: {exc}")
    try:
        libc.clear_capabilities()
    except OSError as exc:
        notes.append(f"capabilities kept: {exc}")
    return notes


def capability_sets() -> dict[str, int]:
    """The capability sets of this process (bit masks) as ``/proc/self/status`` shows them.

    Keys: ``inheritable``, ``permitted``, ``effective``, ``bounding``, ``ambient``; empty when
    ``/proc`` cannot be read.
    """
    sets = {}
    try:
        with open("/proc/self/status", encoding="utf-8") as f:  # utf-8: a codec always loaded.
            for line in f:
                key, _, value = line.partition(":")
                if key in _CAPABILITY_SETS:
                    sets[_CAPABILITY_SETS[key]] = int(value.strip(), 16)
    except OSError:
        return {}
    return sets


def check_readable(essential: list[str], other: list[str], uid: int) -> list[str]:
    """Checks, after the user switch, that the worker can read what it needs.

    Returns:
      Notes naming the ``other`` paths it cannot read (imports from them will fail).

    Raises:
      RuntimeError: an ``essential`` path is unreadable.
    """

    def readable(path: str) -> bool:
        return os.access(path, os.R_OK | (os.X_OK if os.path.isdir(path) else 0))

    for path in essential:
        if not readable(path):
            raise RuntimeError(
                f"the sandbox user {uid} cannot read {path}; make it readable by other users, "
                "allow mount namespaces (CAP_SYS_ADMIN), or set SandboxConfig(drop_privileges=False)"
            )
    return [f"unreadable by the sandbox user: {path}" for path in other if not readable(path)]
