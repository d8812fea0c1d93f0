"""gin/variants/as_released.gin: every released-code difference reaches the configs it targets."""

import importlib.util  # noqa: F401  (gin-config 0.5.0 needs it before parsing includes)
import pathlib

import gin
import pytest

from pau_jax import experiment
from pau_jax.rl import loop

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
    assert (episode.input_format, episode.failed_input_display) == ("lenient", "error")
    assert gin.query_parameter("pau_jax.experiment.train.advantage_fn").selector.endswith(
        "final_plus_mean"
    )
    critic = _make("pau_jax.rl.critic.CriticConfig")
    assert critic.clamp and critic.sampling.temperature == 0.0
    assert critic.sampling.max_new_tokens == 128
    rollout = _make("pau_jax.rl.rollout.RolloutConfig")
    assert (rollout.sampling.temperature, rollout.sampling.max_new_tokens) == (1.0, 512)
    assert _make("pau_jax.rl.rewards.RewardConfig").length_penalty == "paper"


def test_as_released_on_training(parse):
    parse("aac.gin", "variants/as_released.gin")
    reference = gin.query_parameter("EPISODE/macro.value")
    assert reference.scoped_selector == "rl/pau_jax.env.episode.EpisodeConfig"
    assert (
        gin.query_parameter("pau_jax.experiment.train.episode_config").scoped_selector
        == "EPISODE/gin.macro"
    )
    rl = _make("pau_jax.env.episode.EpisodeConfig", scope="rl")
    assert rl.history_window == 5 and rl.reflection_sees_newest and rl.display_mode == "str"
    assert rl.window_includes_examples and rl.max_steps == 40
    assert (rl.input_format, rl.failed_input_display) == ("strict", "literal")
    assert gin.query_parameter("pau_jax.experiment.train.advantage_fn").selector.endswith(
        "last_step_broadcast"
    )
    critic = _make("pau_jax.rl.critic.CriticConfig")
    assert not critic.clamp and critic.sampling.temperature == 1.0
    assert critic.privileged == "description" and critic.show_source
    assert critic.sampling.max_new_tokens == 300 and critic.sampling.enable_thinking
    rewards = _make("pau_jax.rl.rewards.RewardConfig")
    assert rewards.length_penalty == "released" and rewards.timeout_rule == "replace"
    assert rewards.futile_continue == "literal"
    rollout = _make("pau_jax.rl.rollout.RolloutConfig")
    assert rollout.sampling.max_new_tokens == 1024 and rollout.sampling.enable_thinking
    assert rollout.call_timeout_s == 10.0 and rollout.sampling.max_prompt_tokens == 512
    sampling = rollout.sampling_for(seed=7)
    assert sampling.max_prompt_tokens == 512 and sampling.enable_thinking and sampling.seed == 7


def test_as_released_reaches_the_distill_mode_too(parse):
    # DISTILL / CodeARC-SFT share the training protocol and the thinking switch with AAC.
    parse("aac.gin", "ablations/distill.gin", "variants/as_released.gin")
    assert (
        gin.query_parameter("pau_jax.experiment.distill.episode_config").scoped_selector
        == "EPISODE/gin.macro"
    )
    assert gin.query_parameter("EPISODE/macro.value").scoped_selector.startswith("rl/")
    assert (
        gin.query_parameter("pau_jax.experiment.distill.enable_thinking").scoped_selector
        == "THINKING/gin.macro"
    )
    assert gin.query_parameter("THINKING/macro.value") is True
    assert (
        gin.query_parameter("pau_jax.experiment.distill.seed").scoped_selector == "SEED/gin.macro"
    )


def test_as_released_served_critic_samples_as_the_released_critic(parse):
    # The recipe of as_released.gin's header: the critic an endpoint, sent the critic's sampling.
    parse("aac.gin", "variants/as_released.gin")
    gin.parse_config(
        [
            "pau_jax.experiment.train.critic = @critic/pau_jax.policy.backends.HTTPBackendConfig()",
            "critic/pau_jax.policy.backends.HTTPBackendConfig.http = "
            "@critic/pau_jax.policy.http.HTTPConfig()",
            "critic/pau_jax.policy.http.HTTPConfig.base_url = 'http://127.0.0.1:8001/v1'",
        ]
    )
    seat = _make("pau_jax.policy.backends.HTTPBackendConfig", scope="critic")
    served = loop._served_critic(seat, _make("pau_jax.rl.critic.CriticConfig"))
    assert (served.http.temperature, served.http.max_tokens) == (1.0, 300)
    assert served.http.base_url == "http://127.0.0.1:8001/v1"


def test_as_released_keeps_sym_info_symmetric(parse):
    parse("aac.gin", "ablations/sym_info.gin", "variants/as_released.gin")
    critic = _make("pau_jax.rl.critic.CriticConfig")
    assert critic.privileged == "none" and critic.show_source  # source is ignored with 'none'


def test_paper_timeouts_and_credit(parse):
    parse("aac.gin")
    rewards = _make("pau_jax.rl.rewards.RewardConfig")
    assert rewards.timeout_rule == "add" and rewards.futile_continue == "end"
    assert rewards.reflection_length_cap == 0.5
    assert gin.query_parameter("pau_jax.experiment.train.advantage_fn").selector.endswith(
        "final_plus_mean"
    )
    # DeepSeekMath's exact process supervision, one binding away.
    gin.parse_config("pau_jax.experiment.train.advantage_fn = @pau_jax.rl.credit.process_grpo")
    assert gin.query_parameter("pau_jax.experiment.train.advantage_fn").selector.endswith(
        "process_grpo"
    )
    # The per-position rule, one binding away: its constants stay bound.
    assert gin.query_parameter("GAMMA/macro.value") == 0.0
    assert (
        gin.query_parameter("pau_jax.rl.credit.return_to_go.gamma").scoped_selector
        == "GAMMA/gin.macro"
    )
    assert gin.query_parameter("pau_jax.rl.credit.return_to_go.normalize") == "position"
    rollout = _make("pau_jax.rl.rollout.RolloutConfig")
    assert rollout.sampling.max_prompt_tokens is None


def _bindings(gin_file):
    """The binding lines of a gin file (comments and blank lines left out)."""
    lines = (GIN_DIR / gin_file).read_text().splitlines()
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_final_differs_from_aac_only_in_sparsity(parse):
    # FINAL binds one thing: the default rule on the final step's reward alone (credit_test.py
    # checks final_only against final_plus_mean on the final rewards); no gamma or other setting.
    assert _bindings("ablations/final.gin") == [
        "pau_jax.experiment.train.advantage_fn = @pau_jax.rl.credit.final_only"
    ]
    parse("aac.gin", "ablations/final.gin")
    assert gin.query_parameter("pau_jax.experiment.train.advantage_fn").selector.endswith(
        "final_only"
    )


def test_as_released_http_graders_get_the_repetition_penalty(parse):
    # The released harness decoded the judge and the coder (open models) with repetition penalty
    # 1.2; served over HTTP they get it too. The agent's endpoint seat may be a hosted API,
    # which takes no such parameter: it keeps none.
    parse("eval/interactive.gin", "variants/as_released.gin")
    for seat in ("judge", "coder"):
        http = _make("pau_jax.policy.http.HTTPConfig", scope=seat)
        assert http.repetition_penalty == 1.2 and http.temperature == 0.0, seat
    assert _make("pau_jax.policy.http.HTTPConfig", scope="policy").repetition_penalty is None
    parse("eval/interactive.gin")
    for seat in ("judge", "coder"):
        assert _make("pau_jax.policy.http.HTTPConfig", scope=seat).repetition_penalty is None


def test_as_released_on_evaluation(parse):
    parse("eval/interactive.gin", "variants/as_released.gin")
    episode = _make("pau_jax.env.episode.EpisodeConfig")
    assert episode.call_budget == 20 and episode.history_window == 10
    assert not episode.reflection_sees_newest and episode.display_mode == "str"
    assert episode.window_includes_examples
    assert (episode.input_format, episode.failed_input_display) == ("strict", "literal")
    for seat, tokens in (("policy", 300), ("judge", 300), ("coder", 600)):
        sampling = _make("pau_jax.policy.config.SamplingConfig", scope=seat)
        assert sampling.temperature == 0.0 and sampling.repetition_penalty == 1.2, seat
        assert sampling.max_new_tokens == tokens and sampling.enable_thinking, seat
        assert _make("pau_jax.policy.http.HTTPConfig", scope=seat).max_tokens == tokens
    assert gin.query_parameter("pau_jax.evaluation.score.ScoringConfig.coder_observations") == (
        True,
    )
    assert gin.query_parameter("pau_jax.experiment.evaluate.call_timeout_s") == 30.0
    assert gin.query_parameter("pau_jax.evaluation.score.ScoringConfig.timeout_s") == 0.5


def test_paper_evaluation_defaults(parse):
    parse("eval/interactive.gin")
    episode = _make("pau_jax.env.episode.EpisodeConfig")
    assert episode.call_budget == 25 and not episode.window_includes_examples
    sampling = _make("pau_jax.policy.config.SamplingConfig", scope="policy")
    assert sampling.repetition_penalty == 1.0 and not sampling.enable_thinking
    # The judge and the coder are required seats (None until set) in the paper's protocol.
    assert gin.query_parameter("JUDGE/macro.value") is None
    assert gin.query_parameter("CODER/macro.value") is None
    assert (
        gin.query_parameter("pau_jax.experiment.evaluate.judge").scoped_selector
        == "JUDGE/gin.macro"
    )


def test_the_cpu_preset_masks_its_graders_and_as_released_unmasks_them(parse):
    parse("eval/coder_cpu.gin")
    judge = _make("pau_jax.policy.config.SamplingConfig", scope="judge")
    assert judge.structured == "constrain_inputs" and judge.max_new_tokens == 96
    coder = _make("pau_jax.policy.config.SamplingConfig", scope="coder")
    assert coder.structured == "constrain_inputs" and coder.max_new_tokens == 256
    # The agent is not masked by the preset (the protocol's own format errors are counted).
    assert _make("pau_jax.policy.config.SamplingConfig", scope="policy").structured == "off"
    parse("eval/coder_cpu.gin", "variants/as_released.gin")
    for seat in ("judge", "coder"):
        sampling = _make("pau_jax.policy.config.SamplingConfig", scope=seat)
        assert sampling.structured == "off" and sampling.enable_thinking, seat


def test_the_held_out_preset_keeps_the_protocol_of_the_aac_run(parse):
    parse("eval/aac_heldout_cpu.gin")
    gin.parse_config("ADAPTER = 'runs/x/adapter'")
    episode = _make("pau_jax.env.episode.EpisodeConfig")
    assert (episode.max_steps, episode.conversation) == (7, "multi_turn")
    agent = _make("pau_jax.policy.backends.LocalBackendConfig", scope="policy")
    assert agent.adapter_dir == "runs/x/adapter" and agent.sampling.max_new_tokens == 64
    for seat in ("policy", "judge", "coder"):
        assert (
            _make("pau_jax.policy.backends.LocalBackendConfig", scope=seat).decode_weights == "q8"
        )
    assert gin.query_parameter("pau_jax.experiment.evaluate.modes") == ("interactive",)
    assert _make("pau_jax.tasks.DatasetConfig").limit == 12


def test_the_40_task_preset_mixes_two_benchmarks_under_the_cpu_protocol(parse):
    parse("eval/coder_cpu_40.gin")
    dataset = _make("pau_jax.tasks.DatasetConfig")
    assert (dataset.config, dataset.sources, dataset.per_source) == (
        "default",
        ("humaneval", "mbpp"),
        20,
    )
    assert _make("pau_jax.env.episode.EpisodeConfig").call_budget == 4
    assert gin.query_parameter("pau_jax.experiment.evaluate.modes") == ("interactive", "in_context")
    for seat in ("policy", "judge", "coder"):
        assert (
            _make("pau_jax.policy.backends.LocalBackendConfig", scope=seat).decode_weights == "q8"
        )
