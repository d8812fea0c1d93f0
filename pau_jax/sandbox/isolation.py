"""OS confinement of a sandbox worker: namespaces, read-only mounts, privileges and rlimits.

Each step is applied when the OS permits it and reported otherwise, so a worker started by an
unprivileged user still runs with resource limits and the audit hook (see `guard`). What a
worker ends up with, by how it was started:

* as root (the default ``drop_privileges=True``): its own network and mount namespaces, every
  mount read-only but its directory, user and group ``sandbox_uid`` and no capability in any
  set (see `privileges`), PR_SET_NO_NEW_PRIVS, not dumpable, rlimits. If the mount namespace
  is refused (no CAP_SYS_ADMIN, as in a default container) and the standard library lies
  below a directory the sandbox user may not search, the worker refuses to start
  (RuntimeError naming the directory) instead of running with a broken interpreter.
* as root with ``drop_privileges=False``: the same, but it stays user 0, still without
  capabilities: files whose owner is root and whose mode lets the owner read (``/etc/shadow``,
  mode 0640, for instance) stay readable; files of other users not readable by others, and
  other processes' ``/proc`` files, do not.
* as an unprivileged user: namespaces only where user namespaces or capabilities allow them;
  it keeps its uid, its permitted, effective, inheritable and ambient sets are emptied, and the
  bounding set stays as inherited (dropping it needs CAP_SETPCAP; with no_new_privs and no
  permitted capabilities nothing can use it); ``capabilities`` and ``notes`` say so.
* without prctl (not Linux, or no C library through ctypes): only rlimits and the audit hook;
  ``no_new_privs`` is False, and a root worker asked to drop privileges refuses to start.
"""

import os
import resource
import signal
from typing import Any

from pau_jax.sandbox import privileges, syscalls


def confine(root: str, config: dict[str, Any], parent_pid: int) -> dict[str, Any]:
    """Confines the calling worker process; call once, before any untrusted code runs.

    Args:
      root: the worker's private directory (stays writable).
      config: the worker settings sent by the parent (`SandboxConfig` fields).
      parent_pid: the parent's pid; the worker gets SIGKILL when the parent's thread that
        started it ends, and exits now if the parent is already gone.

    Returns:
      What was applied: ``network_namespace``, ``read_only_filesystem``, ``no_new_privs``
      (bools), ``uid`` (the user the worker runs as), ``capabilities`` (the bit mask of each
      capability set after the drop, `privileges.capability_sets`), ``covered_directories``
      (directories replaced by a tmpfs exposing only what the worker reads,
      `privileges.expose`) and ``notes`` (why a step was skipped).

    Raises:
      RuntimeError: a step the configuration requires as root failed (user switch, writable
        worker directory, readable standard library).
    """
    notes: list[str] = []
    info: dict[str, Any] = {
        "network_namespace": False,
        "read_only_filesystem": False,
        "covered_directories": [],
    }
    try:
        libc = syscalls.Libc()
        libc.prctl(syscalls.PR_SET_NO_NEW_PRIVS, 1)
        info["no_new_privs"] = True
    except (OSError, AttributeError) as exc:
        info["no_new_privs"] = False
        notes.append(f"no_new_privs: {exc}")
        libc = None
    switch = config["drop_privileges"] and os.geteuid() == 0
    uid = config["sandbox_uid"]
    essential, other = privileges.needed_paths(root)
    if libc is not None and config["network_namespace"]:
        try:
            libc.unshare(syscalls.CLONE_NEWNET)
            info["network_namespace"] = True
        except OSError as exc:
            notes.append(f"network_namespace: {exc}")
    if libc is not None and (config["read_only_filesystem"] or switch):
        _new_mount_namespace(libc, root, config, essential + other if switch else [], info, notes)
    if switch and libc is None:
        raise RuntimeError(
            "cannot drop root privileges without libc; set SandboxConfig(drop_privileges=False)"
        )
    if libc is not None:
        notes.extend(privileges.drop_bounding_set(libc))
    if switch:
        privileges.switch_user(root, uid)
    if libc is not None:
        notes.extend(privileges.drop_capabilities(libc))
    if switch:
        notes.extend(privileges.check_readable(essential, other, uid))
    if libc is not None:
        # After the user switch, which clears the parent-death signal. Not dumpable: the
        # worker's /proc files stay root's, so workers running as the same user cannot read or
        # trace one another.
        for option, value, what in (
            (syscalls.PR_SET_PDEATHSIG, signal.SIGKILL, "parent death signal"),
            (syscalls.PR_SET_DUMPABLE, 0, "not dumpable"),
        ):
            try:
                libc.prctl(option, value)
            except OSError as exc:
                notes.append(f"{what}: {exc}")
    info["uid"] = os.getuid()
    info["capabilities"] = privileges.capability_sets()
    if os.getppid() != parent_pid:
        os._exit(0)
    notes.extend(_set_limits(config))
    info["notes"] = notes
    return info


def _new_mount_namespace(
    libc: syscalls.Libc,
    root: str,
    config: dict[str, Any],
    exposed: list[str],
    info: dict[str, Any],
    notes: list[str],
) -> None:
    """Moves the process to a private mount namespace and applies the mount steps.

    Covers the directories above ``exposed`` that the sandbox user may not search, and makes
    every mount but ``root`` read-only when ``config`` asks for it; fills ``info`` and ``notes``.
    """
    try:
        libc.unshare(syscalls.CLONE_NEWNS)
        libc.mount(None, "/", syscalls.MS_REC | syscalls.MS_PRIVATE)
    except OSError as exc:
        notes.append(f"mount namespace: {exc}")
        return
    if exposed:
        try:
            info["covered_directories"] = privileges.expose(libc, exposed, config["sandbox_uid"])
        except OSError as exc:
            notes.append(f"covering unsearchable directories: {exc}")
    if config["read_only_filesystem"]:
        try:
            _read_only_except(libc, root)
            info["read_only_filesystem"] = True
        except OSError as exc:
            notes.append(f"read_only_filesystem: {exc}")


def _read_only_except(libc: syscalls.Libc, root: str) -> None:
    """Makes every mount of this (new, private) mount namespace read-only except ``root``.

    Raises:
      OSError: the mounts stayed writable (the caller notes it).
      RuntimeError: ``root`` stayed read-only.
    """
    libc.mount(root, root, syscalls.MS_BIND | syscalls.MS_REC)
    libc.set_read_only("/", True)
    try:
        libc.set_read_only(root, False)
    except OSError as exc:
        raise RuntimeError(
            f"the sandbox directory {root} stayed read-only ({exc}); "
            "set SandboxConfig(read_only_filesystem=False)"
        ) from exc


def _set_limits(config: dict[str, Any]) -> list[str]:
    """Sets the resource limits; returns notes on those the OS refused."""
    cpu = int(config["cpu_time_s"])
    limits = [
        ("RLIMIT_CORE", 0, 0),
        ("RLIMIT_NOFILE", config["max_open_files"], config["max_open_files"]),
        ("RLIMIT_FSIZE", config["max_file_bytes"], config["max_file_bytes"]),
        ("RLIMIT_NPROC", 0, 0),
        ("RLIMIT_AS", config["memory_bytes"], config["memory_bytes"]),
        ("RLIMIT_CPU", cpu, cpu + 5),
    ]
    notes = []
    for name, soft, hard in limits:
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (ValueError, OSError, AttributeError) as exc:
            notes.append(f"{name}: {exc}")
    return notes
