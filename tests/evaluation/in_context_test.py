"""In-context mode: one batched call, resumable records that scoring and metrics read."""

import json

import pytest

from pau_jax.env.episode import EpisodeConfig
from pau_jax.evaluation import in_context, metrics, score
from pau_jax.policy import scripted
from pau_jax.sandbox import Executor
from pau_jax.tasks import demo as demo_tasks


class Recording:
    """Answers every in-context prompt with a fixed description and records batch sizes."""

    def __init__(self):
        self.batches = []
        self.prompts = []

    def __call__(self, conversations):
        self.batches.append(len(conversations))
        self.prompts += [c[-1]["content"] for c in conversations]
        return [f"<think>hmm</think>Description: answer {i}" for i in range(len(conversations))]


@pytest.fixture(scope="module")
def executor():
    with Executor(workers=2) as ex:
        yield ex


@pytest.fixture(scope="module")
def specs(executor):
    return demo_tasks.demo_specs(executor, EpisodeConfig())


def test_one_batched_call_and_record_fields(specs):
    policy = Recording()
    records = in_context.run_in_context(specs, policy, progress=False)
    assert policy.batches == [4]
    assert "test_func(2, 3) -> 7" in policy.prompts[0] and "Your calls" not in policy.prompts[0]
    r = records[0]
    assert r["prediction"] == "answer 0" and r["n_calls"] == 0 and r["observations"] == []
    assert r["stopped_by_agent"] is None and r["steps"][0]["parse_ok"]
    summary = metrics.summarize(records)
    assert summary["stop_rate"] is None and summary["calls"]["mean"] == 0.0


def test_resume_skips_recorded_tasks_and_a_torn_line(specs, tmp_path):
    out = tmp_path / "ic.jsonl"
    first = in_context.run_in_context(specs[:2], Recording(), out_path=out, progress=False)
    assert len(first) == 2
    with out.open("a") as f:
        f.write('{"task_id": "demo/runs", "pred')
    policy = Recording()
    second = in_context.run_in_context(specs, policy, out_path=out, batch_size=1, progress=False)
    assert policy.batches == [1, 1]
    assert [r["task_id"] for r in second] == ["demo/runs", "demo/sorted"]
    lines = out.read_text().splitlines()
    assert len(lines) == 4 and all(json.loads(line) for line in lines)
    assert in_context.run_in_context(specs, Recording(), out_path=out, progress=False) == []


def test_records_score_like_episodes(specs, executor):
    _, references = demo_tasks.load(executor, EpisodeConfig())
    records = in_context.run_in_context(specs, scripted.OraclePolicy(specs), progress=False)
    scored = score.score_episodes(
        records, references, coder_policy=scripted.ScriptedCoder(), executor=executor
    )
    assert [r["code_match"] for r in scored] == [1.0] * 4
    assert all(r["source"] == "demo" for r in scored)


def test_bad_arguments(specs):
    with pytest.raises(ValueError, match="unique"):
        in_context.run_in_context([specs[0], specs[0]], Recording(), progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        in_context.run_in_context(specs, Recording(), batch_size=0, progress=False)
