"""The mode registry: every mode `evaluate` accepts has a module, and an unknown mode is refused."""

import ast
import inspect
import pathlib
import re

import pytest

from pau_jax.evaluation import modes, pipeline
from pau_jax.policy import backends

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _gin_modes() -> set[str]:
    """Every mode named in a `...evaluate.modes = (...)` binding of a gin file (comments too)."""
    found = set()
    for path in (ROOT / "gin").rglob("*.gin"):
        for match in re.finditer(r"evaluate\.modes\s*=\s*\"?(\([^)]*\))", path.read_text()):
            found.update(ast.literal_eval(match.group(1)))
    return found


def test_the_registry_covers_every_mode_the_config_accepts():
    assert pipeline.MODES == tuple(modes.REGISTRY)
    documented = inspect.getdoc(pipeline.evaluate).split("modes: ", 1)[1].split("judge:", 1)[0]
    assert set(re.findall(r"'(\w+)'", documented)) == set(modes.REGISTRY)
    named = _gin_modes()
    assert named and named <= set(modes.REGISTRY), named - set(modes.REGISTRY)
    for name, mode in modes.REGISTRY.items():
        assert isinstance(mode, modes.Mode), name
        assert callable(mode.run) and list(inspect.signature(mode.run).parameters) == ["context"]


def test_an_unknown_mode_is_a_one_line_error(tmp_path):
    with pytest.raises(ValueError) as error:
        pipeline.evaluate(
            run_dir=str(tmp_path / "run"),
            policy=backends.OracleBackendConfig(),
            modes=("interactive", "bogus"),
        )
    message = str(error.value)
    assert "\n" not in message and "'bogus'" in message and "interactive" in message
    assert not (tmp_path / "run").exists()  # refused before anything ran
