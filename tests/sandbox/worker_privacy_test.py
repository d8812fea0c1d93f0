"""Workers kept apart: one uid each, private directories, model code never beside a reference.

Generated code (a coder's prediction) must not read the task's reference source: not in its
own worker (cached sources, their files, code objects reachable through ``gc`` or frames) and not in
another worker's directory. Workers must not be able to signal one another below the audit
hook, which the kernel refuses only between different users.
"""

import os

import pytest

from pau_jax.sandbox import Executor, SandboxConfig, SandboxError, uids

SECRET = "reference-secret-5be1"
REFERENCE = f"def test_func(x):\n    tag = {SECRET!r}\n    return x + 1\n"
# Looks everywhere a worker can for the secret: its own directory tree, the directories of
# the other workers (found through /tmp), every code object alive in its process. The secret
# comes reversed as the argument, so that the snoop's own source does not hold it.
SNOOP = (
    "import gc, os, sys, types\n"
    "def _files(top):\n"
    "    found = []\n"
    "    for root, dirs, files in os.walk(top):\n"
    "        found += [os.path.join(root, f) for f in files]\n"
    "    return found\n"
    "def test_func(backwards):\n"
    "    secret, seen, errors = backwards[::-1], [], []\n"
    "    mine = os.path.dirname(os.getcwd())\n"
    "    base = os.path.dirname(mine)\n"
    "    tops = [mine] + [os.path.join(base, d) for d in os.listdir(base)\n"
    "                     if d.startswith('pau_sandbox_') and os.path.join(base, d) != mine]\n"
    "    for top in tops:\n"
    "        try:\n"
    "            os.listdir(top)\n"
    "        except OSError as exc:\n"
    "            errors.append(type(exc).__name__)\n"
    "            continue\n"
    "        for path in _files(top):\n"
    "            try:\n"
    "                with open(path, encoding='utf-8', errors='replace') as f:\n"
    "                    seen.append(f.read())\n"
    "            except OSError as exc:\n"
    "                errors.append(type(exc).__name__)\n"
    "    try:\n"
    "        objects = gc.get_objects()\n"
    "    except PermissionError:\n"
    "        objects, frame = [], sys._getframe()\n"
    "        while frame is not None:\n"
    "            objects += [frame.f_code] + list(frame.f_locals.values())\n"
    "            frame = frame.f_back\n"
    "        for obj in list(objects):\n"
    "            inner = getattr(obj, '__dict__', None) or (obj if isinstance(obj, dict) else {})\n"
    "            for value in list(inner.values()):\n"
    "                objects += [value] + (list(value.values()) if isinstance(value, dict) else [])\n"
    "        objects += [getattr(o, 'code', None) for o in list(objects)]\n"
    "    for obj in objects:\n"
    "        code = obj.__code__ if isinstance(obj, types.FunctionType) else obj\n"
    "        if isinstance(code, types.CodeType):\n"
    "            seen.append(repr(code.co_consts))\n"
    "    return [any(secret in s for s in seen), len(tops) - 1, sorted(set(errors))]\n"
)


def _worker_uid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["Uid"].split()[0])


@pytest.fixture
def pool():
    with Executor(workers=2, config=SandboxConfig(memory_bytes=768 << 20)) as executor:
        yield executor


def test_generated_code_never_finds_the_reference_source(pool):
    # The reference runs on both workers (several calls, spread over the pool).
    assert [r.value for r in pool.call_many(REFERENCE, [(i,) for i in range(8)])] == list(
        range(1, 9)
    )
    # One call: one worker is replaced for it, the other still holds the reference (its
    # folder is closed only by its own uid); two calls: both are replaced.
    for calls in (1, 2):
        for result in pool.call_many(
            SNOOP, [(SECRET[::-1],)] * calls, timeout_s=20.0, origin="generated"
        ):
            assert result.ok, result
            found, others, errors = result.value
            assert not found, "generated code read the reference source"
            if os.geteuid() == 0:
                assert others >= 1 and "PermissionError" in errors, result.value
        assert pool.call(REFERENCE, (41,)).value == 42  # The pool goes on with the task.


def test_same_origin_reuses_its_workers(pool):
    before = {w.proc.pid for w in pool._all}
    for _ in range(3):
        assert pool.call(REFERENCE, (1,)).value == 2
        assert pool.call("def test_func(x):\n    return -x\n", (1,)).value == -1
    assert {w.proc.pid for w in pool._all} == before


def test_workers_run_as_distinct_unprivileged_users(pool):
    if os.geteuid() != 0:
        pytest.skip("the parent is not root")
    pool.call_many(REFERENCE, [(i,) for i in range(4)])
    ids = {_worker_uid(w.proc.pid) for w in pool._all}
    first, stop = SandboxConfig().worker_uids
    assert len(ids) == 2 and all(first <= i < stop for i in ids), ids
    # Two pools at once never share a uid (the claims are machine-wide).
    with Executor(workers=2) as other:
        other.call(REFERENCE, (0,))
        assert not ids & {_worker_uid(w.proc.pid) for w in other._all}
    # A worker's folder is its user's alone.
    for worker in pool._all:
        info = os.stat(worker.root)
        assert info.st_uid == _worker_uid(worker.proc.pid) and info.st_mode & 0o077 == 0


def test_a_worker_cannot_signal_another_below_the_hook(pool):
    if os.geteuid() != 0:
        pytest.skip("the parent is not root")
    pool.call_many(REFERENCE, [(i,) for i in range(4)])
    pids = [w.proc.pid for w in pool._all]
    # The audit hook refuses os.kill; what stops code below it is the kernel: signalling a
    # process of another user needs CAP_KILL, which no worker holds. Check the kernel's rule
    # on the workers' own credentials: different real uids, no capabilities.
    worker_uids = [_worker_uid(pid) for pid in pids]
    assert worker_uids[0] != worker_uids[1]
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            caps = {k: v.strip() for k, v in (line.split(":", 1) for line in f)}
        assert int(caps["CapEff"], 16) == 0 and int(caps["CapPrm"], 16) == 0


def test_shared_uid_when_the_range_is_off():
    if os.geteuid() != 0:
        pytest.skip("the parent is not root")
    config = SandboxConfig(worker_uids=None)
    with Executor(workers=2, config=config) as executor:
        executor.call_many(REFERENCE, [(i,) for i in range(4)])
        assert {_worker_uid(w.proc.pid) for w in executor._all} == {config.sandbox_uid}


def test_an_exhausted_uid_range_is_a_clear_error():
    if os.geteuid() != 0:
        pytest.skip("the parent is not root")
    claim = uids.claim(64990, 64991)  # Held here: the range has no free uid left.
    try:
        with pytest.raises(SandboxError, match="every worker uid in"):
            Executor(workers=1, config=SandboxConfig(worker_uids=(64990, 64991)))
    finally:
        claim.release()
    with Executor(workers=1, config=SandboxConfig(worker_uids=(64990, 64991))) as executor:
        assert executor.call(REFERENCE, (1,)).value == 2


@pytest.mark.parametrize("bad", [(0, 10), (10, 10), (5,), (-1, 3), ("a", "b"), (True, 3)])
def test_bad_uid_ranges_are_refused(bad):
    with pytest.raises(ValueError, match="worker_uids"):
        SandboxConfig(worker_uids=bad)


def test_an_unmapped_range_falls_back_with_a_warning(tmp_path, monkeypatch, caplog):
    narrow = tmp_path / "uid_map"
    narrow.write_text("         0          0      65536\n")
    assert uids._mapped(65000, 65534, str(narrow))
    assert not uids._mapped(100000, 100010, str(narrow))
    assert not uids._mapped(65000, 65537, str(narrow))
    if os.geteuid() != 0:
        pytest.skip("the parent is not root")
    monkeypatch.setattr(uids, "_mapped", lambda first, stop, path: False)
    with caplog.at_level("WARNING"):
        assert uids.usable_range((100000, 100010)) is None
    assert "not all mapped" in caplog.text
    with Executor(workers=1, config=SandboxConfig(worker_uids=(100000, 100010))) as executor:
        assert executor.call(REFERENCE, (1,)).value == 2
        (worker,) = executor._all
        assert _worker_uid(worker.proc.pid) == SandboxConfig().sandbox_uid
