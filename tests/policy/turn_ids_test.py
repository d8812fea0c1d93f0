"""Multi-turn prompt ids of LocalPolicy: each phase's prompt a token prefix of the next.

A tiny random Qwen3 over the offline Qwen3 tokenizer plays real multi-turn episodes;
the real-model tier (`tests/real_model/multi_turn_ids_test.py`) checks the same with
the SmolLM2 and Qwen2.5 tokenizers.
"""

import checkpoints
import pytest
from flax import nnx

from pau_jax.env import runner, turns
from pau_jax.env.episode import EpisodeConfig
from pau_jax.models import qwen3
from pau_jax.policy import turn_ids
from pau_jax.policy.config import SamplingConfig
from pau_jax.policy.local import LocalPolicy
from pau_jax.sandbox import Executor
from pau_jax.tasks import demo as demo_tasks

IM_END = 151645
MULTI = EpisodeConfig(call_budget=2, max_steps=6, conversation="multi_turn")


@pytest.fixture(scope="module")
def policy():
    from pau_jax.tokenizer import load_tokenizer

    config = checkpoints.tiny_qwen3_config(max_position_embeddings=4096)
    model = qwen3.Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    sampling = SamplingConfig(max_new_tokens=10, temperature=1.0, seed=2)
    return LocalPolicy(model, load_tokenizer("qwen3-offline"), sampling, prefix_cache=None)


def check_episode(policy, replies, conversations):
    """Asserts the multi-turn properties of one episode's replies and the conversations sent.

    Args:
      policy: the `LocalPolicy` that answered.
      replies: per phase, its `Completion`.
      conversations: per phase, the conversation the policy was given (ids attached).
    """
    first = conversations[0]
    assert list(replies[0].prompt_ids) == policy.encode(turns.plain(first))  # today's ids
    final = list(replies[-1].prompt_ids) + list(replies[-1].token_ids)
    for phase, (reply, nxt, conversation) in enumerate(
        zip(replies, replies[1:], conversations[1:]), 1
    ):
        grown = list(reply.prompt_ids) + list(reply.token_ids)
        assert list(nxt.prompt_ids[: len(grown)]) == grown, f"phase {phase}"
        assert final[: len(reply.prompt_ids)] == list(reply.prompt_ids)
        end, text = turn_ids.appended_text(
            policy._render, turns.plain(conversation), len(conversation) - 2, policy._end_texts
        )
        rest = list(nxt.prompt_ids[len(grown) :])
        if reply.token_ids[-1] != policy.tokenizer.convert_tokens_to_ids(end):
            assert rest[0] == policy.tokenizer.convert_tokens_to_ids(end)  # the end written
            rest = rest[1:]
        assert policy.tokenizer.decode(rest) == text  # the appended text, as the template writes it
        assert text.endswith(policy._render([{"role": "user", "content": "x"}], True)[-22:])
        assert conversation[-1]["content"] in text


class Recording:
    """The policy, recording every conversation `complete` is given."""

    def __init__(self, policy):
        self.policy = policy
        self.seen = []

    def complete(self, conversations, *, answers=None, stop=None):
        self.seen.extend(conversations)
        return self.policy.complete(conversations, answers=answers, stop=stop)


def _run(policy, config, n_tasks=2):
    actor = Recording(policy)
    with Executor(workers=2) as ex:
        specs = demo_tasks.demo_specs(ex, config)[:n_tasks]
        finished = runner.run_episode_states(specs, actor, ex, config, progress=False)
    return finished, actor.seen


def test_every_prompt_extends_the_previous_prompt_and_reply_by_ids(policy):
    finished, seen = _run(policy, MULTI)
    assert all(len(f.replies) >= 4 for f in finished)
    by_first = {}
    for conversation in seen:
        by_first.setdefault(conversation[1]["content"], []).append(conversation)
    budget_hit = 0
    for f in finished:
        conversations = by_first[f.state.steps[0].messages[1]["content"]]
        check_episode(policy, f.replies, conversations)
        budget_hit += sum(r.token_ids[-1] != IM_END for r in f.replies)
    assert budget_hit > 0  # the end-of-turn id was written after a reply cut by its budget


def test_a_reply_ending_with_its_end_of_turn_is_not_closed_twice(policy):
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Plan?"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "Go."},
    ]
    ok = policy.tokenizer.encode("ok", add_special_tokens=False)
    prompt = policy.encode(conversation[:2])
    for reply in (ok + [IM_END], ok):
        marked = turns.with_tokens(
            conversation, type("R", (), dict(text="ok", prompt_ids=prompt, token_ids=reply))
        )
        ids = policy.encode(marked)
        assert ids[: len(prompt) + len(ok) + 1] == prompt + ok + [IM_END]
        assert ids[len(prompt) + len(ok) + 1] != IM_END
        # Qwen3's generation prompt holds an empty reasoning block, which the template drops
        # from earlier turns: the ids keep what the model saw, not the re-rendered text.
        assert "<think>" in policy.tokenizer.decode(prompt[-6:])
        assert ids != policy.encode(conversation)


def test_fresh_episodes_are_not_prefixes(policy):
    finished, _ = _run(policy, EpisodeConfig(call_budget=2, max_steps=6), n_tasks=1)
    replies = finished[0].replies
    grown = list(replies[0].prompt_ids) + list(replies[0].token_ids)
    assert list(replies[1].prompt_ids[: len(grown)]) != grown
