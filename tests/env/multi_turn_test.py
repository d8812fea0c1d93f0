"""Multi-turn conversations: the fresh first prompt, then only what is new per phase; ids ride along."""

import dataclasses
import json

import pytest

from pau_jax.env import episode, prompts, runner, turns
from pau_jax.env.episode import EpisodeConfig, Phase
from pau_jax.env.prompts import Observation
from pau_jax.sandbox import Executor
from pau_jax.tasks import demo as demo_tasks

MULTI = EpisodeConfig(call_budget=3, conversation="multi_turn")


@dataclasses.dataclass
class FakeResult:
    ok: bool
    value: object = None
    error_type: str = ""
    error_message: str = ""


def _task():
    return episode.Task(
        task_id="t0",
        header="def test_func(arg0, arg1):",
        n_params=2,
        examples=(Observation(call="test_func(1, 2)", result="3"),),
        shown_args=((1, 2),),
    )


def _query(state, config, args_text="(2, 5)", revision="Hypothesis: adds\nDecision: CONTINUE"):
    """One conceptualise -> generate -> revise query; the conversation of each phase in order."""
    seen = [episode.messages(state, config)]
    state = episode.on_conceptualize(state, "try small numbers", config)
    seen.append(episode.messages(state, config))
    state, args = episode.on_generate(state, f"```\n{args_text}\n```", config)
    if args is not None:
        state = episode.on_result(state, FakeResult(ok=True, value=args[0] + args[1]), config)
    seen.append(episode.messages(state, config))
    state = episode.on_revise(state, revision, config)
    return state, seen


def test_the_first_prompt_is_the_fresh_one_and_each_turn_extends_the_last():
    fresh = EpisodeConfig(call_budget=3)
    start = episode.start(_task(), MULTI)
    assert episode.messages(start, MULTI) == episode.messages(episode.start(_task(), fresh), fresh)
    state, seen = _query(start, MULTI)
    state, more = _query(state, MULTI, "(0, 0)", "no label here")
    seen += more + [episode.messages(state, MULTI)]
    for before, after, step in zip(seen[:-1], seen[1:], state.steps, strict=True):
        assert after[: len(before)] == before  # a prefix, message by message
        assert after[len(before)] == {"role": "assistant", "content": step.output}
        assert len(after) == len(before) + 2 and after[-1]["role"] == "user"
    generate, revise, conceptualize = (seen[i][-1]["content"] for i in (1, 2, 3))
    assert generate.startswith("Now write the arguments") and "(5, 6)" not in seen[0][-1]["content"]
    assert "Result of your call:\ntest_func(2, 5) -> 7" in revise and "Calls left: 2" in revise
    assert revise.endswith("Decision: CONTINUE or STOP")
    assert conceptualize.startswith("Calls left: 2\n\nThink about which input")
    for turn in (generate, revise, conceptualize):  # only what is new
        assert "Function header" not in turn and "test_func(1, 2) -> 3" not in turn
    # A revision that could not be read says so, with the hypothesis the episode holds.
    unread = seen[6][-1]["content"]
    assert "could not be read (no decision found" in unread
    assert f"Current hypothesis:\n{state.hypothesis}" in unread
    # The recorded step messages are the conversations, plain text.
    assert [list(s.messages) for s in state.steps] == seen[:-1]


def test_the_released_reflection_shows_the_result_one_turn_later():
    config = dataclasses.replace(MULTI, reflection_sees_newest=False)
    state, seen = _query(episode.start(_task(), config), config)
    revise = seen[2][-1]["content"]
    assert "You just called:\ntest_func(2, 5)" in revise and "-> 7" not in revise
    late = episode.messages(state, config)[-1]["content"]
    assert late.startswith("Result of your last call:\ntest_func(2, 5) -> 7\n\n")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(conversation="multi_turn", history_window=5), "history_window=5 needs"),
        (dict(conversation="chat"), "conversation must be one of"),
    ],
)
def test_bad_settings_are_one_line_errors(fields, message):
    with pytest.raises(ValueError, match=message) as info:
        EpisodeConfig(**fields)
    assert "\n" not in str(info.value)


def test_prompt_versions_differ():
    assert prompts.PROMPT_VERSION == "pau-v2"
    assert prompts.MULTI_TURN_PROMPT_VERSION not in ("", prompts.PROMPT_VERSION)


@dataclasses.dataclass(frozen=True)
class Reply:
    text: str
    prompt_ids: tuple
    token_ids: tuple


class IdsPolicy:
    """Replies with made-up ids and records each conversation it was given."""

    def __init__(self):
        self.seen = []

    def complete(self, conversations, *, answers=None, stop=None):
        del answers, stop
        out = []
        for conversation in conversations:
            self.seen.append(conversation)
            content = conversation[-1]["content"]
            if "Now write the arguments" in content:
                text = "```\n(1, 1)\n```" if "2 literals" in content else "```\n'a'\n```"
            elif "Revise your hypothesis" in content:
                text = "Hypothesis: something\nDecision: CONTINUE"
            else:
                text = "a plan"
            out.append(Reply(text, (len(self.seen), 7), (len(self.seen), 8, 9)))
        return out


@pytest.fixture(scope="module")
def specs():
    with Executor(workers=2) as ex:
        yield ex, demo_tasks.demo_specs(ex, MULTI)[:2]


def test_the_runner_puts_the_last_replys_ids_on_its_message_and_records_plain_text(specs, tmp_path):
    executor, tasks = specs
    out = tmp_path / "episodes.jsonl"
    policy = IdsPolicy()
    finished = runner.run_episode_states(
        tasks, policy, executor, MULTI, out_path=out, progress=False
    )
    assert len(finished) == 2 and all(f.state.finish_reason == "budget" for f in finished)
    carried = [c for c in policy.seen if any(turns.TOKENS in m for m in c)]
    assert len(carried) == len(policy.seen) - 2  # every prompt but the first of each episode
    for conversation in carried:
        at, prompt_ids, reply_ids = turns.last_tokens(conversation)
        assert at == len(conversation) - 2
        assert [m for m in conversation if turns.TOKENS in m] == [conversation[at]]
    replies = {id(r): r for f in finished for r in f.replies}
    assert len(replies) == sum(len(f.state.steps) for f in finished)
    for line in out.read_text().splitlines():
        for step in json.loads(line)["steps"]:
            assert all(set(m) == {"role", "content"} for m in step["messages"])
    # Resumable: a rerun over the same file has nothing left to do.
    again = IdsPolicy()
    assert runner.run_episode_states(tasks, again, executor, MULTI, out_path=out) == []
    assert again.seen == []


def test_fresh_conversations_carry_no_ids(specs):
    executor, tasks = specs
    policy = IdsPolicy()
    config = EpisodeConfig(call_budget=2)
    runner.run_episode_states(tasks, policy, executor, config, progress=False)
    assert all(len(c) == 2 and turns.TOKENS not in c[-1] for c in policy.seen)


def test_with_tokens_only_marks_the_message_holding_the_replys_text():
    conversation = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "r"},
        {"role": "user", "content": "q2"},
    ]
    marked = turns.with_tokens(conversation, Reply("r", (1, 2), (3,)))
    assert marked[1][turns.TOKENS] == {"prompt_ids": (1, 2), "reply_ids": (3,)}
    assert turns.TOKENS not in conversation[1]  # the input is not changed
    assert turns.plain(marked) == conversation
    assert turns.with_tokens(conversation, Reply("other", (1,), (3,))) == conversation
    assert turns.with_tokens(conversation, "r") == conversation
    assert turns.last_tokens(marked[:2]) is None  # nothing follows the reply yet
    assert Phase.GENERATE.value == "generate"
