"""SFT: the masked NLL against NumPy, micro-batching, records to token pairs, training lowers NLL."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from pau_jax.metrics_writer import MetricsWriter
from pau_jax.models import lora, qwen3
from pau_jax.sft import trainer
from pau_jax.sft.pairs import SFTExample, samples_from_records
from pau_jax.sft.trainer import SFTConfig, make_sft_step
from pau_jax.training import logprobs as logprobs_lib
from pau_jax.training import step as step_lib

SMALL = qwen3.Qwen3Config(
    vocab_size=80,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    max_position_embeddings=64,
)
# The real Qwen vocabulary with a very small body (ids up to 151668 appear in prompts).
QWEN_VOCAB = qwen3.Qwen3Config(
    vocab_size=151936,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    rms_norm_eps=1e-6,
    rope_theta=1e6,
    tie_word_embeddings=True,
    max_position_embeddings=512,
)


def _model(config=SMALL, seed=0, embed_std=None):
    model = qwen3.Qwen3ForCausalLM(config, rngs=nnx.Rngs(seed))
    if embed_std is not None:  # a sharper (tied) head: logits far enough apart to learn
        table = model.model.embed_tokens.embedding
        table.set_value(table[...] * (embed_std / float(jnp.std(table[...]))))
    lora.apply_lora(model, rank=4, alpha=8, seed=seed + 1)
    rng = np.random.default_rng(seed + 2)
    for adapter in lora.adapters(model).values():
        adapter.lora_b.set_value(0.1 * rng.standard_normal(adapter.lora_b.shape, np.float32))
    return model


def _examples(seed=0, n=6):
    rng = np.random.default_rng(seed)
    return [
        SFTExample(
            prompt_ids=rng.integers(1, SMALL.vocab_size, rng.integers(2, 9)).tolist(),
            completion_ids=rng.integers(1, SMALL.vocab_size, rng.integers(1, 6)).tolist(),
        )
        for _ in range(n)
    ]


def _numpy_nll(model, batch) -> float:
    """Token-mean NLL of the masked tokens from full float64 log-softmaxed logits."""
    logits = np.asarray(
        nnx.jit(lambda m, i, a: m(i, a))(model, batch.input_ids, batch.attention_mask)
    )
    logits = logits.astype(np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    ids, mask = np.asarray(batch.input_ids), np.asarray(batch.loss_mask)
    total, count = 0.0, 0
    for b in range(ids.shape[0]):
        for t in range(1, ids.shape[1]):
            if mask[b, t]:
                total -= logp[b, t - 1, ids[b, t]]
                count += 1
    return total / count


def _base(model):
    return [np.array(x) for x in jax.tree.leaves(nnx.state(model, nnx.Not(nnx.LoRAParam)))]


def test_nll_matches_numpy_and_micro_batches_match_the_full_batch():
    model = _model()
    batch = trainer.make_sft_batch(_examples(), pad_to_multiple=8, rows_multiple=8)
    expected = _numpy_nll(model, batch)
    logp, _ = logprobs_lib.token_logprobs(model, batch.input_ids, batch.attention_mask)
    loss_sum, denominator = trainer.nll_loss(logp, batch.loss_mask)
    assert float(denominator) == float(np.asarray(batch.loss_mask).sum())
    assert float(loss_sum / denominator) == pytest.approx(expected, rel=1e-5)
    # Position 0 never counts, whatever the mask says there.
    mask0 = jnp.zeros_like(batch.loss_mask).at[:, 0].set(1.0)
    assert float(trainer.nll_loss(logp, mask0)[1]) == 0.0

    results = {}
    for micro in (None, 2):
        config = SFTConfig(learning_rate=1e-2, batch_size=8, micro_batch_size=micro)
        m = _model()
        state = step_lib.init_state(m, config.optimizer())
        state, metrics = make_sft_step(m, config)(state, batch)
        results[micro] = (
            jax.device_get(metrics),
            [np.asarray(x) for x in jax.tree.leaves(state.lora)],
        )
    assert float(results[None][0]["sft/loss"]) == pytest.approx(expected, rel=1e-5)
    assert float(results[2][0]["sft/loss"]) == pytest.approx(expected, rel=1e-5)
    assert float(results[2][0]["train/grad_norm"]) == pytest.approx(
        float(results[None][0]["train/grad_norm"]), rel=1e-5
    )
    for a, b in zip(results[None][1], results[2][1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_sft_lowers_the_nll_of_its_examples_and_leaves_the_base_bit_identical():
    model = _model()
    examples = _examples(seed=1, n=4)
    batch = trainer.make_sft_batch(examples, pad_to_multiple=8, rows_multiple=4)
    config = SFTConfig(learning_rate=2e-2, batch_size=4, micro_batch_size=2)
    before_base = _base(model)
    before_lora = [np.array(x) for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam))]
    step = make_sft_step(model, config)
    state = step_lib.init_state(model, config.optimizer())
    losses = []
    for _ in range(15):
        state, metrics = step(state, batch)
        losses.append(float(metrics["sft/loss"]))
    step_lib.sync_model(model, state)
    after = _numpy_nll(model, batch)
    print(f"\nNLL {losses[0]:.3f} -> {after:.3f} after 15 steps")
    # The stock head (std 0.02) keeps every logit close, so the reachable drop is modest.
    assert after < losses[0] - 0.3
    assert all(b < a for a, b in zip(losses, losses[1:]))
    for a, b in zip(before_base, _base(model)):
        np.testing.assert_array_equal(a, np.asarray(b))
    changed = [
        not np.array_equal(a, np.asarray(b))
        for a, b in zip(before_lora, jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))
    ]
    assert all(changed)


@pytest.fixture(scope="module")
def tokenizer():
    from pau_jax.tokenizer import load_tokenizer

    return load_tokenizer("qwen3-offline")


RECORDS = [
    {
        "task_id": "t0",
        "steps": [
            {
                "messages": [
                    {"role": "system", "content": "Probe the function."},
                    {"role": "user", "content": "Header: def test_func(arg0):"},
                ],
                "output": "I will try an empty list.",
                "parse_ok": True,
            },
            {
                "messages": [{"role": "user", "content": "Write the call."}],
                "output": "```\n([],)\n```",
                "parse_ok": False,
            },
        ],
    },
    {
        "task_id": "t1",
        "steps": [
            {
                "messages": [{"role": "user", "content": "Revise: f(2) -> 4"}],
                "output": "Hypothesis: doubles its input.\nDecision: STOP",
                "parse_ok": True,
            }
        ],
    },
]


def test_records_become_chat_template_pairs(tokenizer):
    pairs = samples_from_records(RECORDS, tokenizer)
    assert len(pairs) == 3
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    steps = [s for r in RECORDS for s in r["steps"]]
    for pair, step in zip(pairs, steps):
        # The pair is exactly the chat template of the conversation with the reply as
        # the assistant turn, up to and including its end-of-turn token.
        full = tokenizer.apply_chat_template(
            step["messages"] + [{"role": "assistant", "content": step["output"]}],
            tokenize=True,
            enable_thinking=False,
        )["input_ids"]
        ids = pair.prompt_ids + pair.completion_ids
        assert ids == full[: len(ids)]
        assert tokenizer.decode(full[len(ids) :]) == "\n"
        assert pair.completion_ids[-1] == im_end
        assert tokenizer.decode(pair.completion_ids[:-1]) == step["output"]
        assert tokenizer.decode(pair.prompt_ids).endswith(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        )
    assert len(samples_from_records(RECORDS, tokenizer, skip_unparsed=True)) == 2
    with pytest.raises(ValueError, match="no 'steps'"):
        samples_from_records([{"task_id": "x"}], tokenizer)
    with pytest.raises(ValueError, match="record 0 step 0 lacks"):
        samples_from_records([{"steps": [{"messages": []}]}], tokenizer)


def test_train_sft_on_records_lowers_their_nll_and_logs(tokenizer, tmp_path):
    model = _model(QWEN_VOCAB, embed_std=0.5)
    pairs = samples_from_records(RECORDS, tokenizer)
    batch = trainer.make_sft_batch(pairs, pad_to_multiple=16, rows_multiple=4)
    config = SFTConfig(
        learning_rate=3e-2, epochs=8, batch_size=2, max_length=512, pad_to_multiple=16,
        logits_chunk_tokens=128, skip_unparsed=False,
    )  # fmt: skip
    graphdef, lora_state, base = step_lib.split_model(model)

    @jax.jit
    def score(adapters):
        logp, _ = logprobs_lib.token_logprobs(
            nnx.merge(graphdef, adapters, base),
            batch.input_ids,
            batch.attention_mask,
            chunk_tokens=128,
        )
        loss_sum, denominator = trainer.nll_loss(logp, batch.loss_mask)
        return loss_sum / denominator

    before = float(score(lora_state))
    base_before = _base(model)
    with MetricsWriter(tmp_path, tensorboard=False) as writer:
        state, history = trainer.train_sft(model, tokenizer, RECORDS, config, writer=writer)
    _, lora_after, _ = step_lib.split_model(model)
    after = float(score(lora_after))
    print(f"\nrecord NLL {before:.3f} -> {after:.3f} over {len(history)} steps")
    assert after < before - 2.0
    # 3 pairs in batches of 2 -> 2 steps per epoch.
    assert len(history) == 16 and int(state.step) == 16
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, 17))
    assert lines[-1]["sft/epoch"] == 7.0
    for a, b in zip(base_before, _base(model)):
        np.testing.assert_array_equal(a, np.asarray(b))


def test_train_sft_skips_steps_that_failed_to_parse(tokenizer):
    config = SFTConfig(
        learning_rate=1e-2, epochs=2, batch_size=2, max_length=512, pad_to_multiple=16,
        logits_chunk_tokens=128,
    )  # fmt: skip
    assert config.skip_unparsed  # the default
    _, history = trainer.train_sft(_model(QWEN_VOCAB), tokenizer, RECORDS, config)
    # 2 parsed pairs of 3 steps: one batch of 2 per epoch; the malformed input is not imitated.
    assert len(history) == 2 and all(m["sft/skipped_unparsed"] == 1.0 for m in history)
    assert all(m["sft/tokens"] == history[0]["sft/tokens"] for m in history)
    parsed = samples_from_records(RECORDS, tokenizer, skip_unparsed=True)
    assert history[0]["sft/tokens"] == sum(len(p.completion_ids) for p in parsed)


def test_config_and_length_errors(tokenizer):
    with pytest.raises(ValueError, match="micro_batch_size=3 must be >= 1 and divide"):
        SFTConfig(batch_size=4, micro_batch_size=3)
    with pytest.raises(ValueError, match="epochs must be >= 1"):
        SFTConfig(epochs=0)
    with pytest.raises(ValueError, match="no training pair fits max_length=5"):
        trainer.train_sft(_model(QWEN_VOCAB), tokenizer, RECORDS, SFTConfig(max_length=5))


def test_best_epoch_and_early_stopping_table():
    assert trainer.best_epoch([3.0], 3) == (0, False)
    assert trainer.best_epoch([3.0, 2.0, 2.5, 2.6], 3) == (1, False)
    assert trainer.best_epoch([3.0, 2.0, 2.5, 2.6, 2.1], 3) == (1, True)
    assert trainer.best_epoch([2.0, 2.0, 2.0], 2) == (0, True)  # ties keep the earliest
    assert trainer.best_epoch([None, None], 1) == (1, False)  # no held-out slice: the last
    with pytest.raises(ValueError, match="at least one epoch"):
        trainer.best_epoch([], 1)


def _counting_step(seen):
    """A stand-in update: the state is a step counter, the loss of step n is n; batches recorded."""

    def step(state, batch):
        seen.append(np.asarray(batch.input_ids).tolist())
        return state + 1, {"sft/loss": jnp.asarray(float(state))}

    return step


def _epochs(held_out, *, patience, history=(), seen=None):
    """run_epochs over 5 pairs in batches of 2 (3 steps an epoch) with constructed held-out losses."""
    examples = [SFTExample(prompt_ids=[i + 1], completion_ids=[i + 2]) for i in range(5)]
    config = SFTConfig(epochs=4, batch_size=2, pad_to_multiple=4, seed=7)
    values = iter(held_out or ())
    evaluate = None if held_out is None else (lambda state: next(values))
    start = 3 * len(history)
    return list(
        trainer.run_epochs(
            _counting_step([] if seen is None else seen), start, examples, config, pad=0,
            history=history, evaluate=evaluate, patience=patience,
        )
    )  # fmt: skip


def test_run_epochs_stops_after_patience_epochs_without_a_lower_held_out_loss():
    # Patience 1: the held-out loss rises at epoch 3 (index 2), so epoch 4 never runs.
    runs = _epochs([3.0, 2.0, 2.5, 1.0], patience=1)
    assert len(runs) == 3 and [s for s, _ in runs] == [3, 6, 9]
    history = runs[-1][1]
    assert [h["held_out_nll"] for h in history] == [3.0, 2.0, 2.5]
    assert [h["train_loss"] for h in history] == [1.0, 4.0, 7.0]  # mean of steps 3e..3e+2
    assert [h["epoch"] for h in history] == [0, 1, 2]
    # Patience 2 (or none, or no held-out loss) trains every epoch.
    assert len(_epochs([3.0, 2.0, 2.5, 1.0], patience=2)) == 4
    assert len(_epochs([3.0, 2.0, 2.5, 1.0], patience=None)) == 4
    assert [h["held_out_nll"] for h in _epochs(None, patience=1)[-1][1]] == [None] * 4
    # A resumed history that has already stopped trains nothing more.
    assert _epochs([], patience=1, history=history) == []


def test_run_epochs_resumed_after_an_epoch_repeats_the_uninterrupted_run():
    seen, resumed_seen = [], []
    straight = _epochs([3.0, 2.0, 1.5, 1.0], patience=1, seen=seen)[-1][1]
    resumed = _epochs([1.5, 1.0], patience=1, history=straight[:2], seen=resumed_seen)
    assert [s for s, _ in resumed] == [9, 12]
    assert resumed[-1][1] == straight
    assert resumed_seen == seen[6:]  # epochs 2 and 3 see the same batches, in the same order
    assert seen[:3] != seen[3:6]  # each epoch is shuffled anew
