"""Python audit hook that refuses network, process, native-code and out-of-sandbox file operations.

The hook is installed once in a worker process (it cannot be removed) and works from private
copies of its settings, which rewriting this module does not reach. Refused operations raise
``PermissionError("sandbox: <what> is not allowed")``; hooks added by sandboxed code are
refused too (CPython then drops them without an error). ``ctypes`` may be imported, but every
ctypes operation that raises an audit event (loading libraries, calling functions, reading
addresses) is refused. The hook is one layer of the sandbox; the OS layers (namespaces,
read-only mounts, user switch, resource limits) apply even to code that gets past it.
"""

import os
import signal
import sys
import types

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
# Events that act on a directory entry itself, never on what a symbolic link there points to:
# only the directory holding the entry is resolved (a link inside may point anywhere).
_ENTRY_EVENTS = frozenset(
    {"os.remove", "os.rmdir", "os.mkdir", "os.rename", "os.link", "os.symlink"}
)
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


def _refuse(what: str):
    def refused(*args, **kwargs):
        raise denied(what)

    return refused


def restrict_modules() -> None:
    """Adjusts standard modules to what the hook can check; call before the state snapshot.

    * ``shutil.rmtree`` (and so ``tempfile.TemporaryDirectory``) walks paths instead of
      directory descriptors: the ``open`` audit event does not carry ``dir_fd``, so the hook
      refuses to open directories, and every path removed is checked on its own.
    * ``signal.pidfd_send_signal`` and ``os.pidfd_open`` raise no audit event; they are
      replaced by functions that refuse, like ``os.kill`` of another process.
    """
    import _signal
    import posix
    import shutil

    shutil._use_fd_functions = False
    shutil.rmtree.avoids_symlink_attacks = False
    stub = _refuse("signalling other processes (signal.pidfd_send_signal)")
    for module in (_signal, signal):
        if hasattr(module, "pidfd_send_signal"):
            module.pidfd_send_signal = stub
    stub = _refuse("signalling other processes (os.pidfd_open)")
    for module in (posix, os):
        if hasattr(module, "pidfd_open"):
            module.pidfd_open = stub


def install(root: str) -> None:
    """Installs the audit hook of a worker whose private writable directory is ``root``.

    The hook reads its settings from private copies made here, never from this module's
    globals, so rewriting the module (through ``sys.modules``) changes nothing.

    Args:
      root: the only directory under which files may be created, changed or removed.
    """
    root = os.path.realpath(root)
    prefix = root + os.sep
    own_pid = os.getpid()
    realpath, isdir, fsdecode = os.path.realpath, os.path.isdir, os.fsdecode
    denied_prefixes = tuple(_DENIED_PREFIXES.items())
    prefixes = tuple(_DENIED_PREFIXES)
    path_events = types.MappingProxyType(dict(_PATH_EVENTS))
    harmless = frozenset(_HARMLESS)
    write_flags, refuse, sep, pathlike = _WRITE_FLAGS, denied, os.sep, os.PathLike
    split, join, entry_events = os.path.split, os.path.join, _ENTRY_EVENTS

    def resolve(path):
        return realpath(fsdecode(path))

    def resolve_entry(path):
        text = fsdecode(path)
        head, tail = split(text.rstrip(sep) or text)
        if tail in ("", ".", ".."):
            return resolve(text)
        return join(realpath(head or "."), tail)

    def inside(real: str) -> bool:
        return real == root or real.startswith(prefix)

    def other_process(real: str) -> bool:
        parts = real.split(sep)
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
            isinstance(flags, int) and flags & write_flags
        )
        if writing and not inside(real):
            raise refuse(f"writing to {fsdecode(path)!r} (outside the sandbox directory)")
        if other_process(real):
            raise refuse(f"reading files of other processes ({fsdecode(path)!r})")
        if isdir(real):
            raise refuse(f"opening directories as files ({fsdecode(path)!r})")

    def check_paths(event, args):
        positions, dir_fds = path_events[event]
        for i in dir_fds:
            if i < len(args) and args[i] is not None and args[i] != -1:
                raise refuse(f"{event} relative to a directory descriptor")
        resolver = resolve_entry if event in entry_events else resolve
        for i in positions:
            if i < len(args) and not isinstance(args[i], int) and not inside(resolver(args[i])):
                raise refuse(f"{event} on {fsdecode(args[i])!r} (outside the sandbox directory)")

    def hook(event, args):
        if event in harmless:
            return
        if event == "open":
            check_open(args)
        elif event in path_events:
            check_paths(event, args)
        elif event.startswith(prefixes):
            for start, what in denied_prefixes:
                if event.startswith(start):
                    raise refuse(f"{what} ({event})")
        elif event == "os.kill":
            if args[0] != own_pid:
                raise refuse("signalling other processes (os.kill)")
        elif event == "sqlite3.connect":
            database = args[0]
            if not isinstance(database, (str, bytes, pathlike)):
                return
            name = fsdecode(database)
            if name != ":memory:" and "mode=memory" not in name and not inside(resolve(name)):
                raise refuse(f"opening database {name!r} (outside the sandbox directory)")

    sys.addaudithook(hook)
