"""OS confinement of a sandbox worker: namespaces, read-only mounts, user switch and rlimits.

Each step is applied when the OS permits it and reported otherwise, so a worker started by an
unprivileged user still runs with resource limits and the audit hook (see `guard`).
"""

import ctypes
import os
import resource
import signal
from typing import Any

_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
_MOUNT_ATTR_RDONLY = 0x1
_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
_SYS_MOUNT_SETATTR = 442  # The same number on every Linux architecture.
_PR_SET_PDEATHSIG = 1
_PR_SET_KEEPCAPS = 8
_PR_SET_NO_NEW_PRIVS = 38
_CAP_DAC_READ_SEARCH = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


class _Libc:
    def __init__(self):
        self.lib = ctypes.CDLL(None, use_errno=True)

    def check(self, result: int, what: str) -> None:
        if result != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"{what}: {os.strerror(errno)}")

    def unshare(self, flags: int) -> None:
        self.check(self.lib.unshare(flags), "unshare")

    def mount(self, source: str | None, target: str, flags: int) -> None:
        src = source.encode() if source else None
        self.check(self.lib.mount(src, target.encode(), None, flags, None), f"mount {target}")

    def set_read_only(self, path: str, read_only: bool) -> None:
        attr = _MountAttr(
            _MOUNT_ATTR_RDONLY if read_only else 0, 0 if read_only else _MOUNT_ATTR_RDONLY, 0, 0
        )
        result = self.lib.syscall(
            _SYS_MOUNT_SETATTR,
            _AT_FDCWD,
            path.encode(),
            _AT_RECURSIVE,
            ctypes.byref(attr),
            ctypes.sizeof(attr),
        )
        self.check(result, f"mount_setattr {path}")

    def prctl(self, option: int, value: int) -> None:
        self.check(self.lib.prctl(option, value, 0, 0, 0), f"prctl {option}")

    def keep_only_read_capability(self) -> None:
        header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
        data = (_CapData * 2)()
        data[0].effective = data[0].permitted = 1 << _CAP_DAC_READ_SEARCH
        self.check(self.lib.capset(ctypes.byref(header), data), "capset")


def confine(root: str, config: dict[str, Any], parent_pid: int) -> dict[str, Any]:
    """Confines the calling worker process; call once, before any untrusted code runs.

    Args:
      root: the worker's private directory (stays writable).
      config: the worker settings sent by the parent (`SandboxConfig` fields).
      parent_pid: the parent's pid; the worker gets SIGKILL when the parent's thread that
        started it ends, and exits now if the parent is already gone.

    Returns:
      What was applied: ``network_namespace``, ``read_only_filesystem`` (bools), ``uid`` (the
      user the worker runs as), ``no_new_privs`` and ``notes`` (why a step was skipped).
    """
    notes: list[str] = []
    info: dict[str, Any] = {"network_namespace": False, "read_only_filesystem": False}
    try:
        libc = _Libc()
        libc.prctl(_PR_SET_NO_NEW_PRIVS, 1)
        info["no_new_privs"] = True
    except (OSError, AttributeError) as exc:
        info["no_new_privs"] = False
        notes.append(f"no_new_privs: {exc}")
        libc = None
    wanted = []
    if config["network_namespace"]:
        wanted.append(("network_namespace", _CLONE_NEWNET))
    if config["read_only_filesystem"]:
        wanted.append(("read_only_filesystem", _CLONE_NEWNS))
    for name, flag in wanted if libc is not None else []:
        try:
            libc.unshare(flag)
            if flag == _CLONE_NEWNS:
                _read_only_except(libc, root)
        except (OSError, AttributeError) as exc:
            notes.append(f"{name}: {exc}")
            continue
        info[name] = True
    if config["drop_privileges"] and os.geteuid() == 0:
        if libc is None:
            raise RuntimeError(
                "cannot drop root privileges without libc; set SandboxConfig(drop_privileges=False)"
            )
        _switch_user(libc, root, config["sandbox_uid"])
    info["uid"] = os.getuid()
    if libc is not None:
        # Set after the user switch, which clears it.
        try:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError) as exc:
            notes.append(f"parent death signal: {exc}")
    if os.getppid() != parent_pid:
        os._exit(0)
    notes.extend(_set_limits(config))
    info["notes"] = notes
    return info


def _read_only_except(libc: _Libc, root: str) -> None:
    """Makes every mount of this (new) mount namespace read-only except ``root``."""
    libc.mount(None, "/", _MS_REC | _MS_PRIVATE)
    libc.mount(root, root, _MS_BIND | _MS_REC)
    libc.set_read_only("/", True)
    try:
        libc.set_read_only(root, False)
    except OSError as exc:
        raise RuntimeError(
            f"the sandbox directory {root} stayed read-only ({exc}); "
            "set SandboxConfig(read_only_filesystem=False)"
        ) from exc


def _switch_user(libc: _Libc, root: str, uid: int) -> None:
    """Runs the process as ``uid`` keeping only CAP_DAC_READ_SEARCH (to read any file)."""
    for directory, _, files in os.walk(root):
        os.chown(directory, uid, uid)
        for name in files:
            os.chown(os.path.join(directory, name), uid, uid)
    try:
        libc.prctl(_PR_SET_KEEPCAPS, 1)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        libc.keep_only_read_capability()
    except (OSError, AttributeError) as exc:
        raise RuntimeError(
            f"cannot run the worker as uid {uid} ({exc}); set SandboxConfig(drop_privileges=False)"
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
