"""AAC on SmolLM2-135M-Instruct: three LoRA steps on the debug split, and the adapter read by peft.

The actor samples real episodes, the frozen base (the same weights, adapters
zeroed) is the critic, GRPO updates the adapters; the exported PEFT adapter must
change transformers' logits the way it changes pau_jax's.
"""

import json

import numpy as np
import pytest

from pau_jax.env.episode import EpisodeConfig
from pau_jax.policy.config import SamplingConfig
from pau_jax.rl import loop
from pau_jax.rl.critic import CriticConfig
from pau_jax.rl.learner import LearnerConfig
from pau_jax.rl.rewards import RewardConfig
from pau_jax.rl.rollout import RolloutConfig
from pau_jax.tasks import DatasetConfig
from pau_jax.training.run import ActorConfig

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

STEPS = 3
# Float32 roundoff through 30 layers: two correct float32 implementations differ by ~1.5e-4.
F32_TOL = 3e-4


def _logits(model, ids, mask):
    return np.asarray(model(ids, attention_mask=mask), np.float64)


def test_three_aac_steps_train_the_adapters_and_peft_reads_them(checkpoint, data_dir, tmp_path):
    import peft
    import torch
    import transformers

    from pau_jax import models
    from pau_jax.models import lora
    from pau_jax.tokenizer import load_tokenizer

    run_dir = tmp_path / "aac"
    summary = loop.train(
        run_dir=str(run_dir),
        actor=ActorConfig(checkpoint=str(checkpoint), lora_rank=4, lora_alpha=8.0),
        seed=0,
        episode_config=EpisodeConfig(call_budget=1, max_steps=3),
        # Replies are capped at 32 tokens, so the length thresholds are scaled down with them
        # (the paper's 100/30 words are never reached and every reward would tie).
        reward_config=RewardConfig(max_steps=3, reasoning_tau=8, input_tau=4, reflection_tau=8),
        rollout_config=RolloutConfig(
            tasks_per_batch=2,
            group_size=2,
            sampling=SamplingConfig(max_new_tokens=32, temperature=1.0),
        ),
        critic_config=CriticConfig(sampling=SamplingConfig(max_new_tokens=48)),
        # Two rows per micro-batch: the attention of a ~700-token row over 30 layers is large.
        learner_config=LearnerConfig(
            learning_rate=1e-3, logits_chunk_tokens=512, micro_batch_size=2
        ),
        steps=STEPS,
        checkpoint_every=STEPS,
        pad_to_multiple=64,
        rows_multiple=4,
        dataset=DatasetConfig(config="debug", split="train", data_dir=str(data_dir)),
        sandbox_workers=2,
    )
    assert summary["steps"] == STEPS and summary["mode"] == "grpo"
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for m in metrics:
        assert np.isfinite(m["train/loss"]) and np.isfinite(m["train/grad_norm"])
        assert m["rollout/episodes"] == 4.0 and m["critic/requested"] >= 4.0
    # The adapters received a gradient (GRPO advantages were not all zero).
    assert max(m["train/grad_norm"] for m in metrics) > 0.0
    print(
        "SmolLM2 AAC:",
        [
            {k: round(m[k], 4) for k in ("train/loss", "train/grad_norm", "rollout/reward_mean")}
            for m in metrics
        ],
    )

    # The exported adapter on transformers' model changes its logits as on pau_jax's.
    adapter = run_dir / "adapter"
    tokenizer = load_tokenizer(checkpoint)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What does test_func(2, 3) return? It returned 7."}],
        add_generation_prompt=True,
        tokenize=True,
    )
    ids = np.asarray([list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)], np.int32)
    mask = np.ones_like(ids)
    base, _ = models.load_hf(checkpoint)
    trained, _ = models.load_hf(checkpoint)
    assert lora.load_peft(trained, adapter) == 7 * 30
    ours_change = _logits(trained, ids, mask) - _logits(base, ids, mask)

    hf = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        t_ids, t_mask = torch.tensor(ids, dtype=torch.long), torch.tensor(mask)
        hf_base = hf(input_ids=t_ids, attention_mask=t_mask).logits.double().numpy()
        with_adapter = peft.PeftModel.from_pretrained(hf, str(adapter)).eval()
        hf_trained = with_adapter(input_ids=t_ids, attention_mask=t_mask).logits.double().numpy()
    theirs_change = hf_trained - hf_base
    moved = float(np.max(np.abs(ours_change)))
    diff = float(np.max(np.abs(ours_change - theirs_change)))
    print(f"SmolLM2 AAC adapter: logits moved by {moved:.3g}; |ours - peft| change {diff:.3g}")
    assert moved > 10 * F32_TOL
    assert diff < F32_TOL
