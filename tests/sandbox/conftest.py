"""Shared sandbox executor for the sandbox tests (one pool per test session)."""

import pytest

from pau_jax.sandbox import Executor, SandboxConfig


@pytest.fixture(scope="session")
def executor():
    """A two-worker pool shared by the sandbox test modules."""
    config = SandboxConfig(memory_bytes=768 << 20, max_output_bytes=4096)
    with Executor(workers=2, config=config) as pool:
        yield pool
