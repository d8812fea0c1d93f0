"""PrivilegedTeacher: the wrapped policy sees the gold answer, the recorded prompts do not."""

import dataclasses

import pytest

from pau_jax.env import episode, runner
from pau_jax.env.answer_shape import AnswerShape
from pau_jax.env.episode import EpisodeConfig
from pau_jax.policy.scripted import RandomProber
from pau_jax.sandbox import Executor
from pau_jax.sft import teacher
from pau_jax.sft.pairs import samples_from_records
from pau_jax.sft.teacher import PrivilegedTeacher
from pau_jax.tasks import TaskReference
from pau_jax.tasks import demo as demo_tasks
from pau_jax.tokenizer import load_tokenizer


class Recorder:
    """A random prober that keeps every conversation it is sent."""

    def __init__(self):
        self.seen: list[list[dict]] = []
        self.prober = RandomProber(seed=1)

    def complete(self, conversations, *, answers=None, stop=None):
        self.seen.extend(conversations)
        return self.prober.complete(conversations, answers=answers, stop=stop)

    def __call__(self, conversations):
        return self.complete(conversations)


@pytest.fixture(scope="module")
def specs():
    with Executor(workers=2) as executor:
        specs = demo_tasks.demo_specs(executor, EpisodeConfig())
        yield specs, executor


def _references(specs):
    by_id = {t.task_id: t for t in demo_tasks.DEMO_TASKS}
    return {
        s.task.task_id: TaskReference(description=by_id[s.task.task_id].description) for s in specs
    }


def test_teacher_prompts_carry_the_description_and_records_do_not(specs):
    specs, executor = specs
    descriptions = {t.task_id: t.description for t in demo_tasks.DEMO_TASKS}
    recorder = Recorder()
    policy = PrivilegedTeacher(recorder, specs, _references(specs))
    config = EpisodeConfig(call_budget=2)
    records = runner.run_episodes(specs, policy, executor, config, progress=False)
    assert len(records) == 4
    # Three tasks share the header `def test_func(arg0):`; the examples tell them apart.
    assert len({s.task.header for s in specs}) == 2
    by_header_and_examples = {
        teacher.task_text(s.task.header, s.task.examples): s.task.task_id for s in specs
    }
    assert recorder.seen
    for conversation in recorder.seen:
        text = "\n".join(m["content"] for m in conversation)
        task_id = next(t for key, t in by_header_and_examples.items() if key in text)
        assert conversation[0]["role"] == "system"
        assert descriptions[task_id] in conversation[0]["content"]
        assert teacher.PRIVILEGED_HEADER in conversation[0]["content"]
        others = [d for t, d in descriptions.items() if t != task_id]
        assert not any(d in text for d in others)
        assert "def test_func" not in conversation[0]["content"]  # no source unless asked
    for record in records:
        dumped = repr(record)
        assert not any(d in dumped for d in descriptions.values())
        assert teacher.PRIVILEGED_HEADER not in dumped
        assert record["n_steps"] > 0


def test_code_is_added_on_request_and_the_input_is_not_modified(specs):
    specs, _ = specs
    refs = _references(specs)
    policy = PrivilegedTeacher(lambda convs: ["ok"] * len(convs), specs, refs, show_code=True)
    spec = next(s for s in specs if s.task.task_id == "demo/runs")
    conversation = episode.messages(episode.start(spec.task, EpisodeConfig()), EpisodeConfig())
    original = [dict(m) for m in conversation]
    assert policy([conversation]) == ["ok"]
    assert conversation == original
    system = policy.sent[0][0]["content"]
    assert "Run-length encodes" in system and spec.code.strip() in system


def test_unknown_tasks_and_conflicting_references_fail_clearly(specs):
    specs, _ = specs
    refs = _references(specs)
    policy = PrivilegedTeacher(lambda convs: ["ok"] * len(convs), specs[:1], refs)
    with pytest.raises(ValueError, match="no reference matches"):
        policy([[{"role": "user", "content": "def test_func(x): ..."}]])
    twin = dataclasses.replace(
        specs[0], task=dataclasses.replace(specs[0].task, task_id="twin"), episode_id="twin"
    )
    clash = {**refs, "twin": TaskReference(description="other")}
    with pytest.raises(ValueError, match="differ in their answer"):
        PrivilegedTeacher(lambda c: c, [specs[0], twin], clash)
    with pytest.raises(ValueError, match="has no reference"):
        PrivilegedTeacher(lambda c: c, [twin], refs)
    with pytest.raises(ValueError, match="at least one task"):
        PrivilegedTeacher(lambda c: c, [], refs)


def test_sft_pairs_from_teacher_records_hold_the_unprivileged_prompt(specs):
    specs, executor = specs
    tokenizer = load_tokenizer("qwen3-offline")
    policy = PrivilegedTeacher(Recorder(), specs, _references(specs))
    records = runner.run_episodes(
        specs[:2], policy, executor, EpisodeConfig(call_budget=1), progress=False
    )
    pairs = samples_from_records(records, tokenizer)
    assert len(pairs) == sum(r["n_steps"] for r in records)
    for pair in pairs:
        prompt = tokenizer.decode(pair.prompt_ids)
        assert "Privileged information" not in prompt
        assert "Function header" in prompt


def test_the_teacher_passes_answer_shapes_and_stop_strings_to_the_wrapped_policy(specs):
    specs, _ = specs
    seen = []

    class Shapes:
        def complete(self, conversations, *, answers=None, stop=None):
            seen.append((conversations, answers, stop))
            return ["reply"] * len(conversations)

    policy = PrivilegedTeacher(Shapes(), specs, _references(specs))
    conversation = episode.messages(episode.start(specs[0].task, EpisodeConfig()), EpisodeConfig())
    shape = AnswerShape("decision")
    assert policy.complete([conversation], answers=[shape], stop=[["END"]]) == ["reply"]
    ((sent,), answers, stop) = seen[0]
    assert answers == [shape] and stop == [["END"]]
    assert "Privileged information" in sent[0]["content"] and sent == policy.sent[0]
