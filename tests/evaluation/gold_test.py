"""The gold baseline: code from the gold description and the two shown examples, beside every run."""

import checkpoints
import pytest

from pau_jax.env import runner
from pau_jax.evaluation import pipeline
from pau_jax.evaluation.score import ScoringConfig
from pau_jax.policy import backends, scripted
from pau_jax.tasks import DatasetConfig
from pau_jax.tasks import pau_dataset as tasks


class RecordingCoder:
    """The scripted coder, recording the prompts it is given."""

    def __init__(self):
        self.coder = scripted.ScriptedCoder()
        self.prompts = []

    def complete(self, conversations, *, answers=None, stop=None):
        return self(conversations)

    def __call__(self, conversations):
        self.prompts += [c[-1]["content"] for c in conversations]
        return self.coder(conversations)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tasks.ensure_built(tmp_path_factory.mktemp("tfds"))


def test_the_coder_sees_the_gold_description_and_the_two_shown_examples(
    data_dir, tmp_path, monkeypatch
):
    coder_config = backends.ScriptedCoderBackendConfig()
    coder = RecordingCoder()
    build = backends.Backends.build
    monkeypatch.setattr(
        backends.Backends, "build", lambda self, b: coder if b == coder_config else build(self, b)
    )
    dataset = DatasetConfig(config="debug", data_dir=str(data_dir))
    result = pipeline.evaluate(
        run_dir=str(tmp_path),
        policy=backends.LocalBackendConfig(checkpoint_dir=None),  # never loaded for gold alone
        dataset=dataset,
        modes=("gold",),
        coder=coder_config,  # no judge: gold is not judged
        scoring=ScoringConfig(bootstrap_resamples=200),
    )
    records = tasks.load_split("debug", "test", data_dir)
    described = [r for r in records if r.description]
    assert 0 < len(described) < len(records)  # CRUXEval items have no gold description
    assert len(coder.prompts) == len(described)
    for record, prompt in zip(described, coder.prompts, strict=True):
        shown = "\n".join(tasks.to_reference(record).examples)
        assert len(record.shown) == 2 and len(shown.splitlines()) == 2
        assert f"Description: {record.description}\n" in prompt
        assert f"Observed calls:\n{shown}\nAnswer with" in prompt
    scored = {r["task_id"]: r for r in runner.load_records(tmp_path / "gold_scored.jsonl")}
    assert set(scored) == {r.task_id for r in records}
    for record in records:
        row = scored[record.task_id]
        assert row["prediction"] == record.description
        assert row.get("gold_missing", False) == (not record.description)
        assert (row["code_match"] is None) == (not record.description)
        assert row["judge_skipped"] and "failure_by" not in row
    assert (
        result["grading"]["judge"].startswith("not used") and not result["grading"]["self_graded"]
    )
    gold = result["runs"]["gold"]
    assert gold["episodes"] == len(records) and gold["judge"]["n"] == 0
    assert gold["code_match"]["missing"] == len(records) - len(described)
    # A rerun scores nothing again.
    pipeline.evaluate(
        run_dir=str(tmp_path), policy=None, dataset=dataset, modes=("gold",), coder=coder_config
    )
    assert len(coder.prompts) == len(described)


class GoldAwareCoder:
    """Writes each demo function's true code when given its gold description, else `return 0`."""

    def complete(self, conversations, *, answers=None, stop=None):
        return self(conversations)

    def __call__(self, conversations):
        from pau_jax.tasks import demo as demo_tasks

        out = []
        for c in conversations:
            code = "def test_func(*args):\n    return 0\n"
            for task in demo_tasks.DEMO_TASKS:
                if f"Description: {task.description}\n" in c[-1]["content"]:
                    code = task.code
            out.append(f"```python\n{code}```")
        return out


def test_gold_is_reported_beside_the_other_runs(tmp_path, monkeypatch):
    coder_config = backends.ScriptedCoderBackendConfig()
    build = backends.Backends.build
    monkeypatch.setattr(
        backends.Backends,
        "build",
        lambda self, b: GoldAwareCoder() if b == coder_config else build(self, b),
    )
    result = pipeline.evaluate(
        run_dir=str(tmp_path),
        policy=backends.RandomProberBackendConfig(seed=1),
        modes=("in_context", "gold"),
        judge=backends.ScriptedJudgeBackendConfig(),
        coder=coder_config,
        scoring=ScoringConfig(bootstrap_resamples=200),
    )
    gold = result["runs"]["gold"]["code_match"]["mean"]
    assert gold == 1.0
    in_context = result["runs"]["in_context"]["code_match"]["mean"]
    assert result["gold"]["code_match_mean"] == gold
    assert result["gold"]["share_of_gold"]["in_context"] == pytest.approx(in_context / gold)
    report = (tmp_path / "report.md").read_text()
    assert "| gold | 4 |" in report
    assert f"each run's code match as a share of it: in_context {in_context / gold:.0%}" in report


def test_gold_with_a_tiny_checkpoint_as_coder(data_dir, tmp_path):
    from flax import nnx

    from pau_jax.models import qwen3
    from pau_jax.policy.config import SamplingConfig

    config = checkpoints.tiny_qwen3_config(max_position_embeddings=2048)
    qwen3.save_hf(qwen3.Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)), config, tmp_path / "ckpt")
    coder = backends.LocalBackendConfig(
        checkpoint_dir=str(tmp_path / "ckpt"),
        tokenizer="qwen3-offline",
        sampling=SamplingConfig(max_new_tokens=8),
    )
    result = pipeline.evaluate(
        run_dir=str(tmp_path / "run"),
        policy=None,
        dataset=DatasetConfig(config="debug", data_dir=str(data_dir), limit=5),
        modes=("gold",),
        coder=coder,
        scoring=ScoringConfig(bootstrap_resamples=200),
    )
    scored = runner.load_records(tmp_path / "run" / "gold_scored.jsonl")
    described = [r for r in scored if not r.get("gold_missing")]
    # The items with a gold description: HumanEval/MBPP text, or a shipped verified one.
    by_id = {r.task_id: r for r in tasks.load_split("debug", "test", data_dir)}
    expected = [r["task_id"] for r in scored if by_id[r["task_id"]].description]
    assert len(scored) == 5 and [r["task_id"] for r in described] == expected and expected
    assert all(r["predicted_code"].strip() for r in described)
    assert result["runs"]["gold"]["code_match"]["n"] == len(expected)
    assert result["grading"]["coder"].startswith("checkpoint")
