"""Rollout collection end to end over the real sandbox, with scripted actor and critic policies."""

import dataclasses

import numpy as np
import pytest

from pau_jax.env import turns
from pau_jax.env.episode import EpisodeConfig
from pau_jax.policy.local import Completion
from pau_jax.rl import credit, rollout
from pau_jax.rl.critic import CriticConfig
from pau_jax.rl.rewards import RewardConfig
from pau_jax.rl.rollout import RolloutConfig
from pau_jax.rl.samples import EpisodeSample, Sample
from pau_jax.sandbox import Executor
from pau_jax.tasks import TaskReference
from pau_jax.tasks import demo as demo_tasks

EPISODE = EpisodeConfig(call_budget=2, max_steps=6)
REWARDS = RewardConfig(max_steps=6)
CONFIG = RolloutConfig(tasks_per_batch=2, group_size=4)
REFERENCES = {
    t.task_id: TaskReference(description=t.description, code=t.code) for t in demo_tasks.DEMO_TASKS
}


def _ids(text):
    return tuple(1 + (ord(ch) % 97) for ch in text[-20:])


class ScriptedActor:
    """Replies like a LocalPolicy's `complete`; even rows plan 'A', odd rows plan 'B'."""

    def __init__(self):
        self.calls = 0

    def complete(self, conversations, *, answers=None, stop=None):
        self.calls += 1
        out = []
        for row, conversation in enumerate(conversations):
            content = conversation[-1]["content"]
            if "Now write the arguments" in content:
                text = "```\n(1, 2)\n```" if "arg0, arg1" in content else "```\n'abc'\n```"
            elif "Revise your hypothesis" in content:
                text = "Hypothesis: something\nDecision: STOP"
            else:
                text = "plan A" if row % 2 == 0 else "plan B"
            tokens = _ids(text)
            out.append(
                Completion(
                    text=text,
                    finish_reason="stop",
                    prompt_tokens=len(_ids(content)),
                    completion_tokens=len(tokens),
                    prompt_ids=_ids(content),
                    token_ids=tokens,
                    logprobs=(-0.25,) * len(tokens),
                )
            )
        return out


def critic_policy(plan_a: int, plan_b: int, hypothesis="Rating: 5"):
    """Rates reasoning by its plan and every hypothesis the same."""

    def policy(conversations):
        replies = []
        for conversation in conversations:
            text = conversation[-1]["content"]
            if "plan for its next input:\nplan A" in text:
                replies.append(f"Rating: {plan_a}")
            elif "plan for its next input:\nplan B" in text:
                replies.append(f"Rating: {plan_b}")
            else:
                replies.append(hypothesis)
        return replies

    return policy


@pytest.fixture(scope="module")
def executor():
    with Executor(workers=2) as ex:
        yield ex


@pytest.fixture(scope="module")
def tasks(executor):
    specs = {s.task.task_id: s for s in demo_tasks.demo_specs(executor, EPISODE)}
    return [specs["demo/affine"], specs["demo/vowels"]]


def _collect(tasks, executor, critic, advantage_fn, actor=None):
    return rollout.collect(
        tasks,
        actor=actor or ScriptedActor(),
        critic=critic,
        executor=executor,
        references=REFERENCES,
        config=CONFIG,
        episode_config=EPISODE,
        reward_config=REWARDS,
        critic_config=CriticConfig(),
        advantage_fn=advantage_fn,
    )


def test_samples_metrics_and_groups(tasks, executor):
    actor = ScriptedActor()
    out = _collect(tasks, executor, critic_policy(9, 0), credit.return_to_go, actor=actor)
    assert actor.calls == 3  # every episode of every group shares each policy call
    assert [e.spec.episode_id for e in out.episodes][:2] == ["demo/affine#0.0", "demo/affine#0.1"]
    assert out.group_ids == [(0, "demo/affine")] * 4 + [(1, "demo/vowels")] * 4
    assert len(out.samples) == 8 * 3
    first = out.episodes[0]
    for step, sample in enumerate(out.samples[:3]):
        reply = first.replies[step]
        assert sample.prompt_ids == list(reply.prompt_ids)
        assert sample.completion_ids == list(reply.token_ids)
        assert sample.sampler_logprobs == [-0.25] * len(reply.token_ids)
    flat = np.concatenate(out.advantages)
    np.testing.assert_allclose([s.advantage for s in out.samples], flat)
    # Rewards by hand: reasoning s + 0, clean input 2 / (2 * 6), STOP at s = 5/9 <= 0.7.
    s = 5 / 9
    reflection = 2 * s + 2 * -1.0
    assert out.rewards[0] == pytest.approx([1.0, 1 / 6, reflection])
    assert out.rewards[1] == pytest.approx([0.0, 1 / 6, reflection])
    m = out.metrics
    assert m["rollout/stop_rate"] == 1.0 and m["rollout/calls_per_episode"] == 1.0
    assert m["rollout/steps_per_episode"] == 3.0 and m["critic/unparsed"] == 0.0
    assert m["critic/requested"] == 16.0
    assert m["rollout/reward_mean"] == pytest.approx(0.5 + 1 / 6 + reflection)
    assert m["rollout/parse_failure_rate/generate"] == 0.0
    assert m["rollout/term/termination"] == pytest.approx(-2.0)


def test_unparsed_critic_answers_are_counted_not_rewarded(tasks, executor):
    out = _collect(tasks, executor, critic_policy(9, 0, hypothesis="hmm"), credit.return_to_go)
    assert out.metrics["critic/unparsed"] == 8.0
    assert out.metrics["critic/unparsed_rate"] == 0.5
    assert all(scores[2] is None for scores in out.scores)
    # A reflection without a score gets neither the critic term nor b_term.
    assert out.rewards[0][2] == pytest.approx(0.0)


@pytest.mark.parametrize(
    "advantage_fn, intermediate_counts",
    [
        (credit.return_to_go, True),
        (credit.final_only, False),
        (credit.last_step_broadcast, False),
    ],
)
def test_intermediate_reward_reaches_advantages_only_under_return_to_go(
    tasks, executor, advantage_fn, intermediate_counts
):
    # Same final rewards; only the reasoning steps' scores differ between the two critics.
    varied = _collect(tasks, executor, critic_policy(9, 0), advantage_fn)
    flat = _collect(tasks, executor, critic_policy(5, 5), advantage_fn)
    assert [r[-1] for r in varied.rewards] == pytest.approx([r[-1] for r in flat.rewards])
    assert [r[0] for r in varied.rewards] != pytest.approx([r[0] for r in flat.rewards])
    same = all(
        np.allclose(a, b, atol=1e-6)
        for a, b in zip(varied.advantages, flat.advantages, strict=True)
    )
    assert same is not intermediate_counts
    if intermediate_counts:
        # Episodes whose plan the critic liked (even rows) get the larger advantages.
        assert varied.advantages[0][0] > 0 > varied.advantages[1][0]


def test_actor_without_tokens_is_a_clear_error(tasks, executor):
    class TextsOnly(ScriptedActor):
        def complete(self, conversations, *, answers=None, stop=None):
            return [c.text for c in super().complete(conversations)]

    with pytest.raises(ValueError, match="no prompt_ids"):
        _collect(tasks, executor, critic_policy(9, 0), credit.return_to_go, actor=TextsOnly())


def test_mismatched_t_max_is_rejected(tasks, executor):
    with pytest.raises(ValueError, match="max_steps"):
        rollout.collect(
            tasks,
            actor=ScriptedActor(),
            critic=critic_policy(1, 1),
            executor=executor,
            references=REFERENCES,
            config=CONFIG,
            episode_config=EpisodeConfig(max_steps=40),
            reward_config=REWARDS,
            critic_config=CriticConfig(),
            advantage_fn=credit.return_to_go,
        )


def test_a_group_of_one_is_refused():
    with pytest.raises(ValueError, match="group_size=1 would train on the KL term alone") as info:
        RolloutConfig(group_size=1)
    assert "\n" not in str(info.value)


class ChainActor(ScriptedActor):
    """Like ScriptedActor, but each prompt extends the last prompt and reply by ids."""

    def complete(self, conversations, *, answers=None, stop=None):
        out = super().complete(conversations)
        for row, conversation in enumerate(conversations):
            found = turns.last_tokens(conversation)
            new = _ids(conversation[-1]["content"])
            prompt = new if found is None else found[1] + found[2] + (3,) + new
            out[row] = dataclasses.replace(out[row], prompt_ids=prompt, prompt_tokens=len(prompt))
        return out


def _collect_multi_turn(tasks, executor, actor):
    return rollout.collect(
        tasks,
        actor=actor,
        critic=critic_policy(9, 0),
        executor=executor,
        references=REFERENCES,
        config=CONFIG,
        episode_config=dataclasses.replace(EPISODE, conversation="multi_turn"),
        reward_config=REWARDS,
        critic_config=CriticConfig(),
        advantage_fn=credit.return_to_go,
    )


def test_multi_turn_episodes_train_one_row_each(tasks, executor, capsys):
    out = _collect_multi_turn(tasks, executor, ChainActor())
    assert out.metrics["rollout/episode_rows"] == 8.0 and out.metrics["rollout/phase_rows"] == 0.0
    assert len(out.samples) == len(out.episodes) == 8
    for row, e, advantages in zip(out.samples, out.episodes, out.advantages, strict=True):
        assert isinstance(row, EpisodeSample)
        last = e.replies[-1]
        assert row.prompt_ids + row.completion_ids == list(last.prompt_ids + last.token_ids)
        np.testing.assert_allclose(row.advantages, advantages)
        assert sorted(set(row.phases) - {0}) == list(range(1, len(e.replies) + 1))
    assert "[rollout]" not in capsys.readouterr().err
    # Replies whose prompts do not extend each other fall back to a row per step, said once.
    fallback = _collect_multi_turn(tasks, executor, ScriptedActor())
    assert fallback.metrics["rollout/phase_rows"] == len(fallback.samples) == 24
    assert all(isinstance(s, Sample) for s in fallback.samples)
    assert "24 steps trained one row each" in capsys.readouterr().err
