"""Python audit hook that refuses network, process, native-code and out-of-sandbox file operations.

The hook is installed once in a worker process (it cannot be removed) and holds no state that
code in the process can change. Refused operations raise
``PermissionError("sandbox: <what> is not allowed")``; hooks added by sandboxed code are
refused too (CPython then drops them without an error). ``ctypes`` may be imported, but every
ctypes operation that raises an audit event (loading libraries, calling functions, reading
addresses) is refused. The hook is one layer of the sandbox; the OS layers (namespaces,
read-only mounts, user switch, resource limits) apply even to code that gets past it.
"""

import os
import sys

_DENIED_PREFIXES = {
    "socket.": "network access",
    "ftplib.": "network access",
    "http.client.": "network access",
    "imaplib.": "network access",
    "nntplib.": "network access",
    "poplib.": "network access",
    "smtplib.": "network access",
    "telnetlib.": "network access",
    "urllib.Request": "network access",
    "webbrowser.": "network access",
    "ctypes.": "native code through ctypes",
    "subprocess.": "starting processes",
    "os.exec": "starting processes",
    "os.spawn": "starting processes",
    "os.posix_spawn": "starting processes",
    "os.fork": "starting processes",
    "os.system": "starting processes",
    "pty.": "starting processes",
    "os.startfile": "starting processes",
    "os.killpg": "signalling other processes",
    "resource.setrlimit": "changing resource limits",
    "resource.prlimit": "changing resource limits",
    "sys.addaudithook": "adding audit hooks",
    "syslog.": "writing to the system log",
    "sqlite3.enable_load_extension": "native code through sqlite3 extensions",
    "sqlite3.load_extension": "native code through sqlite3 extensions",
    "ensurepip.": "installing packages",
    "winreg.": "registry access",
    "_winapi.": "starting processes",
}
_PREFIXES = tuple(_DENIED_PREFIXES)

# Events that create, change or remove files: event -> (positions of path arguments,
# positions of dir_fd arguments).
_PATH_EVENTS = {
    "os.remove": ((0,), (1,)),
    "os.rmdir": ((0,), (1,)),
    "os.mkdir": ((0,), (2,)),
    "os.rename": ((0, 1), (2, 3)),
    "os.link": ((1,), (2, 3)),
    "os.symlink": ((1,), (2,)),
    "os.truncate": ((0,), ()),
    "os.chmod": ((0,), (2,)),
    "os.chown": ((0,), (3,)),
    "os.utime": ((0,), (3,)),
    "os.setxattr": ((0,), ()),
    "os.removexattr": ((0,), ()),
    "shutil.copyfile": ((1,), ()),
    "shutil.copymode": ((1,), ()),
    "shutil.copystat": ((1,), ()),
    "shutil.copytree": ((1,), ()),
    "shutil.move": ((0, 1), ()),
    "shutil.rmtree": ((0,), (1,)),
    "shutil.make_archive": ((0,), ()),
    "shutil.unpack_archive": ((1,), ()),
    "tempfile.mkstemp": ((0,), ()),
    "tempfile.mkdtemp": ((0,), ()),
}
# Frequent events that need no check (answered first, for speed).
_HARMLESS = frozenset(
    {
        "builtins.id",
        "code.__new__",
        "compile",
        "exec",
        "import",
        "marshal.loads",
        "object.__getattr__",
        "object.__setattr__",
        "os.listdir",
        "os.scandir",
        "sys._getframe",
        "time.sleep",
    }
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def denied(what: str) -> PermissionError:
    """The error raised for a refused operation."""
    return PermissionError(f"sandbox: {what} is not allowed")


def install(root: str) -> None:
    """Installs the audit hook of a worker whose private writable directory is ``root``.

    Args:
      root: the only directory under which files may be created, changed or removed.
    """
    root = os.path.realpath(root)
    prefix = root + os.sep
    own_pid = os.getpid()
    realpath, isdir, fsdecode = os.path.realpath, os.path.isdir, os.fsdecode

    def resolve(path):
        return realpath(fsdecode(path))

    def inside(real: str) -> bool:
        return real == root or real.startswith(prefix)

    def other_process(real: str) -> bool:
        parts = real.split(os.sep)
        return (
            len(parts) > 2
            and parts[1] == "proc"
            and parts[2].isdigit()
            and int(parts[2]) != own_pid
        )

    def check_open(args):
        path, mode, flags = args
        if isinstance(path, int):
            return
        real = resolve(path)
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(
            isinstance(flags, int) and flags & _WRITE_FLAGS
        )
        if writing and not inside(real):
            raise denied(f"writing to {fsdecode(path)!r} (outside the sandbox directory)")
        if other_process(real):
            raise denied(f"reading files of other processes ({fsdecode(path)!r})")
        if isdir(real):
            raise denied(f"opening directories as files ({fsdecode(path)!r})")

    def check_paths(event, args):
        positions, dir_fds = _PATH_EVENTS[event]
        for i in dir_fds:
            if i < len(args) and args[i] is not None and args[i] != -1:
                raise denied(f"{event} relative to a directory descriptor")
        for i in positions:
            if i < len(args) and not isinstance(args[i], int) and not inside(resolve(args[i])):
                raise denied(f"{event} on {fsdecode(args[i])!r} (outside the sandbox directory)")

    def hook(event, args):
        if event in _HARMLESS:
            return
        if event == "open":
            check_open(args)
        elif event in _PATH_EVENTS:
            check_paths(event, args)
        elif event.startswith(_PREFIXES):
            for start, what in _DENIED_PREFIXES.items():
                if event.startswith(start):
                    raise denied(f"{what} ({event})")
        elif event == "os.kill":
            if args[0] != own_pid:
                raise denied("signalling other processes (os.kill)")
        elif event == "sqlite3.connect":
            database = args[0]
            if not isinstance(database, (str, bytes, os.PathLike)):
                return
            name = fsdecode(database)
            if name != ":memory:" and "mode=memory" not in name and not inside(resolve(name)):
                raise denied(f"opening database {name!r} (outside the sandbox directory)")

    sys.addaudithook(hook)
