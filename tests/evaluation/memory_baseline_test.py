"""The memory baseline on pau/debug: retrieval, critiques, the merged critique and the second episode."""

import json
import socket

import checkpoints
import numpy as np
import pytest

from pau_jax import run_claim
from pau_jax.env import runner
from pau_jax.evaluation import memory_baseline as memory
from pau_jax.evaluation import memory_prompts, pipeline
from pau_jax.evaluation.score import ScoringConfig
from pau_jax.policy import backends, embeddings, scripted
from pau_jax.tasks import DatasetConfig
from pau_jax.tasks import pau_dataset as tasks

LIMIT, TOP_K = 4, 2


class Agent:
    """A scripted agent: random probes in episodes, labelled critiques; records every prompt."""

    def __init__(self):
        self.prober = scripted.RandomProber(seed=3)
        self.prompts: list[str] = []

    def _answer(self, conversation):
        content = conversation[-1]["content"]
        self.prompts.append(content)
        if "Held-out calls showing its true behaviour" in content:
            header = content.split("Function header:\n", 1)[1].split("\n", 1)[0]
            return f"Some thoughts.\nCritique: for {header} try empty inputs"
        if "Merge them into one short critique" in content:
            merged = content.split("really did:\n", 1)[1].split("\n\nMerge", 1)[0]
            return "Critique: MERGED<" + merged.replace("\n", " | ") + ">"
        return self.prober([conversation])[0]

    def complete(self, conversations, *, answers=None, stop=None):
        del answers, stop  # scripted
        return [self._answer(c) for c in conversations]

    def __call__(self, conversations):
        return self.complete(conversations)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from flax import nnx

    from pau_jax.models import qwen3

    data_dir = tasks.ensure_built(tmp_path_factory.mktemp("tfds"))
    path = tmp_path_factory.mktemp("embedding")
    config = checkpoints.tiny_qwen3_config(max_position_embeddings=2048)
    qwen3.save_hf(qwen3.Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)), config, path)
    embedder = embeddings.LocalEmbeddingConfig(
        checkpoint_dir=str(path), tokenizer="qwen3-offline", pad_to_multiple=256
    )
    return data_dir, embedder


def _evaluate(run_dir, data_dir, embedder, agent, monkeypatch, top_k=TOP_K, **kwargs):
    agent_config = backends.RandomProberBackendConfig(seed=3)
    build = backends.Backends.build
    monkeypatch.setattr(
        backends.Backends, "build", lambda self, b: agent if b == agent_config else build(self, b)
    )
    return pipeline.evaluate(
        run_dir=str(run_dir),
        policy=agent_config,
        dataset=DatasetConfig(config="debug", data_dir=str(data_dir), limit=LIMIT),
        modes=("interactive", "memory", "gold"),
        baselines={
            "memory": memory.MemoryConfig(embedder=embedder, top_k=top_k, max_held_out_shown=3)
        },
        judge=backends.ScriptedJudgeBackendConfig(),
        coder=backends.ScriptedCoderBackendConfig(),
        episode_config=pipeline.EpisodeConfig(call_budget=2),
        scoring=ScoringConfig(bootstrap_resamples=200),
        **kwargs,
    )


def _jsonl(path):
    return runner.load_records(path)


def test_memory_mode_end_to_end_and_resume(setup, tmp_path, monkeypatch):
    data_dir, embedder_config = setup
    agent = Agent()
    result = _evaluate(tmp_path, data_dir, embedder_config, agent, monkeypatch)
    first = {r["task_id"]: r for r in _jsonl(tmp_path / "interactive_episodes.jsonl")}
    second = {r["task_id"]: r for r in _jsonl(tmp_path / "memory_episodes.jsonl")}
    assert len(first) == len(second) == LIMIT

    # Retrieval, by hand: unit embeddings of the train gold descriptions and the first predictions.
    records = tasks.load_split("debug", "train", data_dir)
    train_ids = [r.task_id for r in records]
    embedder = embeddings.build_embedder(embedder_config)
    keys = embedder.embed([r.description for r in records])
    retrieval = {r["task_id"]: r for r in _jsonl(tmp_path / "memory" / "retrieval.jsonl")}
    assert list(retrieval) == list(first)
    queries = embedder.embed([first[t]["prediction"] for t in retrieval])
    for row, query in zip(retrieval.values(), queries, strict=True):
        expected = [train_ids[i] for i in np.argsort(-(keys @ query), kind="stable")[:TOP_K]]
        assert row["retrieved"] == expected

    # One critique per retrieved train item, from an episode on it and its truth.
    critiques = {r["task_id"]: r for r in _jsonl(tmp_path / "memory" / "critiques.jsonl")}
    train_episodes = {r["task_id"]: r for r in _jsonl(tmp_path / "memory" / "train_episodes.jsonl")}
    retrieved = {t for row in retrieval.values() for t in row["retrieved"]}
    assert set(critiques) == set(train_episodes) == retrieved
    by_id = {r.task_id: r for r in records}
    for train_id, row in critiques.items():
        prompt = row["messages"][-1]["content"]
        assert f"What the function actually does:\n{by_id[train_id].description}" in prompt
        held = prompt.split("true behaviour:\n", 1)[1].split("\n\n", 1)[0].splitlines()
        assert len(held) == 3 and held[0].startswith("test_func(")  # max_held_out_shown
        tried = prompt.split("then your own):\n", 1)[1].split("\n\n", 1)[0].splitlines()
        assert len(tried) == 2 + train_episodes[train_id]["n_calls"]
        assert f"Your final description:\n{train_episodes[train_id]['prediction']}" in prompt
        assert row["critique"] == f"for {by_id[train_id].header} try empty inputs"

    for task_id, record in second.items():
        # The merged critique of this task's own retrieved items is in every reasoning prompt.
        parts = [critiques[t]["critique"] for t in retrieval[task_id]["retrieved"]]
        merged = "MERGED<" + " | ".join(f"{i}. {c}" for i, c in enumerate(parts, 1)) + ">"
        assert record["critique"] == merged
        steps = record["steps"]
        for step in steps:
            content = step["messages"][-1]["content"]
            assert (merged in content) == (step["phase"] == "conceptualize")
        # It starts from the first prediction and shows the first run's calls.
        opening = steps[0]["messages"][-1]["content"]
        assert f"Current hypothesis:\n{first[task_id]['prediction']}" in opening
        assert record["initial_hypothesis"] == first[task_id]["prediction"]
        earlier = "\n".join(f"{o['call']} -> {o['result']}" for o in first[task_id]["observations"])
        assert f"earlier attempt on this function:\n{earlier}\n\nExamples" in opening
        assert record["n_calls"] == 2  # a fresh budget

    assert set(result["runs"]) == {"interactive", "memory", "gold"}
    assert result["runs"]["memory"]["episodes"] == LIMIT
    assert "memory vs interactive" in result["comparisons"]
    assert result["baselines"]["memory"]["top_k"] == TOP_K
    report = (tmp_path / "report.md").read_text()
    assert "| memory | 4 |" in report and "| gold | 4 |" in report
    # The first 4 are CRUXEval items: gold scores those with a shipped verified description.
    tests_by_id = {r.task_id: r for r in tasks.load_split("debug", "test", data_dir)}
    with_gold = sum(bool(tests_by_id[t].description) for t in first)
    if with_gold:
        assert result["runs"]["gold"]["code_match"]["n"] == with_gold
    else:
        assert "gold: no task has a gold description" in report

    # A rerun does nothing; a lost second episode and its merged critique are redone alone.
    n = len(agent.prompts)
    _evaluate(tmp_path, data_dir, embedder_config, agent, monkeypatch)
    assert len(agent.prompts) == n
    lost = list(second)[-1]
    for name in ("memory_episodes.jsonl", "memory/summaries.jsonl"):
        path = tmp_path / name
        kept = [
            line for line in path.read_text().splitlines() if json.loads(line)["task_id"] != lost
        ]
        path.write_text("\n".join(kept) + "\n")
    _evaluate(tmp_path, data_dir, embedder_config, agent, monkeypatch)
    redone = agent.prompts[n:]
    assert redone and all(
        "Merge them" in p or retrieval[lost]["query"] in p or "Current hypothesis" in p
        for p in redone
    )
    assert not any("Held-out calls showing" in p for p in redone)  # critiques were kept
    assert len(_jsonl(tmp_path / "memory_episodes.jsonl")) == LIMIT
    # Other settings in the same run directory are refused, not mixed in.
    with pytest.raises(run_claim.RunDirError, match=r"other settings \(memory\.top_k: 2 -> 1\)"):
        _evaluate(tmp_path, data_dir, embedder_config, agent, monkeypatch, top_k=1)


def test_top_k_and_critique_parsing_by_hand():
    keys = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [1.0, 0.0]])
    order, scores = memory.top_k(np.array([[1.0, 0.0], [0.0, 1.0]]), keys, 3)
    assert order.tolist() == [[0, 3, 2], [1, 2, 0]]  # ties: the lower index first
    np.testing.assert_allclose(scores, [[1.0, 1.0, 0.6], [1.0, 0.8, 0.0]])
    assert memory.top_k(np.eye(2), keys[:1], 5)[0].shape == (2, 1)
    assert (
        memory_prompts.parse_critique("<think>hm</think>\nNotes.\n**Critique:** try -1 **")
        == "try -1"
    )
    assert memory_prompts.parse_critique("just advice") == "just advice"


def test_memory_requirements_are_checked_first(setup, tmp_path):
    data_dir, embedder = setup
    common = dict(
        run_dir=str(tmp_path / "run"),
        policy=backends.RandomProberBackendConfig(),
        judge=backends.ScriptedJudgeBackendConfig(),
        coder=backends.ScriptedCoderBackendConfig(),
    )
    config = memory.MemoryConfig(embedder=embedder)
    with pytest.raises(ValueError, match="starts from the interactive run"):
        pipeline.evaluate(modes=("memory",), baselines={"memory": config}, **common)
    with pytest.raises(ValueError, match="needs an embedder"):
        pipeline.evaluate(modes=("interactive", "memory"), **common)
    with pytest.raises(ValueError, match="need the train split"):
        pipeline.evaluate(modes=("interactive", "memory"), baselines={"memory": config}, **common)
    assert not (tmp_path / "run").exists()


def test_a_refused_embedder_stops_the_run_with_the_episodes_kept(setup, tmp_path, monkeypatch):
    from pau_jax.policy.http import EndpointError

    data_dir, _ = setup
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"  # closed once the block ends
    refused = embeddings.HTTPEmbeddingConfig(base_url=url, model="e", max_retries=1, backoff_s=0)
    with pytest.raises(EndpointError, match=f"^embedder seat: endpoint {url} \\(model e\\) failed"):
        _evaluate(tmp_path, data_dir, refused, Agent(), monkeypatch)
    assert len(_jsonl(tmp_path / "interactive_episodes.jsonl")) == LIMIT
    assert not (tmp_path / "memory" / "retrieval.jsonl").exists()
