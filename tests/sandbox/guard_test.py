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


# Ways in to what the hook reads at call time. Each first tries to disable the hook, then
# writes outside the worker's directory: the hook must refuse (PermissionError), not only the
# read-only mount behind it (OSError).
HOOK_ATTACKS = {
    "builtins": (
        "import builtins\n"
        "def test_func():\n"
        "    builtins.any = lambda items: False\n"
        "    builtins.len = lambda x: 0\n"
        "    builtins.isinstance = lambda obj, cls: False\n"
        "    builtins.issubclass = lambda cls, base: True\n"
        "    open('/tmp/pau_sandbox_pwned', 'w')\n"
    ),
    "os_path": (
        "import os, posixpath\n"
        "def test_func():\n"
        "    root = os.getcwd()\n"
        "    posixpath.abspath = lambda path: root + '/x'\n"
        "    posixpath.realpath = lambda path, **kw: root + '/x'\n"
        "    open('/tmp/pau_sandbox_pwned', 'w')\n"
    ),
    "closure_cells_through_gc": (
        "import gc\n"
        "def test_func():\n"
        "    for obj in gc.get_objects():\n"
        "        for cell in getattr(obj, '__closure__', None) or ():\n"
        "            if isinstance(cell.cell_contents, frozenset):\n"
        "                cell.cell_contents = frozenset(['open'])\n"
        "    open('/tmp/pau_sandbox_pwned', 'w')\n"
    ),
    "closure_cells_through_a_traceback": (
        "import os\n"
        "def test_func():\n"
        "    try:\n"
        "        open('/tmp/pau_sandbox_pwned', 'w')\n"
        "    except PermissionError as error:\n"
        "        tb = error.__traceback__\n"
        "    while tb is not None:\n"
        "        for value in list(tb.tb_frame.f_locals.values()):\n"
        "            for cell in getattr(value, '__closure__', None) or ():\n"
        "                if isinstance(cell.cell_contents, str) and cell.cell_contents.startswith('/'):\n"
        "                    cell.cell_contents = '/'\n"
        "            if callable(value) and hasattr(value, '__code__'):\n"
        "                value.__code__ = (lambda *a: '/tmp/x').__code__\n"
        "        tb = tb.tb_next\n"
        "    open('/tmp/pau_sandbox_pwned', 'w')\n"
    ),
    "path_object_that_rewrites_the_hook": (
        "import os, sys\n"
        "class Sly(os.PathLike):\n"
        "    def __fspath__(self):\n"
        "        frame = sys._getframe(1)\n"
        "        for value in list(frame.f_locals.values()):\n"
        "            if isinstance(value, list):\n"
        "                value.clear()\n"
        "        return 'inside.txt'\n"
        "def test_func():\n"
        "    os.rename(Sly(), '/tmp/pau_sandbox_pwned')\n"
    ),
}


@pytest.mark.parametrize("attack", sorted(HOOK_ATTACKS))
def test_what_the_hook_reads_cannot_be_rewritten(executor, attack):
    result = executor.call(HOOK_ATTACKS[attack], (), timeout_s=TIMEOUT)
    assert not result.ok and result.error_type == "PermissionError", result
    assert "sandbox:" in result.error_message, result
    # Nothing of it lasts: the worker's next call is refused by the hook too.
    later = "def test_func():\n    open('/tmp/pau_sandbox_pwned', 'w')\n"
    result = executor.call(later, (), timeout_s=TIMEOUT)
    assert result.error_type == "PermissionError" and "outside the sandbox" in result.error_message


def test_the_hook_resolves_links_and_dots_as_the_kernel_does(executor):
    source = (
        "import os\n"
        "def test_func():\n"
        "    os.makedirs('a/b')\n"
        "    os.symlink('b', 'a/link')\n"
        "    os.symlink('/tmp', 'a/out')\n"
        "    os.symlink('loop2', 'loop1')\n"
        "    os.symlink('loop1', 'loop2')\n"
        "    results = []\n"
        "    for path in ('a/link/f', 'a/b/../b/./g', 'a/link/../h', 'a/out/f', 'a/b/../../../../x',\n"
        "                 b'a/b/bytes', 'loop1'):\n"
        "        try:\n"
        "            open(path, 'w').close()\n"
        "            results.append('ok')\n"
        "        except PermissionError:\n"
        "            results.append('refused')\n"
        "        except OSError as error:\n"
        "            results.append(type(error).__name__)\n"
        "    os.remove('a/out')\n"
        "    return results, sorted(os.listdir('a/b')), sorted(os.listdir('a'))\n"
    )
    result = executor.call(source, (), timeout_s=TIMEOUT)
    assert result.ok, result
    statuses, in_b, in_a = result.value
    assert statuses == ["ok", "ok", "ok", "refused", "refused", "ok", "OSError"], statuses
    assert in_b == ["bytes", "f", "g"] and in_a == ["b", "h", "link"]
