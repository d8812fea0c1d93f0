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
import stat
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
    "gc.get_": "reading the interpreter's object graph",
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

    Args:
      root: the only directory under which files may be created, changed or removed.
    """
    sys.addaudithook(_hook(os.path.realpath(root), os.getpid()))


def _real_path(text, entry, sep, getcwd, lstat, islink, readlink, os_error):
    """The path as the kernel will see it, from C functions only (never ``os.path``).

    Symbolic links are followed (for an entry event all but the last component), "." and
    ".." applied. Every function it calls is an argument and it reads no global name, so
    nothing sandboxed code rewrites changes what it answers; the hook refuses any change to
    its code or defaults.
    """
    pending = (text if text.startswith(sep) else getcwd() + sep + text).split(sep)
    last = ""
    if entry:
        while pending and pending[-1] in ("", "."):
            pending.pop()
        if pending and pending[-1] != "..":
            last = pending.pop()
    pending.reverse()
    resolved, links = "", 0
    while pending:
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":
            resolved = resolved.rpartition(sep)[0]
            continue
        candidate = resolved + sep + name
        try:
            target = (
                readlink(candidate) if links < 40 and islink(lstat(candidate).st_mode) else None
            )
        except os_error:
            target = None
        if target is None:
            resolved = candidate
            continue
        links += 1
        parts = target.split(sep)
        if parts[0] == "":
            resolved = ""
        parts.reverse()
        pending.extend(parts)
    return (resolved + sep + last) if last else (resolved or sep)


def _hook(root: str, own_pid: int):
    """The hook function, closed over immutable values and functions written in C only.

    Sandboxed code may rewrite anything written in Python: this module (through
    ``sys.modules``), ``builtins``, ``os.path``. So the hook looks up no name at call time
    (every builtin and ``os`` function it calls is bound here) and resolves paths with
    ``_real_path``, bound here too. A frame of the hook (a refused operation's traceback
    leads to one) shows strings, numbers, frozensets, tuples, C functions and
    ``_real_path``, none of which can be changed (a new ``__code__`` or defaults for
    ``_real_path`` is refused). The closure's cells are reachable only through the hook
    function itself, which nothing sandboxed can name: reading the interpreter's object
    graph (``gc.get_objects`` and the like) is refused. A path object other than
    ``str``/``bytes`` is read once more through its ``__fspath__``; one that answers
    differently on each call can mislead this layer (the read-only mounts still hold).
    """
    sep, prefix, pid_text = os.sep, root + os.sep, str(own_pid)
    resolve_args = (sep, os.getcwd, os.lstat, stat.S_ISLNK, os.readlink, OSError)
    real_path, stat_path, isdir, fspath = _real_path, os.stat, stat.S_ISDIR, os.fspath
    kind, subclass, length, integer, os_error = type, issubclass, len, int, OSError
    refuse, text_type, bytes_type, strings = PermissionError, str, bytes, (str, bytes)
    encoding, errors = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
    denied_prefixes, prefixes = tuple(_DENIED_PREFIXES.items()), tuple(_DENIED_PREFIXES)
    path_events = tuple((event, pos, fds) for event, (pos, fds) in _PATH_EVENTS.items())
    path_event_names, harmless = frozenset(_PATH_EVENTS), frozenset(_HARMLESS)
    entry_events, write_flags, write_modes = _ENTRY_EVENTS, _WRITE_FLAGS, frozenset("wax+")
    sealed = frozenset({"__code__", "__defaults__", "__kwdefaults__"})

    def hook(event, args):
        if event in harmless:
            return
        if event == "object.__setattr__":
            if args[0] is real_path and args[1] in sealed:
                raise refuse("sandbox: changing the sandbox's own functions is not allowed")
            return
        targets, opening, writing = (), False, True
        if event == "open":
            path, mode, flags = args
            if subclass(kind(path), integer):
                return
            writing = (kind(mode) is text_type and not write_modes.isdisjoint(mode)) or (
                subclass(kind(flags), integer) and flags & write_flags != 0
            )
            targets, opening = ((path, False, "open"),), True
        elif event in path_event_names:
            for row in path_events:
                if row[0] == event:
                    positions, dir_fds = row[1], row[2]
            for i in dir_fds:
                if i < length(args) and args[i] is not None and args[i] != -1:
                    raise refuse(
                        f"sandbox: {event} relative to a directory descriptor is not allowed"
                    )
            for i in positions:
                if i < length(args) and not subclass(kind(args[i]), integer):
                    targets += ((args[i], event in entry_events, event),)
        elif event.startswith(prefixes):
            for start, what in denied_prefixes:
                if event.startswith(start):
                    raise refuse(f"sandbox: {what} ({event}) is not allowed")
        elif event == "os.kill":
            if args[0] != own_pid:
                raise refuse("sandbox: signalling other processes (os.kill) is not allowed")
        elif event == "sqlite3.connect":
            targets = ((args[0], False, "opening database"),)
        for path, entry, what in targets:
            text = path if subclass(kind(path), strings) else fspath(path)
            if kind(text) is bytes_type:
                text = text.decode(encoding, errors)
            if kind(text) is not text_type:
                return
            if what == "opening database" and (text in (":memory:", "") or "mode=memory" in text):
                continue
            real = real_path(text, entry, *resolve_args)
            if writing and real != root and not real.startswith(prefix):
                action = f"writing to {text!r}" if opening else f"{what} on {text!r}"
                raise refuse(f"sandbox: {action} (outside the sandbox directory) is not allowed")
            if not opening:
                continue
            parts = real.split(sep)
            if (
                length(parts) > 2
                and parts[1] == "proc"
                and parts[2].isdigit()
                and parts[2] != pid_text
            ):
                raise refuse(f"sandbox: reading files of other processes ({text!r}) is not allowed")
            try:
                directory = isdir(stat_path(real).st_mode)
            except os_error:
                directory = False
            if directory:
                raise refuse(f"sandbox: opening directories as files ({text!r}) is not allowed")

    return hook
