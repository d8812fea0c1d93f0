"""The quickstart's evaluations: who grades the agent, and how the agent decodes."""

import pytest

from pau_jax import quickstart
from pau_jax.policy import backends
from pau_jax.policy.config import SamplingConfig
from pau_jax.training.run import ActorConfig

AGENT, JUDGE = SamplingConfig(max_new_tokens=7), SamplingConfig(max_new_tokens=9)


def _seats(tmp_path, graders, decode_weights="float32"):
    seen = {}
    actor = ActorConfig(checkpoint="/ckpt/base", dtype="float32", decode_weights=decode_weights)
    quickstart._evaluate(
        lambda **kw: seen.update(kw) or {"ok": True},
        tmp_path,
        actor,
        "eval_after",
        "/run/train/adapter",
        "title",
        dataset=None,
        modes=("interactive",),
        samplings=(AGENT, JUDGE),
        scoring=None,
        graders=graders,
    )
    return seen


def test_without_graders_the_base_model_grades_its_own_agent(tmp_path):
    seen = _seats(tmp_path, None, decode_weights="q8")
    agent, judge = seen["policy"], seen["judge"]
    assert seen["coder"] == judge and seen["run_dir"] == str(tmp_path / "eval_after")
    assert judge.checkpoint_dir == agent.checkpoint_dir == "/ckpt/base"
    assert judge.adapter_dir is None and agent.adapter_dir == "/run/train/adapter"
    assert (agent.sampling, judge.sampling) == (AGENT, JUDGE)
    # The agent decodes as the trained actor does; so does the self-grading base.
    assert agent.decode_weights == judge.decode_weights == "q8"
    assert backends.same_model(judge, agent)  # what marks the run self-graded


@pytest.mark.parametrize("decode_weights", ["float32", "q8"])
def test_graders_grade_both_evaluations_and_the_agent_decodes_as_the_actor(
    tmp_path, decode_weights
):
    graders = backends.LocalBackendConfig(
        checkpoint_dir="/ckpt/larger", sampling=JUDGE, decode_weights="q8"
    )
    seen = _seats(tmp_path, graders, decode_weights)
    assert seen["judge"] is graders and seen["coder"] is graders
    assert seen["policy"].decode_weights == decode_weights
    assert not backends.same_model(graders, seen["policy"])
