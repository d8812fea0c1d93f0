"""The Linux calls a sandbox worker confines itself with (unshare, mount, prctl, capset), through ctypes.

Every method raises ``OSError`` (errno and message) when the kernel refuses the call; creating
a `Libc` raises ``OSError`` or ``AttributeError`` where the C library or a function is missing.
"""

import ctypes
import os

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_MOUNT_ATTR_RDONLY = 0x1
_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
_SYS_MOUNT_SETATTR = 442  # The same number on every Linux architecture.
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


class Libc:
    """The C library of this process, with errno kept for error messages."""

    def __init__(self):
        self.lib = ctypes.CDLL(None, use_errno=True)
        for name in ("unshare", "mount", "syscall", "prctl", "capset"):
            getattr(self.lib, name)  # AttributeError now rather than half-way through.

    @staticmethod
    def _check(result: int, what: str) -> int:
        if result < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"{what}: {os.strerror(errno)}")
        return result

    def unshare(self, flags: int) -> None:
        self._check(self.lib.unshare(flags), "unshare")

    def mount(
        self,
        source: str | None,
        target: str,
        flags: int,
        fstype: str | None = None,
        data: str | None = None,
    ) -> None:
        self._check(
            self.lib.mount(
                source.encode() if source else None,
                target.encode(),
                fstype.encode() if fstype else None,
                ctypes.c_ulong(flags),
                data.encode() if data else None,
            ),
            f"mount {target}",
        )

    def set_read_only(self, path: str, read_only: bool) -> None:
        """Sets or clears the read-only flag of the mounts at and below ``path``."""
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
        self._check(result, f"mount_setattr {path}")

    def prctl(self, option: int, arg2: int = 0, arg3: int = 0) -> int:
        """prctl(2) with unused trailing arguments 0; returns the call's non-negative result."""
        args = [ctypes.c_ulong(a) for a in (arg2, arg3, 0, 0)]
        return self._check(self.lib.prctl(ctypes.c_int(option), *args), f"prctl {option}")

    def clear_capabilities(self) -> None:
        """Empties the effective, permitted and inheritable capability sets (capset(2))."""
        header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
        data = (_CapData * 2)()
        self._check(self.lib.capset(ctypes.byref(header), data), "capset")
