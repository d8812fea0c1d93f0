"""Hostile code: each case ends in a typed error in time, the parent is unharmed and the pool goes on.

`HOSTILE` holds the refused programs (program, error type, part of the message), `ALLOWED` the
operations inside the worker's own directory that must keep working (program, value).
"""

import importlib.util
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from pau_jax.sandbox import Executor, SandboxConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]
SLACK_S = 8.0  # Start-up of a replacement worker and a busy machine.
BENIGN = "def test_func(x):\n    return [x, x * 2]\n"
PID = "import os\ndef test_func():\n    return os.getpid()\n"
SECRET_NAME = "PAU_SANDBOX_TEST_SECRET"
SECRET = "parent-secret-7f3a"
OTHER_UID = 4321  # A user that is neither root nor the sandbox user.
# readline.read_history_file reads a file in C without an audit event, so the audit hook does
# not see it: what it cannot read, the OS layers alone refused.
READ_BELOW_HOOK = (
    "import os, readline\n"
    "def test_func(path):\n"
    "    readline.clear_history()\n"
    "    readline.read_history_file(path.format(parent=os.getppid()))\n"
    "    n = readline.get_current_history_length()\n"
    "    return [readline.get_history_item(i + 1) for i in range(n)]\n"
)


def _assert_pool_still_works(pool):
    """Calls get their own results, and every worker answers (a replacement included)."""
    args = [(21 + i,) for i in range(2 * pool.workers)]
    for (x,), result in zip(args, pool.call_many(BENIGN, args, timeout_s=20.0)):
        assert result.ok and result.value == [x, 2 * x], result
    # Calls go to ready workers, so one started in place of a killed worker is seen only
    # once it is ready: ask until as many distinct workers have answered as the pool holds.
    pids, deadline = set(), time.monotonic() + 30.0
    while len(pids) < pool.workers and time.monotonic() < deadline:
        for result in pool.call_many(PID, [()] * pool.workers, timeout_s=20.0):
            assert result.ok, result
            pids.add(result.value)
        time.sleep(0.05)
    assert len(pids) >= pool.workers, pids


def _run(pool, source, timeout_s, args=()):
    start = time.monotonic()
    result = pool.call(source, args, timeout_s=timeout_s)
    elapsed = time.monotonic() - start
    assert elapsed < timeout_s + SLACK_S, (elapsed, result)
    assert not result.ok and result.value is None, result
    return result


# A whole reply in the worker's format, for the call in progress (its id, where calls carry
# one, read from the request that the worker's loop holds), sent over the reply pipe. OBJECTS
# is how the program looks for the request and the pipe; SEND, how it writes.
FORGE = (
    "import gc, json, os, struct, sys\n"
    "def reachable():\n"
    "    frame, found = sys._getframe(), []\n"
    "    while frame is not None:\n"
    "        found += list(frame.f_locals.values())\n"
    "        frame = frame.f_back\n"
    "    return found\n"
    "def test_func():\n"
    "    objects = OBJECTS\n"
    "    run = [o for o in objects if isinstance(o, dict) and o.get('op') == 'run'][-1]\n"
    "    reply = {'id': (run.get('ids') or [None])[-1], 'ok': True, 'value': '\"FORGED\"',\n"
    "             'display': 'F', 'error_type': None, 'error_message': None, 'stdout': '',\n"
    "             'stderr': '', 'lines': None, 'arcs': None, 'cpu_s': 0.0}\n"
    "    body = json.dumps(reply).encode()\n"
    "    SEND\n"
    "    return 'genuine'\n"
)
THROUGH_PIPE = (
    "for o in objects:\n"
    "        if type(o).__name__ == 'Connection' and o.writable:\n"
    "            o.send_bytes(body)"
)
THROUGH_FDS = (
    "for fd in range(3, 64):\n"
    "        try:\n"
    "            os.write(fd, struct.pack('!i', len(body)) + body)\n"
    "        except OSError:\n"
    "            pass"
)


def _forge(objects, send):
    return FORGE.replace("OBJECTS", objects).replace("SEND", send)


HOSTILE = {
    "infinite_loop": (
        "def test_func():\n    while True:\n        pass\n",
        "TimeoutError",
        "longer than",
    ),
    "sleep": ("import time\ndef test_func():\n    time.sleep(60)\n", "TimeoutError", "longer than"),
    "memory_bomb": ("def test_func():\n    return bytearray(16 * 1024**3)\n", "MemoryError", ""),
    "memory_growth": (
        "def test_func():\n    xs = []\n    while True:\n        xs.append(bytes(200 * 1024**2))\n",
        "MemoryError",
        "",
    ),
    "fork_bomb": (
        "import os\ndef test_func():\n    while True:\n        os.fork()\n",
        "PermissionError",
        "sandbox: starting processes (os.fork) is not allowed",
    ),
    "multiprocessing": (
        "import multiprocessing\ndef test_func():\n    p = multiprocessing.Process(target=print)\n    p.start()\n",
        "PermissionError",
        "sandbox: starting processes",
    ),
    "os_system": (
        "import os\ndef test_func():\n    return os.system('touch /tmp/pau_sandbox_pwned')\n",
        "PermissionError",
        "sandbox: starting processes (os.system) is not allowed",
    ),
    "subprocess": (
        "import subprocess\ndef test_func():\n    return subprocess.check_output(['id'])\n",
        "PermissionError",
        "sandbox: starting processes (subprocess.Popen) is not allowed",
    ),
    "exec_binary": (
        "import os\ndef test_func():\n    os.execv('/bin/true', ['true'])\n",
        "PermissionError",
        "sandbox: starting processes (os.exec) is not allowed",
    ),
    "thread": (
        "import threading\ndef test_func():\n    threading.Thread(target=print).start()\n",
        "RuntimeError",
        "can't start new thread",
    ),
    "sys_exit": ("import sys\ndef test_func():\n    sys.exit(3)\n", "SystemExit", "3"),
    "os_exit": (
        "import os\ndef test_func():\n    os._exit(7)\n",
        "WorkerCrashed",
        "exited with code 7",
    ),
    "ctypes_segfault": (
        "import ctypes\ndef test_func():\n    return ctypes.string_at(0)\n",
        "PermissionError",
        "sandbox: native code through ctypes",
    ),
    "segfault": (
        "import faulthandler\ndef test_func():\n    faulthandler._sigsegv()\n",
        "WorkerCrashed",
        "SIGSEGV",
    ),
    "self_kill": (
        "import os, signal\ndef test_func():\n    os.kill(os.getpid(), signal.SIGKILL)\n",
        "WorkerCrashed",
        "SIGKILL",
    ),
    "kill_parent": (
        "import os, signal\ndef test_func():\n    os.kill(os.getppid(), signal.SIGTERM)\n",
        "PermissionError",
        "signalling other processes",
    ),
    "kill_everything": (
        "import os, signal\ndef test_func():\n    os.kill(-1, signal.SIGKILL)\n",
        "PermissionError",
        "signalling other processes",
    ),
    "deep_recursion": (
        "def test_func(n=0):\n    return test_func(n + 1)\n",
        "RecursionError",
        "maximum recursion depth",
    ),
    "unbounded_recursion": (
        "import sys\ndef f(n):\n    return f(n + 1)\ndef test_func():\n    sys.setrecursionlimit(10**9)\n    return f(0)\n",
        "",
        "",
    ),
    "printing_without_end": (
        "def test_func():\n    while True:\n        print('spam' * 100)\n",
        "TimeoutError",
        "longer than",
    ),
    "ignores_sigterm": (
        "import signal\ndef test_func():\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n    signal.signal(signal.SIGINT, signal.SIG_IGN)\n    while True:\n        pass\n",
        "TimeoutError",
        "longer than",
    ),
    "write_outside": (
        "def test_func():\n    open('/tmp/pau_sandbox_pwned', 'w').write('x')\n",
        "PermissionError",
        "writing to '/tmp/pau_sandbox_pwned'",
    ),
    "write_via_dir_fd": (
        "import os\ndef test_func():\n    fd = os.open('/tmp', os.O_RDONLY)\n    os.open('pau_sandbox_pwned', os.O_CREAT | os.O_WRONLY, dir_fd=fd)\n",
        "PermissionError",
        "opening directories",
    ),
    "remove_outside": (
        "import shutil\ndef test_func():\n    shutil.rmtree('/tmp')\n",
        "PermissionError",
        "outside the sandbox directory",
    ),
    "rename_outside": (
        "import os\ndef test_func():\n    os.rename('/etc/hostname', 'x')\n",
        "PermissionError",
        "os.rename on '/etc/hostname'",
    ),
    "raise_limits": (
        "import resource\ndef test_func():\n    resource.setrlimit(resource.RLIMIT_AS, (-1, -1))\n",
        "PermissionError",
        "changing resource limits",
    ),
    "huge_file": (
        "def test_func():\n    with open('big.bin', 'wb') as f:\n        f.write(b'x' * (32 << 20))\n",
        "OSError",
        "File too large",
    ),
    "too_many_files": (
        "def test_func():\n    return [open(f'f{i}', 'w') for i in range(500)]\n",
        "OSError",
        "Too many open files",
    ),
    "forged_partial_reply": (
        "import os\ndef test_func():\n    for fd in range(3, 64):\n        try:\n"
        "            os.write(fd, b'\\x00\\x00\\x10\\x00{\"ok\": true')\n        except OSError:\n"
        "            pass\n    while True:\n        pass\n",
        "TimeoutError",
        "longer than",
    ),
    "oversized_reply": (
        "import os\ndef test_func():\n    for fd in range(3, 64):\n        try:\n"
        "            os.write(fd, b'\\x7f\\xff\\xff\\xf0garbage')\n        except OSError:\n"
        "            pass\n    return 1\n",
        "WorkerCrashed",
        "sent a message of",
    ),
    "closed_pipes": (
        "import os\ndef test_func():\n    for fd in range(3, 64):\n        try:\n"
        "            os.close(fd)\n        except OSError:\n            pass\n    return 1\n",
        "WorkerCrashed",
        "exited with code",
    ),
    "parent_environ": (
        "import os\ndef test_func():\n    return open(f'/proc/{os.getppid()}/environ').read()\n",
        "PermissionError",
        "reading files of other processes",
    ),
    "read_shadow": (
        "def test_func():\n    return open('/etc/shadow').read()\n",
        "PermissionError",
        "Permission denied: '/etc/shadow'",
    ),
    "read_shadow_below_audit_hook": (
        READ_BELOW_HOOK.replace("def test_func(path):", "def test_func(path='/etc/shadow'):"),
        "PermissionError",
        "Permission denied",
    ),
    # A forged reply is never a call's result (the pool check then asks every worker).
    "forged_reply_through_gc": (
        _forge("gc.get_objects()", THROUGH_PIPE),
        "PermissionError",
        "reading the interpreter's object graph",
    ),
    "forged_reply_through_frames": (
        _forge("reachable()", THROUGH_PIPE),
        "WorkerCrashed",
        "belongs to no call in progress",
    ),
    "forged_reply_through_fds": (
        _forge("reachable()", THROUGH_FDS),
        "WorkerCrashed",
        "belongs to no call in progress",
    ),
    # Emptying the guard's settings in its module's globals leaves the hook as it was.
    "guard_settings_rewritten_then_ctypes": (
        "import ctypes, sys\n"
        "def test_func():\n"
        "    settings = vars(sys.modules['pau_jax.sandbox.guard'])\n"
        "    for name, value in list(settings.items()):\n"
        "        private = name.startswith('_') and not name.startswith('__')\n"
        "        if private and isinstance(value, (dict, frozenset, tuple)):\n"
        "            settings[name] = type(value)()\n"
        "    events = ['ctypes.dlopen', 'ctypes.dlsym', 'ctypes.call_function']\n"
        "    settings['_HARMLESS'] = frozenset(events)\n"
        "    settings['denied'] = lambda what: None\n"
        "    return ctypes.CDLL('libc.so.6').getpid()\n",
        "PermissionError",
        "native code through ctypes",
    ),
    # pidfd functions raise no audit event: the sandbox refuses them, not only the kernel.
    "pidfd_signal_parent": (
        "import os, signal\n"
        "def test_func():\n"
        "    signal.pidfd_send_signal(os.pidfd_open(os.getppid()), 0)\n",
        "PermissionError",
        "signalling other processes",
    ),
    "pidfd_probe_every_process": (
        "import os, signal\n"
        "def test_func():\n"
        "    reached = []\n"
        "    for name in os.listdir('/proc'):\n"
        "        if name.isdigit() and int(name) != os.getpid():\n"
        "            try:\n"
        "                fd = os.pidfd_open(int(name))\n"
        "                try:\n"
        "                    signal.pidfd_send_signal(fd, 0)\n"
        "                    reached.append(int(name))\n"
        "                finally:\n"
        "                    os.close(fd)\n"
        "            except OSError as error:\n"
        "                if 'sandbox' in str(error):\n"
        "                    raise\n"
        "    return reached\n",
        "PermissionError",
        "signalling other processes",
    ),
    # Every other worker's folder (the pool's other worker at least) is closed to this one.
    "read_other_worker_folders": (
        "import os\n"
        "def test_func():\n"
        "    mine = os.path.dirname(os.getcwd())\n"
        "    base = os.path.dirname(mine)\n"
        "    listed, refused = [], []\n"
        "    for name in os.listdir(base):\n"
        "        path = os.path.join(base, name)\n"
        "        if name.startswith('pau_sandbox_') and path != mine:\n"
        "            try:\n"
        "                listed.append(os.listdir(path))\n"
        "            except PermissionError as error:\n"
        "                refused.append(error)\n"
        "    if listed or not refused:\n"
        "        return listed\n"
        "    raise refused[0]\n",
        "PermissionError",
        "Permission denied",
    ),
}
# Cases that need something of the machine: name -> (what, available).
NEEDS = {
    "read_shadow": ("/etc/shadow", os.path.exists("/etc/shadow")),
    "read_shadow_below_audit_hook": (
        "/etc/shadow and readline",
        os.path.exists("/etc/shadow") and importlib.util.find_spec("readline") is not None,
    ),
    "read_other_worker_folders": ("a root parent (one uid per worker)", os.geteuid() == 0),
}
# Operations inside the worker's own directory that must work: name -> (program, value).
ALLOWED = {
    "temporary_directory": (
        "import os, tempfile\n"
        "def test_func():\n"
        "    with tempfile.TemporaryDirectory() as name:\n"
        "        os.makedirs(os.path.join(name, 'a', 'b'))\n"
        "        open(os.path.join(name, 'a', 'b', 'f'), 'w').close()\n"
        "        inside = os.path.dirname(name) == os.getcwd()\n"
        "    return inside, os.path.exists(name), os.listdir('.')\n",
        (True, False, []),
    ),
    "rmtree_inside": (
        "import os, shutil\n"
        "def test_func():\n"
        "    os.makedirs('tree/sub')\n"
        "    os.symlink('/tmp', 'tree/sub/out')\n"
        "    open('tree/sub/f', 'w').close()\n"
        "    shutil.rmtree('tree')\n"
        "    return os.path.exists('tree'), os.listdir('.'), os.path.isdir('/tmp')\n",
        (False, [], True),
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_case(executor, name):
    source, error_type, message = HOSTILE[name]
    what, available = NEEDS.get(name, ("", True))
    if not available:
        pytest.skip(f"this machine lacks {what}")
    before = dict(os.environ), os.getcwd()
    result = _run(executor, source, timeout_s=1.5)
    if error_type:
        assert result.error_type == error_type, result
        assert message in result.error_message, result
    else:
        assert result.error_type in (
            "RecursionError",
            "MemoryError",
            "TimeoutError",
            "WorkerCrashed",
        ), result
    assert result.timed_out == (result.error_type == "TimeoutError")
    assert (dict(os.environ), os.getcwd()) == before
    assert not os.path.exists("/tmp/pau_sandbox_pwned")
    _assert_pool_still_works(executor)


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_allowed_case(executor, name):
    source, expected = ALLOWED[name]
    result = executor.call(source, (), timeout_s=20.0)
    assert result.ok and result.value == expected, result
    _assert_pool_still_works(executor)


REFERENCE_SECRET = "reference-secret-39c4"
REFERENCE = f"def test_func(x):\n    tag = {REFERENCE_SECRET!r}\n    return x + 1\n"
# Looks for a reference source in the worker's own files and in the compiled sources its
# frames reach; the secret comes reversed, so that this source does not hold it.
FIND_REFERENCE = (
    "import os, sys\n"
    "def constants(code):\n"
    "    for value in code.co_consts:\n"
    "        yield from constants(value) if hasattr(value, 'co_consts') else [repr(value)]\n"
    "def test_func(backwards):\n"
    "    secret, seen = backwards[::-1], []\n"
    "    for top, _, files in os.walk(os.path.dirname(os.getcwd())):\n"
    "        for name in files:\n"
    "            with open(os.path.join(top, name), errors='replace') as f:\n"
    "                seen.append(f.read())\n"
    "    frame = sys._getframe()\n"
    "    while frame is not None:\n"
    "        for value in list(frame.f_locals.values()):\n"
    "            cache = getattr(value, 'cache', None)\n"
    "            for compiled in list(cache.values()) if isinstance(cache, dict) else []:\n"
    "                if getattr(compiled, 'code', None) is not None:\n"
    "                    seen.extend(constants(compiled.code))\n"
    "        frame = frame.f_back\n"
    "    return any(secret in text for text in seen)\n"
)


def test_generated_code_never_finds_a_reference_source(executor):
    """A generated source runs only in workers that never held a task's (reference) source."""
    args = [(i,) for i in range(2 * executor.workers)]
    assert [r.value for r in executor.call_many(REFERENCE, args, timeout_s=20.0)] == [
        i + 1 for (i,) in args
    ]
    backwards = (REFERENCE_SECRET[::-1],)
    # The search works: the task's own code, in a worker that ran the reference, finds it.
    assert executor.call(FIND_REFERENCE, backwards, timeout_s=20.0, origin="task").value is True
    found = executor.call(FIND_REFERENCE, backwards, timeout_s=20.0, origin="generated")
    assert found.ok and found.value is False, found
    _assert_pool_still_works(executor)


def test_gigantic_output_is_cut(executor):
    result = executor.call(
        "def test_func():\n    print('x' * 10**8)\n    return 1\n", (), timeout_s=20.0
    )
    assert result.ok and result.value == 1
    assert result.stdout.startswith("x" * 4096) and len(result.stdout) < 4200


def test_socket_to_a_loopback_listener_never_connects(executor):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        port = server.getsockname()[1]
        attempts = [
            f"import socket\ndef test_func():\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n",
            f"import socket\ndef test_func():\n    s = socket.socket()\n    s.connect(('127.0.0.1', {port}))\n",
            f"import urllib.request\ndef test_func():\n    return urllib.request.urlopen('http://127.0.0.1:{port}/').read()\n",
        ]
        for source in attempts:
            result = _run(executor, source, timeout_s=3.0)
            assert (
                result.error_type == "PermissionError" and "network access" in result.error_message
            )
        with pytest.raises(socket.timeout):
            server.accept()
    _assert_pool_still_works(executor)


def test_worker_has_no_network_interface_up(executor):
    if not executor.isolation.get("network_namespace"):
        pytest.skip(f"network namespaces not permitted here: {executor.isolation}")
    source = (
        "def test_func():\n"
        "    lines = open('/proc/self/net/dev').read().splitlines()[2:]\n"
        "    return sorted(line.split(':')[0].strip() for line in lines)\n"
    )
    assert executor.call(source, (), timeout_s=20.0).value == ["lo"]
    operstate = "def test_func():\n    return open('/sys/class/net/lo/operstate').read().strip()\n"
    assert executor.call(operstate, (), timeout_s=20.0).value in ("down", "unknown")


def test_filesystem_is_read_only_outside_the_worker_directory(executor):
    if not executor.isolation.get("read_only_filesystem"):
        pytest.skip(f"mount namespaces not permitted here: {executor.isolation}")
    source = (
        "import os\n"
        "def test_func():\n"
        "    for line in open('/proc/self/mountinfo'):\n"
        "        fields = line.split()\n"
        "        if fields[4] == '/':\n"
        "            return fields[5].split(',')[0]\n"
    )
    assert executor.call(source, (), timeout_s=20.0).value == "ro"


def test_workers_run_unprivileged_when_started_as_root(executor):
    if os.geteuid() != 0:
        pytest.skip("the parent is not root")
    result = executor.call(
        "import os\ndef test_func():\n    return os.getuid(), os.geteuid()\n", (), timeout_s=20.0
    )
    first, stop = SandboxConfig().worker_uids
    uid, euid = result.value
    assert uid == euid and first <= uid < stop, result.value


def _capability_report(pool):
    source = (
        "def test_func():\n"
        "    fields = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "    names = ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs')\n"
        "    return {name: int(fields[name].strip(), 16) for name in names}\n"
    )
    result = pool.call(source, (), timeout_s=20.0)
    assert result.ok, result
    return result.value


def test_workers_hold_no_capabilities(executor):
    status = _capability_report(executor)
    assert status["NoNewPrivs"] == 1
    assert {k: status[k] for k in ("CapInh", "CapPrm", "CapEff", "CapAmb")} == dict.fromkeys(
        ("CapInh", "CapPrm", "CapEff", "CapAmb"), 0
    ), status
    assert executor.isolation["no_new_privs"]
    if os.geteuid() != 0:
        pytest.skip("the bounding set is dropped only by a root parent (CAP_SETPCAP)")
    assert status["CapBnd"] == 0, status
    assert executor.isolation["capabilities"] == dict.fromkeys(
        ("inheritable", "permitted", "effective", "bounding", "ambient"), 0
    )


@pytest.fixture(scope="module")
def other_user_files():
    """A readable directory holding files of another user: secret.txt (0600), public.txt (0644)."""
    if os.geteuid() != 0:
        pytest.skip("creating files owned by another user needs root")
    directory = tempfile.mkdtemp(prefix="pau_other_user_")
    try:
        os.chmod(directory, 0o755)
        paths = {}
        for name, mode in (("secret", 0o600), ("public", 0o644)):
            path = os.path.join(directory, f"{name}.txt")
            with open(path, "w") as f:
                f.write(SECRET if name == "secret" else "public")
            os.chown(path, OTHER_UID, OTHER_UID)
            os.chmod(path, mode)
            paths[name] = path
        yield paths
    finally:
        shutil.rmtree(directory)


READ_FILE = (
    "import os\ndef test_func(path):\n    return open(path.format(parent=os.getppid())).read()\n"
)


def _assert_unreadable(pool, source, path, message="Permission denied"):
    result = _run(pool, source, timeout_s=5.0, args=(path,))
    assert result.error_type == "PermissionError" and message in result.error_message, result
    assert SECRET not in result.stdout + result.stderr + result.error_message + result.display


def test_other_users_files_are_unreadable(executor, other_user_files):
    public = executor.call(READ_FILE, (other_user_files["public"],), timeout_s=20.0)
    assert public.value == "public", public  # Reachable: only the file's mode stops the read.
    _assert_unreadable(executor, READ_FILE, other_user_files["secret"])
    if importlib.util.find_spec("readline") is not None:
        _assert_unreadable(executor, READ_BELOW_HOOK, other_user_files["secret"])
    _assert_pool_still_works(executor)


# A parent process whose environment holds the secret from its start (os.environ changes made
# later never reach /proc/<pid>/environ). readline reads a file by its size, which /proc gives
# as 0, so below the audit hook the test checks that the kernel refuses to open the file.
PARENT = """
import json, sys
from pau_jax.sandbox import Executor, SandboxConfig
config, calls = json.loads(sys.argv[1])
with Executor(workers=1, config=SandboxConfig(**config)) as pool:
    results = [pool.call(source, tuple(args), timeout_s=20.0) for source, args in calls]
print(json.dumps([[r.ok, r.error_type, r.error_message, r.display, r.stdout + r.stderr] for r in results]))
"""


def _read_parent_environ(**config):
    """Reads /proc/<parent>/environ from workers of a parent started with the secret."""
    calls = [[READ_FILE, ["/proc/{parent}/environ"]], [BENIGN, [21]]]
    if importlib.util.find_spec("readline") is not None:
        calls.append([READ_BELOW_HOOK, ["/proc/{parent}/environ"]])
    out = subprocess.run(
        [sys.executable, "-c", PARENT, json.dumps([config, calls])],
        cwd=ROOT,
        env={SECRET_NAME: SECRET, **os.environ},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    results = json.loads(out.stdout.splitlines()[-1])
    for result in results:
        assert SECRET not in "".join(str(field) for field in result), result
    opened, benign, *below_hook = results
    assert opened[:2] == [False, "PermissionError"] and "other processes" in opened[2], opened
    assert benign[:2] == [True, None], benign
    return below_hook


def test_parent_environment_is_unreadable_below_the_audit_hook():
    if os.geteuid() != 0:
        pytest.skip("workers of an unprivileged parent run as the parent's user")
    for ok, error_type, message, _, _ in _read_parent_environ():
        assert (ok, error_type) == (False, "PermissionError") and "Permission denied" in message


def test_root_worker_kept_as_root_has_no_capabilities(other_user_files):
    """drop_privileges=False keeps uid 0 but no capability: only modes and ownership decide."""
    with Executor(workers=1, config=SandboxConfig(drop_privileges=False)) as pool:
        assert pool.isolation["uid"] == 0
        status = _capability_report(pool)
        assert [status[k] for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")] == [0] * 5
        _assert_unreadable(pool, READ_FILE, other_user_files["secret"])
        _assert_pool_still_works(pool)
    for ok, error_type, message, _, _ in _read_parent_environ(drop_privileges=False):
        assert (ok, error_type) == (False, "PermissionError") and "Permission denied" in message


@pytest.fixture(scope="module")
def lone_worker():
    """A one-worker pool started while the parent holds a secret in its environment."""
    os.environ[SECRET_NAME] = SECRET
    try:
        with Executor(workers=1) as pool:
            yield pool
    finally:
        del os.environ[SECRET_NAME]


def test_parent_environment_is_invisible(lone_worker):
    source = "import os\ndef test_func():\n    return dict(os.environ)\n"
    env = lone_worker.call(source, (), timeout_s=20.0).value
    assert SECRET_NAME not in env and SECRET not in repr(env)
    assert env["PYTHONHASHSEED"] == "0"
    proc = "def test_func():\n    return open('/proc/1/environ', 'rb').read()\n"
    assert lone_worker.call(proc, (), timeout_s=20.0).error_type == "PermissionError"


def test_monkey_patching_does_not_leak_to_the_next_source(lone_worker):
    patcher = (
        "import builtins, math, signal, warnings, decimal, os\n"
        "def test_func():\n"
        "    builtins.len = lambda x: 42\n"
        "    builtins.print = None\n"
        "    math.sqrt = lambda x: -1\n"
        "    os.environ['INJECTED'] = '1'\n"
        "    warnings.simplefilter('error')\n"
        "    decimal.getcontext().prec = 3\n"
        "    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "    open('leftover.txt', 'w').write('x')\n"
        "    return len([1, 2]), math.sqrt(4)\n"
    )
    assert lone_worker.call(patcher, (), timeout_s=20.0).value == (42, -1)
    victim = (
        "import math, os, signal, warnings, decimal\n"
        "def test_func():\n"
        "    warnings.warn('harmless')\n"
        "    print('still printing')\n"
        "    return (len([1, 2]), math.sqrt(4), 'INJECTED' in os.environ, os.listdir('.'),\n"
        "            str(decimal.Decimal(1) / decimal.Decimal(3))[:6],\n"
        "            signal.getsignal(signal.SIGALRM) == signal.SIG_DFL)\n"
    )
    result = lone_worker.call(victim, (), timeout_s=20.0)
    assert result.ok, result
    assert result.value == (2, 2.0, False, [], "0.3333", True)
    assert result.stdout == "still printing\n"


def test_patching_through_builtins_dict_does_not_leak(lone_worker):
    patcher = "def test_func():\n    __builtins__['sorted'] = lambda x: 'patched'\n    return sorted([2, 1])\n"
    assert lone_worker.call(patcher, (), timeout_s=20.0).value == "patched"
    assert lone_worker.call(patcher.replace("sorted(", "len("), (), timeout_s=20.0).ok
    assert lone_worker.call(
        "def test_func():\n    return sorted([2, 1])\n", (), timeout_s=20.0
    ).value == [1, 2]


def test_cpu_time_limit_stops_a_worker():
    with Executor(workers=1, config=SandboxConfig(cpu_time_s=1)) as pool:
        result = _run(pool, "def test_func():\n    while True:\n        pass\n", timeout_s=30.0)
        assert result.error_type == "WorkerCrashed" and "SIGXCPU" in result.error_message
        assert not result.timed_out
        _assert_pool_still_works(pool)


def test_timed_out_call_does_not_delay_other_threads(executor):
    import concurrent.futures

    loop = "def test_func():\n    while True:\n        pass\n"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        slow = pool.submit(executor.call, loop, (), timeout_s=3.0)
        time.sleep(0.2)
        start = time.monotonic()
        fast = [executor.call(BENIGN, (i,), timeout_s=20.0).value for i in range(5)]
        fast_s = time.monotonic() - start
        assert slow.result().timed_out
    assert fast == [[i, 2 * i] for i in range(5)]
    assert fast_s < 2.5, fast_s
    assert signal.getsignal(signal.SIGTERM) in (
        signal.SIG_DFL,
        signal.default_int_handler,
    ) or callable(signal.getsignal(signal.SIGTERM))


def test_audit_hook_alone_blocks_without_os_layers(tmp_path):
    config = SandboxConfig(
        network_namespace=False, read_only_filesystem=False, drop_privileges=False
    )
    target = tmp_path / "written.txt"
    with Executor(workers=1, config=config) as pool:
        assert (
            not pool.isolation["network_namespace"] and not pool.isolation["read_only_filesystem"]
        )
        assert pool.isolation["uid"] == os.getuid()
        cases = [
            ("import socket\ndef test_func():\n    socket.socket()\n", "network access"),
            (f"def test_func():\n    open({str(target)!r}, 'w')\n", "writing to"),
            ("import os\ndef test_func():\n    os.system('true')\n", "starting processes"),
            ("import ctypes\ndef test_func():\n    ctypes.CDLL('libc.so.6')\n", "ctypes"),
        ]
        for source, what in cases:
            result = _run(pool, source, timeout_s=5.0)
            assert result.error_type == "PermissionError" and what in result.error_message, result
        _assert_pool_still_works(pool)
    assert not target.exists()


def test_user_audit_hooks_are_refused(executor):
    source = (
        "import sys\n"
        "def test_func():\n"
        "    seen = []\n"
        "    sys.addaudithook(lambda event, args: seen.append(event))\n"
        "    compile('1', '<x>', 'eval')\n"
        "    return seen\n"
    )
    assert executor.call(source, (), timeout_s=20.0).value == []
