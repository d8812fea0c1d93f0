"""Shared fixtures for the sampling tests: one tiny random Qwen3 checkpoint per session."""

import checkpoints
import pytest

from pau_jax.models import qwen3


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """(checkpoint directory, transformers model) of a tiny random Qwen3."""
    return checkpoints.make_tiny_qwen3(tmp_path_factory.mktemp("tiny_qwen3"), seed=3)


@pytest.fixture(scope="session")
def tiny_model(tiny_checkpoint):
    """The tiny checkpoint loaded as a pau_jax model (float32)."""
    model, _ = qwen3.load_hf(tiny_checkpoint[0])
    return model


@pytest.fixture(scope="session")
def torch_model(tiny_checkpoint):
    """The same checkpoint as a transformers model."""
    return tiny_checkpoint[1]
