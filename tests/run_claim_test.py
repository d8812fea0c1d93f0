"""A run directory's claim: fingerprints of the config classes, what may change on resume, the lock."""

import dataclasses
import fcntl
import importlib
import json
import os

import pytest

from pau_jax import run_claim
from pau_jax.policy import backends
from pau_jax.policy.http import HTTPConfig


def _claim(run_dir, settings, kind="eval"):
    with run_claim.claim(run_dir, kind=kind, settings=settings):
        pass


def test_paths_are_resolved_and_fields_that_may_change_on_resume_left_out(tmp_path, monkeypatch):
    (tmp_path / "ckpt").mkdir()
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    monkeypatch.chdir(tmp_path)
    agent = backends.LocalBackendConfig(checkpoint_dir="ckpt", adapter_dir=str(adapter))
    http = HTTPConfig(base_url="http://127.0.0.1:1/v1", model="j", api_key="secret-key")
    settings = {"agent": agent, "judge": backends.HTTPBackendConfig(http=http)}
    run_dir = tmp_path / "run"
    with run_claim.claim(run_dir, kind="eval", settings=settings):
        (run_dir / "interactive_episodes.jsonl").write_text('{"task_id": "t"}\n')
    written = (run_dir / run_claim.FINGERPRINT_FILE).read_text()
    agent_json = json.loads(written)["settings"]["agent"]
    assert agent_json["checkpoint_dir"] == str((tmp_path / "ckpt").resolve())
    assert "prefix_cache_gib" not in agent_json and "secret-key" not in written

    # The same checkpoint by its absolute path; another cache budget, key and patience: resumes.
    patient = dataclasses.replace(http, api_key="other", timeout_s=5.0, max_retries=0)
    _claim(
        run_dir,
        {
            "agent": dataclasses.replace(
                agent, checkpoint_dir=str(tmp_path / "ckpt"), prefix_cache_gib=0.0
            ),
            "judge": backends.HTTPBackendConfig(http=patient),
        },
    )
    # Another adapter and another judge model: refused in one line naming both fields.
    other = {
        "agent": dataclasses.replace(agent, adapter_dir=str(tmp_path / "adapter2")),
        "judge": backends.HTTPBackendConfig(http=dataclasses.replace(http, model="k")),
    }
    with pytest.raises(run_claim.RunDirError) as raised:
        _claim(run_dir, other)
    message = str(raised.value)
    assert "\n" not in message
    assert (
        f"agent.adapter_dir: '{adapter.resolve()}' -> '{tmp_path / 'adapter2'}'; "
        "judge.http.model: 'j' -> 'k')" in message
    )
    assert f"another directory (--run_dir), or delete {run_dir} to start it again" in message
    with pytest.raises(run_claim.RunDirError, match="holds a run of mode 'eval', not 'train'"):
        _claim(run_dir, settings, kind="train")
    assert (run_dir / run_claim.FINGERPRINT_FILE).read_text() == written


def test_a_folder_without_results_takes_the_new_settings(tmp_path, capsys):
    # A start that stopped before writing a result (e.g. on a mistyped path) pins nothing.
    run_dir = tmp_path / "run"
    _claim(run_dir, {"data_dir": "/mistyped"})
    (run_dir / "empty.jsonl").touch()
    _claim(run_dir, {"data_dir": "/right"})
    (run_dir / "memory").mkdir()
    (run_dir / "memory" / "retrieval.jsonl").write_text('{"task_id": "t"}\n')
    with pytest.raises(run_claim.RunDirError, match="data_dir: '/right' -> '/mistyped'"):
        _claim(run_dir, {"data_dir": "/mistyped"})
    # Results of an older version, without a fingerprint: taken as this run's, with a warning.
    (run_dir / run_claim.FINGERPRINT_FILE).unlink()
    capsys.readouterr()
    _claim(run_dir, {"data_dir": "/other"})
    assert "holds results but no fingerprint.json" in capsys.readouterr().err
    _claim(run_dir, {"data_dir": "/other"})


def test_values_become_stable_plain_json():
    @dataclasses.dataclass(frozen=True)
    class Spec:
        values: tuple
        table: dict

    first = run_claim.plain(Spec(values=({3, 1, 2}, b"\x00", float("nan")), table={(1, 2): "a"}))
    again = run_claim.plain(Spec(values=({2, 3, 1}, b"\x00", float("nan")), table={(1, 2): "a"}))
    assert first == again == json.loads(json.dumps(first))
    assert first["values"] == [[1, 2, 3], {"bytes": "00"}, "nan"]
    assert run_claim.plain(run_claim.digest) == "pau_jax.run_claim.digest"
    with pytest.raises(TypeError, match=r"settings\.policy: a value of type object cannot be part"):
        run_claim.plain({"policy": object()})
    assert run_claim.digest([object()]).startswith("sha256:")  # Digests read any value.


def test_every_resumable_field_is_a_field_of_its_class():
    for name, fields in run_claim.RESUMABLE_FIELDS.items():
        module, cls = name.rsplit(".", 1)
        config = getattr(importlib.import_module(module), cls)
        names = {f.name for f in dataclasses.fields(config)}
        assert set(fields) <= names, (name, set(fields) - names)


def test_the_lock_is_reentrant_in_one_process_and_ends_with_its_holder(tmp_path):
    run_dir = tmp_path / "run"
    with run_claim.lock(run_dir), run_claim.lock(run_dir):
        holder = json.loads((run_dir / run_claim.LOCK_FILE).read_text())
        assert holder["pid"] == os.getpid()
        with open(run_dir / run_claim.LOCK_FILE) as f, pytest.raises(BlockingIOError):
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # Another open file: refused.
    with open(run_dir / run_claim.LOCK_FILE) as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # Released when the block ended.
