"""The ft baseline: held-out split, best-epoch export and early stopping, resumable LoRA fine-tuning, and the 'ft' mode on pau/debug."""

import dataclasses
import functools
import json

import checkpoints
import numpy as np
import pytest

from pau_jax.env import runner
from pau_jax.evaluation import in_context, pipeline
from pau_jax.evaluation.score import ScoringConfig
from pau_jax.policy import backends
from pau_jax.sft import finetune, trainer
from pau_jax.sft.trainer import SFTConfig
from pau_jax.tasks import DatasetConfig
from pau_jax.tasks import pau_dataset as tasks

SMALL = finetune.FineTuneConfig(
    sft=SFTConfig(
        learning_rate=5e-3,
        epochs=2,
        batch_size=2,
        pad_to_multiple=64,
        logits_chunk_tokens=64,
        max_length=1024,
    ),
    lora_rank=4,
    lora_alpha=8.0,
    validation_fraction=0.25,
    patience=2,
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from flax import nnx

    from pau_jax.models import qwen3

    path = tmp_path_factory.mktemp("ckpt")
    config = checkpoints.tiny_qwen3_config(max_position_embeddings=2048)
    qwen3.save_hf(qwen3.Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)), config, path)
    return str(path)


def _adapter_tensors(adapter) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(f"{adapter}/adapter_model.safetensors")


def _pairs(n=4):
    return [
        {
            "id": f"task/{i}",
            "messages": [{"role": "user", "content": f"Describe function number {i}."}],
            "completion": f"Description: returns {i} plus its argument",
        }
        for i in range(n)
    ]


def test_the_held_out_slice_depends_on_ids_not_order():
    pairs = _pairs(10)
    train, held = finetune.split_pairs(pairs, 0.2)
    assert len(held) == 2 and len(train) == 8
    assert {p["id"] for p in train} | {p["id"] for p in held} == {p["id"] for p in pairs}
    again = finetune.split_pairs(pairs[::-1], 0.2)[1]
    assert {p["id"] for p in again} == {p["id"] for p in held}
    assert len(finetune.split_pairs(pairs[:2], 0.01)[1]) == 1  # at least one held out
    assert finetune.split_pairs(pairs, 0.0) == (pairs, [])
    with pytest.raises(ValueError, match="needs at least 2"):
        finetune.split_pairs(pairs[:1], 0.1)
    with pytest.raises(ValueError, match="unique ids"):
        finetune.split_pairs(pairs[:1] * 2, 0.1)


class _Killed(Exception):
    pass


def test_train_adapter_keeps_the_best_epoch_and_resumes_where_it_stopped(
    checkpoint, tmp_path, monkeypatch
):
    from pau_jax.models import lora, qwen3
    from pau_jax.training import step as step_lib

    kwargs = dict(
        checkpoint_dir=checkpoint, pairs=_pairs(), tokenizer="qwen3-offline", config=SMALL
    )
    # A run killed during its second epoch (after 1 epoch of 2 steps), then run again.
    calls = {"n": 0}
    step_call = step_lib.TrainStep.__call__

    def counting(self, state, batch):
        calls["n"] += 1
        if calls["n"] == 3 and calls.get("kill"):
            raise _Killed
        return step_call(self, state, batch)

    monkeypatch.setattr(step_lib.TrainStep, "__call__", counting)
    calls["kill"] = True
    with pytest.raises(_Killed):
        finetune.train_adapter(out_dir=str(tmp_path / "killed"), **kwargs)
    assert len(json.loads((tmp_path / "killed" / "history.json").read_text())) == 1
    calls.update(n=0, kill=False)
    adapter = finetune.train_adapter(out_dir=str(tmp_path / "killed"), **kwargs)
    assert calls["n"] == 2  # only the second epoch ran
    summary = json.loads((tmp_path / "killed" / "summary.json").read_text())
    history = summary["history"]
    assert len(history) == 2 and summary["train_pairs"] == 3 and summary["held_out_pairs"] == 1
    held = [h["held_out_nll"] for h in history]
    assert summary["best_epoch"] == int(np.argmin(held)) + 1
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    # The same as an uninterrupted run.
    # The metrics rows of the killed epoch were dropped and redone: one row per epoch.
    rows = [json.loads(x) for x in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["ft/held_out_nll"] for r in rows] == pytest.approx(held, abs=1e-6)
    # The same history and adapter as an uninterrupted run.
    calls.update(n=0)
    straight = finetune.train_adapter(out_dir=str(tmp_path / "straight"), **kwargs)
    assert calls["n"] == 4
    other = json.loads((tmp_path / "straight" / "summary.json").read_text())["history"]
    for key in ("held_out_nll", "train_loss"):
        np.testing.assert_allclose([h[key] for h in other], [h[key] for h in history], atol=1e-6)
    resumed_tensors, straight_tensors = _adapter_tensors(adapter), _adapter_tensors(straight)
    assert resumed_tensors.keys() == straight_tensors.keys() and len(resumed_tensors) == 14
    for name, array in resumed_tensors.items():
        np.testing.assert_allclose(array, straight_tensors[name], atol=1e-6)
    # The exported adapter is a PEFT folder on every linear layer of the base model.
    model, _ = qwen3.load_hf(checkpoint)
    assert (
        lora.load_peft(model, adapter) == 7
        and lora.load_peft(qwen3.load_hf(checkpoint)[0], straight) == 7
    )
    # Finished: a rerun returns the adapter without training; other pairs are refused.
    calls.update(n=0)
    assert finetune.train_adapter(out_dir=str(tmp_path / "killed"), **kwargs) == adapter
    assert calls["n"] == 0
    with pytest.raises(ValueError, match="other pairs or settings"):
        finetune.train_adapter(out_dir=str(tmp_path / "killed"), **dict(kwargs, pairs=_pairs(5)))


def test_early_stopping_exports_the_best_epoch(checkpoint, tmp_path, monkeypatch):
    # Constructed held-out losses: epoch 3 is worse than epoch 2, so patience 1 stops there.
    losses = iter([3.0, 2.0, 2.5, 1.0])
    monkeypatch.setattr(trainer, "mean_nll", lambda state, **kwargs: next(losses))
    config = dataclasses.replace(
        SMALL, patience=1, sft=dataclasses.replace(SMALL.sft, epochs=4)
    )  # fmt: skip
    kwargs = dict(checkpoint_dir=checkpoint, pairs=_pairs(), tokenizer="qwen3-offline")
    adapter = finetune.train_adapter(out_dir=str(tmp_path / "stopped"), config=config, **kwargs)
    summary = json.loads((tmp_path / "stopped" / "summary.json").read_text())
    assert summary["epochs_run"] == 3 and summary["best_epoch"] == 2
    assert [h["held_out_nll"] for h in summary["history"]] == [3.0, 2.0, 2.5]
    # The adapter is epoch 2's: the final one of a run of 2 epochs (each epoch seeded alone).
    losses = iter([3.0, 2.0])
    two = finetune.train_adapter(
        out_dir=str(tmp_path / "two"), config=dataclasses.replace(SMALL, patience=1), **kwargs
    )
    best, final = _adapter_tensors(adapter), _adapter_tensors(two)
    assert best.keys() == final.keys()
    for name, array in best.items():
        np.testing.assert_allclose(array, final[name], atol=1e-6)


def test_ft_mode_on_the_debug_split(checkpoint, tmp_path, capsys):
    from pau_jax.policy.config import SamplingConfig

    data_dir = tasks.ensure_built(tmp_path / "tfds")
    fine_tune = functools.partial(finetune.train_adapter, config=SMALL)
    agent = backends.LocalBackendConfig(
        checkpoint_dir=checkpoint,
        tokenizer="qwen3-offline",
        sampling=SamplingConfig(max_new_tokens=4),
    )
    result = pipeline.evaluate(
        run_dir=str(tmp_path / "run"),
        policy=agent,
        dataset=DatasetConfig(config="debug", data_dir=str(data_dir), limit=3),
        modes=("in_context", "ft"),
        baselines={"ft": fine_tune},
        judge=backends.ScriptedJudgeBackendConfig(),
        coder=backends.ScriptedCoderBackendConfig(),
        scoring=ScoringConfig(bootstrap_resamples=200),
    )
    out = capsys.readouterr().out
    assert "[eval] ft: fine-tuning on 3 train pairs" in out and "[eval] LoRA adapter on 7" in out
    assert set(result["runs"]) == {"in_context", "ft"} and result["runs"]["ft"]["episodes"] == 3
    assert "ft vs in_context" in result["comparisons"]
    adapter = result["baselines"]["ft"]["adapter"]
    assert adapter == str(tmp_path / "run" / "ft" / "adapter")
    records = runner.load_records(tmp_path / "run" / "ft_episodes.jsonl")
    assert [r["mode"] for r in records] == ["ft"] * 3
    # The pairs: the train split's in-context prompts -> its gold descriptions.
    specs, references = tasks.from_records(
        tasks.load_split("debug", "train", data_dir), pipeline.EpisodeConfig()
    )
    pairs = in_context.training_pairs(specs, references)
    assert [p["messages"] for p in pairs] == [in_context.messages(s.task) for s in specs]
    assert pairs[0]["completion"] == f"Description: {references[pairs[0]['id']].description}"


def test_ft_requirements_are_checked_first(tmp_path):
    common = dict(
        run_dir=str(tmp_path / "run"),
        judge=backends.ScriptedJudgeBackendConfig(),
        coder=backends.ScriptedCoderBackendConfig(),
        modes=("ft",),
    )
    local = backends.LocalBackendConfig(checkpoint_dir="/ckpt")
    with pytest.raises(ValueError, match="needs its adapter trainer"):
        pipeline.evaluate(policy=local, **common)
    with pytest.raises(ValueError, match="must be a LocalBackendConfig without adapter_dir"):
        pipeline.evaluate(
            policy=backends.LocalBackendConfig(checkpoint_dir="/ckpt", adapter_dir="/a"),
            baselines={"ft": finetune.train_adapter},
            **common,
        )
    with pytest.raises(ValueError, match="need the train split"):
        pipeline.evaluate(policy=local, baselines={"ft": finetune.train_adapter}, **common)
    assert not (tmp_path / "run").exists()
