"""Sandbox worker process: runs untrusted functions call by call and reports typed results.

Started by `worker_process.WorkerProcess` as ``python -s -B -P -c <boot> ROOT FD_IN FD_OUT CONFIG`` in
a fresh interpreter (never forked), in its own session, with a scrubbed environment. Messages
are JSON over two pipes (`multiprocessing.connection.Connection` framing):

* parent -> worker: ``{"op": "run", "key", "source", "entry", "ids": [call id, ...],
  "args": [encoded tuple, ...], "coverage": bool}``, ``{"op": "sync", "id"}`` after the
  replies of a run, or ``{"op": "exit"}``;
* worker -> parent: ``{"op": "ready", "pid", "isolation"}`` once (or ``{"op": "failed",
  "error"}``), then one result per call: ``{"id", "ok", "value", "display", "error_type",
  "error_message", "stdout", "stderr", "lines", "arcs", "cpu_s"}``, and ``{"op": "synced",
  "id"}`` per sync. The parent checks the ids (`dispatch`): code that writes to the reply
  pipe itself breaks the worker instead of answering a call.
"""

import ast
import collections
import importlib
import io
import json
import os
import resource
import sys
from multiprocessing.connection import Connection
from typing import Any

from pau_jax.sandbox import guard, isolation, process_state, values

_CACHE_SIZE = 256
_MAX_MESSAGE_CHARS = 4000
_COVERAGE_RENEW_CALLS = 2000


class _Capture(io.TextIOBase):
    """A text stream that keeps the first ``limit`` characters written to it."""

    def __init__(self, limit: int):
        super().__init__()
        self.parts: list[str] = []
        self.size = 0
        self.dropped = 0
        self.limit = limit

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        room = self.limit - self.size
        if room > 0:
            piece = text[:room]
            self.parts.append(piece)
            self.size += len(piece)
        self.dropped += max(0, len(text) - max(room, 0))
        return len(text)

    def value(self) -> str:
        text = "".join(self.parts)
        if self.dropped:
            text += f"\n[{self.dropped} more characters dropped]"
        return text


class _Compiled:
    def __init__(self, code: Any, filename: str, patches: bool, error: tuple[str, str] | None):
        self.code = code
        self.filename = filename
        self.patches = patches
        self.error = error
        self.uses_random = False
        self.touches_signals = False


class _Runner:
    """Compiles sources (cached by content hash) and runs calls with state restored after each."""

    def __init__(self, root: str, config: dict[str, Any], parent_pid: int):
        self.root = os.path.realpath(root)
        self.src_dir = os.path.join(self.root, "src")
        self.work_dir = os.path.join(self.root, "work")
        self.config = config
        for directory in (self.src_dir, self.work_dir):
            os.makedirs(directory, exist_ok=True)
        for name in config["preload_modules"]:
            importlib.import_module(name)
        self.isolation = isolation.confine(self.root, config, parent_pid)
        os.chdir(self.work_dir)
        os.environ.update({"TMPDIR": self.work_dir, "HOME": self.work_dir})
        guard.restrict_modules()
        self.state = process_state.ProcessState(self.work_dir)
        self.cache: collections.OrderedDict[str, _Compiled] = collections.OrderedDict()
        self.current_key: str | None = None
        self.patched = False
        self.signals_touched = False
        self.coverage: Any = None
        self.coverage_data: Any = None
        self.coverage_calls = 0
        self.random_state: Any = None
        guard.install(self.root)

    def compile(self, key: str, source: str) -> _Compiled:
        compiled = self.cache.get(key)
        if compiled is not None:
            self.cache.move_to_end(key)
            return compiled
        filename = os.path.join(self.src_dir, f"src_{key[:24]}.py")
        try:
            tree = ast.parse(source, filename)
            code = compile(tree, filename, "exec", dont_inherit=True)
            with open(filename, "w", encoding="utf-8") as f:
                f.write(source)
            compiled = _Compiled(code, filename, process_state.may_patch_modules(tree), None)
            compiled.uses_random = "random" in source
            compiled.touches_signals = process_state.may_touch_signals(source)
        except SyntaxError as exc:
            compiled = _Compiled(
                None, filename, False, (type(exc).__name__, f"{exc.msg} (line {exc.lineno})")
            )
        except (ValueError, MemoryError, RecursionError, OverflowError) as exc:
            compiled = _Compiled(None, filename, False, (type(exc).__name__, _message(exc)))
        self.cache[key] = compiled
        if len(self.cache) > _CACHE_SIZE:
            _, old = self.cache.popitem(last=False)
            if old.code is not None and os.path.exists(old.filename):
                os.remove(old.filename)
        return compiled

    def run_batch(self, request: dict[str, Any]):
        """Yields one encoded reply per call of the request."""
        key = request["key"]
        if self.current_key is not None and key != self.current_key:
            self.state.after_source(patched=self.patched, signals=self.signals_touched)
            self.patched = self.signals_touched = False
        self.current_key = key
        compiled = self.compile(key, request["source"])
        self.patched = self.patched or compiled.patches
        self.signals_touched = self.signals_touched or compiled.touches_signals
        measure = bool(request["coverage"]) and compiled.error is None
        cov = self._start_coverage() if measure else None
        try:
            for call_id, args_text in zip(request["ids"], request["args"], strict=True):
                reply = self.run_one(compiled, request["entry"], args_text, cov)
                reply["id"] = call_id
                yield json.dumps(reply).encode("utf-8")
        finally:
            if cov is not None:
                cov.stop()

    def run_one(self, compiled: _Compiled, entry: str, args_text: str, cov: Any) -> dict[str, Any]:
        reply: dict[str, Any] = {"ok": False, "value": None, "lines": None, "arcs": None}
        stdout, stderr = (
            _Capture(self.config["max_output_bytes"]),
            _Capture(self.config["max_output_bytes"]),
        )
        context = None
        try:
            if compiled.error is not None:
                reply["error_type"], reply["error_message"] = compiled.error
            else:
                args = values.decode(args_text)
                if compiled.uses_random:
                    self._seed_random()
                namespace = {"__name__": "__sandbox__", "__builtins__": self.state.builtins_dict}
                if cov is not None:
                    self.coverage_calls += 1
                    context = f"call{self.coverage_calls}"
                    cov.switch_context(context)
                sys.stdout, sys.stderr = stdout, stderr
                try:
                    exec(compiled.code, namespace)
                    function = namespace.get(entry)
                    if not callable(function):
                        raise NameError(f"the source defines no function named {entry!r}")
                    value = function(*args)
                    if compiled.patches:
                        self.state.restore_builtins()
                    self._fill_value(reply, value)
                finally:
                    sys.stdout, sys.stderr = (
                        self.state.sys_attrs["stdout"],
                        self.state.sys_attrs["stderr"],
                    )
                    if cov is not None:
                        cov.switch_context("")
        except BaseException as exc:  # noqa: BLE001 - every failure of untrusted code is a result.
            if compiled.patches:  # The reply is written with the worker's own builtins.
                self.state.restore_builtins()
            reply["ok"] = False
            reply["value"] = None
            reply["error_type"] = type(exc).__name__
            reply["error_message"] = _message(exc)
        finally:
            self.state.after_call(tracing=cov is not None, patched=compiled.patches)
        if context is not None:
            self.coverage_data.set_query_context(context)
            reply["lines"] = sorted(self.coverage_data.lines(compiled.filename) or [])
            reply["arcs"] = sorted(self.coverage_data.arcs(compiled.filename) or [])
        if not reply["ok"]:
            reply["display"] = values.display_error(reply["error_type"], reply["error_message"])
        reply["stdout"], reply["stderr"] = stdout.value(), stderr.value()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        reply["cpu_s"] = usage.ru_utime + usage.ru_stime
        return reply

    def _fill_value(self, reply: dict[str, Any], value: Any) -> None:
        limit = self.config["max_result_bytes"]
        try:
            encoded = values.encode(value, max_items=limit // 2)
        except values.EncodingError as exc:
            reply.update(error_type="ResultTooLarge", error_message=str(exc))
            return
        if len(encoded) > limit:
            reply.update(
                error_type="ResultTooLarge",
                error_message=f"the encoded result has {len(encoded)} characters; the limit is {limit}",
            )
            return
        reply.update(
            ok=True,
            value=encoded,
            display=values.display(value, max_chars=self.config["max_display_chars"]),
            error_type=None,
            error_message=None,
        )

    def _seed_random(self) -> None:
        seed = self.config["random_seed"]
        module = sys.modules.get("random")
        if seed is not None and module is not None:
            if self.random_state is None:
                module.seed(seed)
                self.random_state = module.getstate()
            module.setstate(self.random_state)

    def _start_coverage(self) -> Any:
        if self.coverage is None or self.coverage_calls >= _COVERAGE_RENEW_CALLS:
            coverage = importlib.import_module("coverage")  # First use: most workers never measure.
            self.coverage = coverage.Coverage(
                data_file=None,
                branch=True,
                config_file=False,
                include=[os.path.join(self.src_dir, "*")],
            )
            self.coverage_data = self.coverage.get_data()
            self.coverage_calls = 0
            self.state.add_new_modules()
        self.coverage.start()
        return self.coverage


def _message(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception as inner:  # noqa: BLE001 - a user __str__ may raise anything.
        text = f"<str() of the exception raised {type(inner).__name__}>"
    if len(text) > _MAX_MESSAGE_CHARS:
        text = text[:_MAX_MESSAGE_CHARS] + "..."
    return text


def main(argv: list[str]) -> None:
    """Entry point of a worker process (see the module docstring for the arguments)."""
    parent_pid = os.getppid()
    root, fd_in, fd_out, config_text = argv
    sys.argv = [""]
    receiver = Connection(int(fd_in), writable=False)
    sender = Connection(int(fd_out), readable=False)
    try:
        runner = _Runner(root, json.loads(config_text), parent_pid)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it.
        sender.send_bytes(
            json.dumps({"op": "failed", "error": f"{type(exc).__name__}: {exc}"}).encode()
        )
        return
    ready = {"op": "ready", "pid": os.getpid(), "isolation": runner.isolation}
    sender.send_bytes(json.dumps(ready).encode())
    while True:
        try:
            request = json.loads(receiver.recv_bytes())
        except EOFError:
            return
        if request.get("op") == "sync":
            sender.send_bytes(json.dumps({"op": "synced", "id": request["id"]}).encode())
        elif request.get("op") == "run":
            for reply in runner.run_batch(request):
                sender.send_bytes(reply)
        else:
            return
