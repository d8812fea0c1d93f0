"""gin/variants/as_released.gin: every released-code difference reaches the configs it targets."""

import importlib.util  # noqa: F401  (gin-config 0.5.0 needs it before parsing includes)
import pathlib

import gin
import pytest

from pau_jax import experiment

GIN_DIR = pathlib.Path(__file__).resolve().parents[1] / "gin"


@pytest.fixture
def parse():
    experiment.register_configurables()

    def _parse(*files):
        gin.clear_config()
        gin.add_config_file_search_path(str(GIN_DIR))
        gin.parse_config_files_and_bindings(
            [str(GIN_DIR / f) for f in files], [], finalize_config=False
        )

    yield _parse
    gin.clear_config()


def _make(name, scope=None):
    configurable = gin.get_configurable(name)
    if scope is None:
        return configurable()
    with gin.config_scope(scope):
        return configurable()


def test_paper_defaults_without_the_overlay(parse):
    parse("aac.gin")
    episode = _make("pau_jax.env.episode.EpisodeConfig")
    assert (episode.call_budget, episode.history_window, episode.display_mode) == (25, None, "repr")
    assert episode.reflection_sees_newest
    assert gin.query_parameter("pau_jax.experiment.train.advantage_fn").selector.endswith(
        "return_to_go"
    )
    critic = _make("pau_jax.rl.critic.CriticConfig")
    assert critic.clamp and critic.temperature == 0.0
    assert _make("pau_jax.rl.rewards.RewardConfig").length_penalty == "paper"


def test_as_released_on_training(parse):
    parse("aac.gin", "variants/as_released.gin")
    reference = gin.query_parameter("pau_jax.experiment.train.episode_config")
    assert reference.scoped_selector == "rl/pau_jax.env.episode.EpisodeConfig"
    rl = _make("pau_jax.env.episode.EpisodeConfig", scope="rl")
    assert rl.history_window == 5 and rl.reflection_sees_newest and rl.display_mode == "str"
    assert rl.max_steps == 40
    assert gin.query_parameter("pau_jax.experiment.train.advantage_fn").selector.endswith(
        "last_step_broadcast"
    )
    critic = _make("pau_jax.rl.critic.CriticConfig")
    assert not critic.clamp and critic.temperature == 1.0
    assert _make("pau_jax.rl.rewards.RewardConfig").length_penalty == "released"


def test_as_released_on_evaluation(parse):
    parse("eval/interactive.gin", "variants/as_released.gin")
    episode = _make("pau_jax.env.episode.EpisodeConfig")
    assert episode.call_budget == 20 and episode.history_window == 10
    assert not episode.reflection_sees_newest and episode.display_mode == "str"
