"""The parent's handle on one sandbox worker process: start, framed pipe I/O with deadlines, kill."""

import json
import math
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import pau_jax
from pau_jax.sandbox.config import SandboxConfig
from pau_jax.sandbox.uids import UidClaim

# Runs in a fresh interpreter: puts pau_jax on the path and hands over to the worker loop.
_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from pau_jax.sandbox import worker; worker.main(sys.argv[2:])"
)
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(pau_jax.__file__)))
_READ_SIZE = 1 << 16
_PREFIX = "pau_sandbox_"


def _owner_prefix() -> str:
    """``pau_sandbox_<pid namespace>_``: pids are only comparable within one pid namespace."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return f"{_PREFIX}{namespace}_"


def remove_stale_directories() -> list[str]:
    """Removes worker directories left by parents that died without closing their executor.

    Worker directories are named ``pau_sandbox_<pid namespace>_<parent pid>_*`` in the
    temporary directory; those of this pid namespace whose parent no longer runs are removed.

    Returns:
      The directories removed.
    """
    removed = []
    base = tempfile.gettempdir()
    prefix = _owner_prefix()
    for name in os.listdir(base):
        if not name.startswith(prefix):
            continue
        pid = name[len(prefix) :].split("_", 1)[0]
        if not pid.isdigit() or _running(int(pid)):
            continue
        path = os.path.join(base, name)
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            removed.append(path)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def readable(workers: list["WorkerProcess"], timeout: float | None) -> list["WorkerProcess"]:
    """The workers with something to read, waiting at most ``timeout`` seconds (poll(2))."""
    poller = select.poll()
    by_fd = {}
    for worker in workers:
        by_fd[worker.reply_fd] = worker
        poller.register(worker.reply_fd, select.POLLIN)
    events = poller.poll(None if timeout is None else math.ceil(timeout * 1000))
    return [by_fd[fd] for fd, _ in events]


class WorkerLost(Exception):
    """The worker died, stopped reading, or broke the message protocol."""


class WorkerProcess:
    """One worker process, started from a fresh interpreter (never forked from this process).

    Messages are JSON in the framing of `multiprocessing.connection.Connection` (a 4-byte
    big-endian length, or -1 and an 8-byte length). The parent reads and writes the raw pipe
    ends itself so that no read or write can block past a deadline, whatever the worker sends.
    """

    def __init__(self, config: SandboxConfig, config_text: str, uid_claim: UidClaim | None = None):
        self.uid_claim = uid_claim  # Released once the process is reaped (`kill`).
        self.origin: str | None = None  # Whose sources it has run (see `Executor.call_many`).
        self.root = tempfile.mkdtemp(prefix=f"{_owner_prefix()}{os.getpid()}_")
        request_r, request_w = os.pipe()
        reply_r, reply_w = os.pipe()
        env = {
            "PYTHONHASHSEED": str(config.hash_seed),
            "PATH": os.defpath,
            "LC_ALL": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            # Numerical libraries must not start threads (the worker may not create any).
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        command = [config.python or sys.executable, "-s", "-B", "-P", "-c", _BOOT]
        command += [_PACKAGE_PARENT, self.root, str(request_r), str(reply_w), config_text]
        self.log_path = os.path.join(self.root, "worker.log")
        try:
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    pass_fds=(request_r, reply_w),
                    env=env,
                    cwd=self.root,
                    start_new_session=True,
                )
        except BaseException:
            for fd in (request_w, reply_r):
                os.close(fd)
            shutil.rmtree(self.root, ignore_errors=True)
            if uid_claim is not None:
                uid_claim.release()
            raise
        finally:
            os.close(request_r)
            os.close(reply_w)
        os.set_blocking(request_w, False)
        self.request_fd = request_w
        self.reply_fd = reply_r
        self._buffer = bytearray()
        self._lock = threading.Lock()
        self.started = time.monotonic()
        self.ready = False
        self.info: dict[str, Any] = {}
        self.calls = 0
        self.cpu_s = 0.0

    def fileno(self) -> int:
        """The descriptor to wait on for replies."""
        return self.reply_fd

    def has_input(self) -> bool:
        """Whether bytes (or end of file) wait to be read, or part of a message is buffered."""
        if self._buffer:
            return True
        if self.reply_fd < 0:
            return False
        return bool(select.select([self.reply_fd], [], [], 0)[0])

    def send(self, message: dict[str, Any], deadline: float) -> None:
        """Writes one message, giving up (WorkerLost) at ``deadline`` (time.monotonic())."""
        body = json.dumps(message).encode("utf-8")
        header = (
            struct.pack("!i", len(body))
            if len(body) < 0x7FFFFFFF
            else struct.pack("!iQ", -1, len(body))
        )
        view = memoryview(header + body)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([], [self.request_fd], [], remaining)[1]:
                raise WorkerLost("stopped reading requests")
            try:
                written = os.write(self.request_fd, view)
            except BlockingIOError:
                continue
            except OSError as exc:
                raise WorkerLost(self.exit_reason()) from exc
            view = view[written:]

    def receive(self, max_bytes: int) -> list[dict[str, Any]]:
        """Reads what is available (call when the descriptor is readable); returns whole messages.

        Raises:
          WorkerLost: end of file, or a malformed or oversized message.
        """
        try:
            data = os.read(self.reply_fd, _READ_SIZE)
        except OSError as exc:
            raise WorkerLost(self.exit_reason()) from exc
        if not data:
            raise WorkerLost(self.exit_reason())
        self._buffer += data
        messages = []
        while len(self._buffer) >= 4:
            (size,) = struct.unpack_from("!i", self._buffer)
            start = 4
            if size == -1:
                if len(self._buffer) < 12:
                    break
                (size,) = struct.unpack_from("!Q", self._buffer, 4)
                start = 12
            if size < 0 or size > max_bytes:
                raise WorkerLost(f"sent a message of {size} bytes (limit {max_bytes})")
            if len(self._buffer) < start + size:
                break
            body = bytes(self._buffer[start : start + size])
            del self._buffer[: start + size]
            try:
                message = json.loads(body)
            except ValueError as exc:
                raise WorkerLost(f"sent a malformed message ({exc})") from None
            if not isinstance(message, dict):
                raise WorkerLost("sent a malformed message")
            messages.append(message)
        return messages

    def exit_reason(self) -> str:
        """How the (dead) worker ended, for error messages."""
        try:
            code = self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
            extra = " (CPU time limit)" if -code == signal.SIGXCPU else ""
            return f"was killed by signal {name}{extra}"
        tail = self.log_tail()
        return f"exited with code {code}" + (f" ({tail})" if tail else "")

    def log_tail(self) -> str:
        """The last line the worker wrote to its stderr."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 2000))
                lines = f.read().decode("utf-8", "replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1] if lines else ""

    def stop(self) -> None:
        """Sends SIGKILL to the worker's process group (safe from any thread)."""
        if self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()

    def kill(self) -> None:
        """Stops the worker, reaps it, closes the pipes and removes its directory.

        Only the thread using the worker (or the owner of an idle one) may call this.
        """
        with self._lock:
            self.stop()
            self.proc.wait()
            if self.request_fd >= 0:
                os.close(self.request_fd)
                os.close(self.reply_fd)
                self.request_fd = self.reply_fd = -1
            shutil.rmtree(self.root, ignore_errors=True)
            if self.uid_claim is not None:
                self.uid_claim.release()
