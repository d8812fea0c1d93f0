"""SmolLM2-135M-Instruct plays PAU: the same greedy episodes through the local backend and the server.

A real trained model (not random weights) through the whole evaluation path: chat
template, stop tokens, the three phase prompts and their parsers, judge and coder
prompts (the model grades itself here, and the run says so), the JAX sampler, and
pau_jax's OpenAI-compatible server with the HTTP client.
"""

import json

import pytest

from pau_jax.evaluation import pipeline
from pau_jax.evaluation.score import ScoringConfig
from pau_jax.policy import backends
from pau_jax.policy.config import SamplingConfig
from pau_jax.policy.http import HTTPConfig
from pau_jax.tasks import DatasetConfig

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

TASKS = 3
BUDGET = 2
NEW_TOKENS = 48
PHASES = ("conceptualize", "generate", "revise")


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _evaluate(run_dir, policy, data_dir):
    return pipeline.evaluate(
        run_dir=str(run_dir),
        policy=policy,
        judge="self",
        coder="self",
        dataset=DatasetConfig(config="debug", data_dir=str(data_dir), limit=TASKS),
        episode_config=pipeline.EpisodeConfig(call_budget=BUDGET),
        scoring=ScoringConfig(bootstrap_resamples=200),
        sandbox_workers=2,
    )


def _trajectories(run_dir):
    return {
        r["task_id"]: [(s["phase"], s["output"]) for s in r["steps"]]
        for r in _jsonl(run_dir / "interactive_episodes.jsonl")
    }


def test_local_and_served_smollm2_play_the_same_greedy_episodes(checkpoint, data_dir, tmp_path):
    from pau_jax import models
    from pau_jax.policy.local import LocalPolicy
    from pau_jax.policy.server import PolicyServer
    from pau_jax.tokenizer import load_tokenizer

    sampling = SamplingConfig(max_new_tokens=NEW_TOKENS)
    local = backends.LocalBackendConfig(checkpoint_dir=str(checkpoint), sampling=sampling)
    result = _evaluate(tmp_path / "local", local, data_dir)

    model, _ = models.load_hf(checkpoint)
    policy = LocalPolicy(model, load_tokenizer(checkpoint), sampling)
    with PolicyServer(policy, model_name="smollm2") as server:
        http = HTTPConfig(base_url=server.base_url, model="smollm2", max_tokens=NEW_TOKENS)
        served = _evaluate(tmp_path / "served", backends.HTTPBackendConfig(http=http), data_dir)
    assert served["backend_failures"] == {"policy": 0, "judge": 0, "coder": 0}

    # Greedy decoding: the same replies, step by step, whichever way the model is reached.
    local_steps, served_steps = (
        _trajectories(tmp_path / "local"),
        _trajectories(tmp_path / "served"),
    )
    assert len(local_steps) == TASKS and local_steps == served_steps

    for run, found in (("local", result), ("served", served)):
        assert found["grading"]["self_graded"] is True
        summary = found["runs"]["interactive"]
        # Every episode finished, within the budget, by STOP or by the budget.
        assert summary["episodes"] == TASKS
        assert set(summary["finish_reasons"]) <= {"stop", "budget"}
        assert 1 <= summary["calls"]["mean"] <= BUDGET
        # The parse-failure rate of each phase is recorded (values in [0, 1]).
        rates = summary["parse_failure_rate"]
        assert set(rates) == set(PHASES) and all(0.0 <= v <= 1.0 for v in rates.values())
        metrics = json.loads((tmp_path / run / "metrics.json").read_text())
        assert metrics["runs"]["interactive"]["parse_failure_rate"] == rates
        # The record files are complete: every episode, every step, every score.
        episodes = _jsonl(tmp_path / run / "interactive_episodes.jsonl")
        scored = _jsonl(tmp_path / run / "interactive_scored.jsonl")
        assert len(episodes) == len(scored) == TASKS
        for record in episodes:
            assert record["n_steps"] == len(record["steps"]) >= 3
            assert [s["phase"] for s in record["steps"][:3]] == list(PHASES)
            for step in record["steps"]:
                assert step["messages"] and isinstance(step["output"], str)
        for record in scored:
            assert record["code_match"] is None or 0.0 <= record["code_match"] <= 1.0
            assert record["predicted_code"] and record["judge_raw"] is not None
        assert (
            (tmp_path / run / "report.md").read_text().splitlines()[2].startswith("**Self-graded**")
        )
    print(
        "SmolLM2 parse-failure rates:",
        result["runs"]["interactive"]["parse_failure_rate"],
        "calls:",
        result["runs"]["interactive"]["calls"]["mean"],
    )
