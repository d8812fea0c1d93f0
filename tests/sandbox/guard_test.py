"""The audit hook: temporary directories work inside the worker, its settings resist rewriting."""

import pytest

TIMEOUT = 20.0

TEMPORARY_DIRECTORY = (
    "import os, tempfile\n"
    "def test_func():\n"
    "    with tempfile.TemporaryDirectory() as name:\n"
    "        os.makedirs(os.path.join(name, 'a', 'b'))\n"
    "        with open(os.path.join(name, 'a', 'b', 'f.txt'), 'w') as f:\n"
    "            f.write('x')\n"
    "        inside = sorted(os.listdir(os.path.join(name, 'a')))\n"
    "    return inside, os.path.exists(name)\n"
)
RMTREE = (
    "import os, shutil\n"
    "def test_func():\n"
    "    os.makedirs('tree/sub/deeper')\n"
    "    os.symlink('/tmp', 'tree/sub/out')\n"
    "    for path in ('tree/f', 'tree/sub/g', 'tree/sub/deeper/h'):\n"
    "        open(path, 'w').close()\n"
    "    shutil.rmtree('tree')\n"
    "    return os.path.exists('tree'), os.listdir('.')\n"
)
# Empties every setting the hook had in module globals, then tries what they refused.
REWRITE_SETTINGS = (
    "import sys, ctypes\n"
    "def test_func(attempt):\n"
    "    guard = sys.modules['pau_jax.sandbox.guard']\n"
    "    guard._DENIED_PREFIXES.clear()\n"
    "    guard._PATH_EVENTS.clear()\n"
    "    for name in ('_PREFIXES', '_DENIED_PREFIXES', '_PATH_EVENTS'):\n"
    "        setattr(guard, name, type(getattr(guard, name, ()))())\n"
    "    guard._HARMLESS = frozenset(['open', 'ctypes.dlopen', 'ctypes.dlsym'])\n"
    "    guard._WRITE_FLAGS = 0\n"
    "    guard.denied = lambda what: None\n"
    "    if attempt == 'ctypes':\n"
    "        return ctypes.CDLL('libc.so.6').getpid()\n"
    "    open('/tmp/pau_sandbox_pwned', 'w').write('x')\n"
)


def test_temporary_directory_works_inside_the_worker(executor):
    result = executor.call(TEMPORARY_DIRECTORY, (), timeout_s=TIMEOUT)
    assert result.ok, result
    assert result.value == (["b"], False)


def test_rmtree_works_inside_the_worker(executor):
    result = executor.call(RMTREE, (), timeout_s=TIMEOUT)
    assert result.ok, result
    assert result.value == (False, [])


@pytest.mark.parametrize(
    "source",
    [
        "import tempfile\ndef test_func():\n    return tempfile.TemporaryDirectory(dir='/tmp').name\n",
        "import shutil\ndef test_func():\n    shutil.rmtree('/tmp/pau_sandbox_absent')\n",
        "import os, shutil\ndef test_func():\n    os.makedirs('t')\n"
        "    os.symlink('/tmp', 't/out')\n    shutil.rmtree('t/out/..')\n",
    ],
    ids=["temporary_directory", "rmtree", "rmtree_through_a_link"],
)
def test_outside_the_worker_directory_stays_refused(executor, source):
    result = executor.call(source, (), timeout_s=TIMEOUT)
    assert not result.ok and result.error_type == "PermissionError", result
    assert "outside the sandbox directory" in result.error_message, result


@pytest.mark.parametrize("attempt", ["ctypes", "write"])
def test_rewriting_the_guard_module_changes_nothing(executor, attempt):
    result = executor.call(REWRITE_SETTINGS, (attempt,), timeout_s=TIMEOUT)
    assert not result.ok and result.error_type == "PermissionError", result
    assert "sandbox:" in result.error_message, result


@pytest.mark.parametrize(
    "call",
    [
        "signal.pidfd_send_signal(os.pidfd_open(os.getppid()), 0)",
        "signal.pidfd_send_signal(os.pidfd_open(os.getpid()), 0)",
        "__import__('_signal').pidfd_send_signal(0, 0)",
        "os.killpg(os.getpgid(os.getppid()), 0)",
        "os.kill(os.getppid(), 0)",
    ],
)
def test_signalling_through_any_function_is_refused(executor, call):
    source = f"import os, signal\ndef test_func():\n    return {call}\n"
    result = executor.call(source, (), timeout_s=TIMEOUT)
    assert not result.ok and result.error_type == "PermissionError", result
    assert "signalling other processes" in result.error_message, result
