"""Scripted policies on the debug split with the real sandbox: the oracle is perfect, random probing is not."""

import pytest

from pau_jax.env import episode, runner
from pau_jax.env.answer_shape import AnswerShape
from pau_jax.env.episode import EpisodeConfig
from pau_jax.evaluation import code_match, in_context, score
from pau_jax.policy import scripted
from pau_jax.sandbox import Executor
from pau_jax.tasks import demo as demo_tasks
from pau_jax.tasks import pau_dataset as tasks

CONFIG = EpisodeConfig(call_budget=5)


@pytest.fixture(scope="module")
def executor():
    with Executor(workers=2) as ex:
        yield ex


@pytest.fixture(scope="module")
def debug_split(tmp_path_factory):
    data_dir = tasks.ensure_built(tmp_path_factory.mktemp("tfds"))
    records = tasks.load_split("debug", "test", data_dir)
    assert len(records) >= 8
    return tasks.from_records(records, CONFIG)


def _score(specs, references, policy, executor, with_observations=False):
    records = runner.run_episodes(specs, policy, executor, CONFIG, progress=False)
    scored = score.score_episodes(
        records,
        references,
        coder_policy=scripted.ScriptedCoder(),
        executor=executor,
        with_observations=with_observations,
    )
    return {r["task_id"]: r for r in scored}


def test_oracle_matches_every_item_and_random_prober_does_worse(debug_split, executor):
    specs, references = debug_split
    oracle = _score(specs, references, scripted.OraclePolicy(specs), executor)
    assert {t: r["code_match"] for t, r in oracle.items()} == {t: 1.0 for t in references}
    assert all(r["finish_reason"] == "stop" and r["n_calls"] == 3 for r in oracle.values())
    # Every probe the oracle wrote was a valid input.
    assert all(s["parse_ok"] for r in oracle.values() for s in r["steps"])

    randomly = _score(specs, references, scripted.RandomProber(seed=0), executor, True)
    mean = sum(r["code_match"] for r in randomly.values()) / len(randomly)
    # Measured on the debug split (10 items, budget 5): 0.01.
    assert mean < 0.5
    assert all(r["finish_reason"] == "budget" and r["n_calls"] == 5 for r in randomly.values())
    steps = [s for r in randomly.values() for s in r["steps"] if s["phase"] == "generate"]
    assert all(s["parse_ok"] for s in steps)


def test_random_prober_is_seeded_and_batch_independent(executor):
    specs = demo_tasks.demo_specs(executor, CONFIG)
    batched = runner.run_episodes(
        specs, scripted.RandomProber(seed=3), executor, CONFIG, progress=False
    )
    single = []
    for spec in specs:
        single += runner.run_episodes(
            [spec], scripted.RandomProber(seed=3), executor, CONFIG, progress=False
        )
    calls = lambda rs: {r["task_id"]: [o["call"] for o in r["observations"]] for r in rs}  # noqa: E731
    assert calls(batched) == calls(single)
    other = runner.run_episodes(
        specs, scripted.RandomProber(seed=4), executor, CONFIG, progress=False
    )
    assert calls(other) != calls(batched)
    # Arguments have the types of the examples: the affine task gets two ints.
    for call in calls(batched)["demo/affine"]:
        args = scripted._parse_call(call, 2)
        assert [type(a) for a in args] == [int, int]


def test_oracle_in_context_states_the_source(executor):
    specs = demo_tasks.demo_specs(executor, CONFIG)
    records = in_context.run_in_context(specs, scripted.OraclePolicy(specs), progress=False)
    by_code = {s.task.task_id: s.code for s in specs}
    for r in records:
        assert code_match.extract_code(r["prediction"]).strip() == by_code[r["task_id"]].strip()


def test_oracle_rejects_an_unknown_task(executor):
    specs = demo_tasks.demo_specs(executor, CONFIG)
    oracle = scripted.OraclePolicy(specs[:1])
    state = episode.start(specs[1].task, CONFIG)
    with pytest.raises(KeyError, match="does not know"):
        oracle([episode.messages(state, CONFIG)])


def test_lookup_table_code_answers_observed_calls(executor):
    lines = [
        "test_func([1, 2], 'a') -> (3, 'a')",
        "test_func([], 'b') -> TypeError: empty",
        "test_func(?) -> InputParseError: bad",
        "not a call",
    ]
    code = scripted.lookup_table_code("def test_func(arg0, arg1):", lines)
    ok = executor.call(code, ([1, 2], "a"))
    assert ok.ok and ok.value == (3, "a") and type(ok.value) is tuple
    err = executor.call(code, ([], "b"))
    assert not err.ok and err.error_type == "TypeError"
    # Typed lookup: a tuple argument is not the list that was observed.
    assert executor.call(code, ((1, 2), "a")).value is None


def test_scripted_coder_prefers_fenced_code_then_table():
    fenced = code_match.coder_messages(
        "def test_func(arg0):", "it is\n```python\ndef test_func(arg0):\n    return 1\n```"
    )
    table = code_match.coder_messages(
        "def test_func(arg0):", "no idea", ["test_func(2) -> 4", "test_func(3) -> 9"]
    )
    out = scripted.ScriptedCoder()([fenced, table])
    assert code_match.extract_code(out[0]) == "def test_func(arg0):\n    return 1\n"
    assert "((2,), 'return', 4)" in out[1] and "((3,), 'return', 9)" in out[1]


def test_overlap_judge_rates_by_words():
    from pau_jax.evaluation import judge

    out = judge.judge(
        scripted.OverlapJudge(),
        [("Counts the vowels in a string.", "Counts the vowels in a string."), ("adds", "sorts")],
    )
    assert [r.score for r in out] == [5, 1]


def test_complete_cuts_at_stop_strings_and_ignores_answer_shapes():
    coder = scripted.ScriptedCoder()
    messages = code_match.coder_messages("def test_func(arg0):", "```python\nreturn 1\n```")
    (full,) = coder([messages])
    assert coder.complete([messages], answers=[AnswerShape("decision")]) == [full]
    cut = coder.complete([messages, messages], stop=[["return", "\n"], []])
    assert cut == ["```python", full]  # before the first of the strings
