"""Snapshot and restore of interpreter state in a sandbox worker, so one source cannot affect the next.

After every call the worker restores the standard streams, ``sys`` settings (trace, recursion
limit, path ...), the environment, the working directory (emptied) and interval timers, and
the builtins when the call's source could have patched them (`may_patch_modules`). When the
source changes it always restores the builtins, warning filters and decimal context; signal
handlers when a source since the last change named a module that can install them; and, when
a source since the last change could patch modules, the namespaces of all modules loaded at
start-up, unloading the modules imported later. The syntactic tests catch ordinary patching
(attribute assignment, setattr, globals, sys, builtins, dunder attributes ...); deliberately
obfuscated code can get past them, and a module it patches stays patched in that worker
until a flagged source runs or the worker is replaced.
"""

import ast
import builtins
import gc
import os
import signal
import sys
import warnings
from typing import Any

_SYS_ATTRS = (
    "stdin",
    "stdout",
    "stderr",
    "displayhook",
    "excepthook",
    "unraisablehook",
    "breakpointhook",
)
_PATCH_NAMES = frozenset(
    {
        "__builtins__",
        "__import__",
        "builtins",
        "compile",
        "copyreg",
        "ctypes",
        "delattr",
        "eval",
        "exec",
        "gc",
        "getattr",
        "globals",
        "importlib",
        "inspect",
        "locals",
        "marshal",
        "pickle",
        "setattr",
        "sys",
        "types",
        "vars",
    }
)
_TIMERS = tuple(
    getattr(signal, name)
    for name in ("ITIMER_REAL", "ITIMER_VIRTUAL", "ITIMER_PROF")
    if hasattr(signal, name)
)


def may_patch_modules(tree: ast.AST) -> bool:
    """Whether code could change state shared with later sources (a conservative syntactic test).

    True when the code assigns or deletes an attribute, names a dunder attribute or a function
    or module that reaches other namespaces (``setattr``, ``globals``, ``sys``, ``builtins``
    ...), or holds such a name as a string constant.
    """
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if not isinstance(node.ctx, ast.Load) or _is_dunder(node.attr):
                return True
        elif isinstance(node, ast.Name):
            if node.id in _PATCH_NAMES or _is_dunder(node.id):
                return True
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            if any(m.split(".")[0] in _PATCH_NAMES for m in modules):
                return True
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in _PATCH_NAMES or _is_dunder(node.value):
                return True
    return False


def may_touch_signals(source: str) -> bool:
    """Whether code could install signal handlers (it names a module that can)."""
    return any(word in source for word in ("signal", "faulthandler", "asyncio"))


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__") and name != "__name__"


class ProcessState:
    """The interpreter state of a worker as it was before any untrusted code ran."""

    def __init__(self, work_dir: str):
        self.work_dir = work_dir
        self.builtins = dict(builtins.__dict__)
        self.sys_attrs = {name: getattr(sys, name) for name in _SYS_ATTRS}
        self.sys_path = list(sys.path)
        self.sys_meta_path = list(sys.meta_path)
        self.recursion_limit = sys.getrecursionlimit()
        self.int_digits = sys.get_int_max_str_digits()
        self.environ = dict(os.environ)
        self._environ_data = dict(os.environ._data)
        self._work_mtime = os.stat(work_dir).st_mtime_ns
        self.signals = {s: signal.getsignal(s) for s in signal.valid_signals()}
        self.signals = {s: h for s, h in self.signals.items() if h is not None}
        self.warning_filters = list(warnings.filters)
        self.modules: dict[str, Any] = {}
        self.main_module = sys.modules.get("__main__")
        self.add_new_modules()
        decimal = sys.modules.get("decimal")
        self.decimal_context = decimal.getcontext().copy() if decimal else None

    def add_new_modules(self) -> None:
        """Adds modules loaded since the snapshot (by the worker itself) to the snapshot."""
        for name, module in list(sys.modules.items()):
            if name not in self.modules and module is not None:
                self.modules[name] = (module, dict(getattr(module, "__dict__", {})))

    @property
    def builtins_dict(self) -> dict[str, Any]:
        """The namespace of the builtins module (restored after every call)."""
        return builtins.__dict__

    def restore_builtins(self) -> None:
        """Puts back every builtin a call replaced, added or removed.

        Unconditionally (a few microseconds): a check would call builtins the call may have
        replaced (``len``, ``any``) and could be told that nothing changed.
        """
        live = builtins.__dict__
        live.clear()
        live.update(self.builtins)

    def after_call(self, *, tracing: bool, patched: bool) -> None:
        """Undoes what a call may have changed in process-wide state (cheap; every call).

        Args:
          tracing: coverage measurement is on (its trace function stays).
          patched: the call's source may patch shared namespaces (`may_patch_modules`); only
            then are the builtins checked here (they are always checked by `after_source`).
        """
        if patched:
            self.restore_builtins()
        for name, value in self.sys_attrs.items():
            if getattr(sys, name, None) is not value:
                setattr(sys, name, value)
        if not tracing and sys.gettrace() is not None:
            sys.settrace(None)
        if sys.getprofile() is not None:
            sys.setprofile(None)
        if sys.getrecursionlimit() != self.recursion_limit:
            sys.setrecursionlimit(self.recursion_limit)
        if sys.get_int_max_str_digits() != self.int_digits:
            sys.set_int_max_str_digits(self.int_digits)
        if sys.path != self.sys_path:
            sys.path[:] = self.sys_path
        if sys.meta_path != self.sys_meta_path:
            sys.meta_path[:] = self.sys_meta_path
        if os.environ._data != self._environ_data:
            os.environ.clear()
            os.environ.update(self.environ)
        for timer in _TIMERS:
            signal.setitimer(timer, 0)
        if os.getcwd() != self.work_dir:
            os.chdir(self.work_dir)
        if os.stat(self.work_dir).st_mtime_ns != self._work_mtime:
            try:
                self._empty_work_dir()
            except OSError:
                gc.collect()  # Files left open by the call (EMFILE) are closed by collection.
                self._empty_work_dir()

    def _empty_work_dir(self) -> None:
        with os.scandir(self.work_dir) as entries:
            names = [e.path for e in entries]
        for path in names:
            _remove_tree(path)
        self._work_mtime = os.stat(self.work_dir).st_mtime_ns

    def after_source(self, *, patched: bool, signals: bool) -> None:
        """Undoes what a source may have changed before a different source runs.

        Args:
          patched: whether sources run since the last call of this method may have patched
            module namespaces (`may_patch_modules`).
          signals: whether they may have installed signal handlers (`may_touch_signals`).
        """
        self.restore_builtins()
        if signals or patched:
            for sig, handler in self.signals.items():
                if signal.getsignal(sig) is not handler:
                    signal.signal(sig, handler)
        if warnings.filters != self.warning_filters:
            warnings.filters[:] = self.warning_filters
            warnings._filters_mutated()
        decimal = sys.modules.get("decimal")
        if decimal is not None and self.decimal_context is not None:
            decimal.setcontext(self.decimal_context.copy())
        if not patched:
            return
        for name in [n for n in sys.modules if n not in self.modules]:
            del sys.modules[name]
        for name, (module, saved) in self.modules.items():
            if sys.modules.get(name) is not module:
                sys.modules[name] = module
            if module is builtins or module is sys or module is self.main_module:
                continue
            live = getattr(module, "__dict__", None)
            if live is None:
                continue
            if len(live) != len(saved) or any(live.get(k, live) is not v for k, v in saved.items()):
                live.clear()
                live.update(saved)


def _remove_tree(path: str) -> None:
    """Removes a file or directory tree without opening directories as files."""
    if os.path.isdir(path) and not os.path.islink(path):
        with os.scandir(path) as entries:
            children = [e.path for e in entries]
        for child in children:
            _remove_tree(child)
        os.rmdir(path)
    else:
        os.remove(path)
