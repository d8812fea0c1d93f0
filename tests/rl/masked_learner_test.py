"""Masked rollouts scored consistently: the learner's log-probs are the sampler's, mask by mask."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rl_testlib as lib

from pau_jax.rl import grpo
from pau_jax.rl.grpo import GRPOConfig
from pau_jax.rl.samples import Sample, episode_sample, make_batch, make_micro_batches
from pau_jax.sampling import constraint, generate, token_mask
from pau_jax.training.logprobs import token_logprobs

# A byte vocabulary over the tiny model's 96 ids: what an input tuple and a rating need,
# a stop token, and special tokens the mask never allows.
_PIECES = [bytes([b]) for b in b"\n ()[],'-0123456789abcxyzRatng:`"] + [
    b"```\n",
    b"\n```",
    b"```",
    b"12",
    b", ",
    b"Rating: ",
]
STOP = len(_PIECES)
VOCAB = [*_PIECES] + [None] * (lib.CONFIG.vocab_size - len(_PIECES))
PROMPTS = [[5, 9, 17, 3], [40, 41, 42], [7, 8, 9, 10, 11]]
BUDGET = 20


def _rollout(model, seed: int):
    """Sampled rows (input arity 2, a rating, and unmasked) with each token's mask."""
    automaton = constraint.build_components(
        VOCAB,
        [STOP],
        [constraint.Component("input", arity=2), constraint.RATING],
        vocab_size=lib.CONFIG.vocab_size,
    )
    starts = [automaton.starts[0], automaton.starts[1], automaton.free]
    out = generate(
        model, PROMPTS, max_new_tokens=BUDGET, temperature=1.0, n_samples=4, seed=seed,
        automaton=automaton, automaton_starts=starts, stop_token_ids=[STOP],
    )  # fmt: skip
    rows = []
    for r, ids in enumerate(out.tokens):
        masks = token_mask.effective_masks(automaton, out.states[r], BUDGET - np.arange(len(ids)))
        rows.append((PROMPTS[r // 4], list(ids), list(out.plain_logprobs[r]), masks))
    return rows


def _learner_logprobs(model, batch, *, masked: bool = True):
    masks = (batch.mask_table, batch.mask_index) if masked else None
    logp, _ = token_logprobs(
        model,
        batch.input_ids,
        batch.attention_mask,
        positions=batch.score_positions,
        masks=masks,
        chunk_tokens=16,
    )
    return np.asarray(logp)


def test_learner_logprobs_equal_the_sampler_s_under_masks():
    model = lib.tiny_model(seed=5)
    rows = _rollout(model, seed=3)
    samples = [
        Sample(prompt_ids=p, completion_ids=ids, sampler_logprobs=lp, advantage=1.0, masks=m)
        for p, ids, lp, m in rows
    ]
    masked_tokens = sum(m is not None for *_, masks in rows for m in masks)
    assert masked_tokens > 50 and any(all(m is None for m in r[3]) for r in rows)
    for batches in ([make_batch(samples)], make_micro_batches(samples, micro_batch_size=5)):
        for batch in batches:
            loss = np.asarray(batch.loss_mask) > 0
            sampler = np.asarray(batch.sampler_logprobs)[loss]
            learner = _learner_logprobs(model, batch)[loss]
            np.testing.assert_allclose(learner, sampler, atol=1e-5)
    # Without the masks the learner scores another policy: the masked tokens differ.
    batch = make_batch(samples)
    loss = np.asarray(batch.loss_mask) > 0
    gap = np.abs(_learner_logprobs(model, batch, masked=False)[loss] - batch.sampler_logprobs[loss])
    assert float(np.max(gap)) > 0.5
    # A sampler log-prob under the mask is at least the unmasked one (a renormalised softmax).
    unmasked = _learner_logprobs(model, batch, masked=False)[loss]
    assert np.all(np.asarray(batch.sampler_logprobs)[loss] >= unmasked - 1e-5)


def test_the_grpo_loss_sees_no_gap_and_masked_gradients_are_finite():
    """The loss of a masked batch: no sampler/learner gap, ratio 1, finite gradients."""
    from flax import nnx

    model = lib.tiny_model(seed=6)
    rows = _rollout(model, seed=4)
    rng = np.random.default_rng(0)
    samples = [
        Sample(prompt_ids=p, completion_ids=ids, sampler_logprobs=lp,
               advantage=float(rng.standard_normal()), masks=m)
        for p, ids, lp, m in rows
    ]  # fmt: skip
    batch = make_batch(samples)
    loss = grpo.GRPOLoss(config=GRPOConfig(beta=0.05), chunk_tokens=16)
    graphdef, lora_state, base = nnx.split(model, nnx.LoRAParam, ...)

    def value(lora_state):
        loss_sum, denominator, stats = loss(nnx.merge(graphdef, lora_state, base), batch)
        return loss_sum / denominator, stats

    (_, stats), grads = jax.value_and_grad(value, has_aux=True)(lora_state)
    assert float(stats["gap_max"]) < 1e-5 and float(stats["kl_sum"]) > 0
    leaves = [np.asarray(g) for g in jax.tree.leaves(grads)]
    assert all(np.isfinite(g).all() for g in leaves) and max(np.abs(g).max() for g in leaves) > 0


def _phase(model, automaton, prompt, start, seed):
    """One reply sampled from ``prompt`` under ``automaton`` from ``start``, as a Completion."""
    out = generate(
        model, [prompt], max_new_tokens=BUDGET, temperature=1.0, seed=seed,
        automaton=automaton, automaton_starts=[start], stop_token_ids=[STOP],
    )  # fmt: skip
    ids = list(out.tokens[0])
    masks = token_mask.effective_masks(automaton, out.states[0], BUDGET - np.arange(len(ids)))
    return types.SimpleNamespace(
        prompt_ids=list(prompt), token_ids=ids, logprobs=list(out.plain_logprobs[0]),
        masks=tuple(masks),
    )  # fmt: skip


def test_a_masked_update_is_the_same_in_a_scan_and_in_micro_batches():
    """Mask tables are row-major: a batch splits into micro-batches like every other field."""
    from pau_jax.rl import learner

    model = lib.tiny_model(seed=8)
    rows = _rollout(model, seed=6)
    samples = [
        Sample(prompt_ids=p, completion_ids=ids, sampler_logprobs=lp, advantage=a, masks=m)
        for (p, ids, lp, m), a in zip(rows, np.linspace(-1.0, 1.0, len(rows)))
    ]
    config = learner.LearnerConfig(learning_rate=1e-2, micro_batch_size=4, grpo=GRPOConfig())
    results = []
    for batches in (make_batch(samples), make_micro_batches(samples, micro_batch_size=4)):
        step = learner.make_train_step(model, config)
        state, metrics = step(learner.init_state(model, config), batches)
        results.append((float(metrics["train/loss"]), jax.tree.leaves(state.lora)))
    (loss_a, lora_a), (loss_b, lora_b) = results
    assert loss_a == pytest.approx(loss_b, abs=1e-6) and abs(loss_a) > 0
    for a, b in zip(lora_a, lora_b, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_episode_rows_carry_each_reply_s_masks():
    """Two phases of one conversation (an input, then a rating after an appended turn)."""
    model = lib.tiny_model(seed=7)
    automaton = constraint.build_components(
        VOCAB, [STOP], [constraint.Component("input", arity=2), constraint.RATING],
        vocab_size=lib.CONFIG.vocab_size,
    )  # fmt: skip
    first = _phase(model, automaton, PROMPTS[0], automaton.starts[0], seed=1)
    appended = [33, 34]
    second = _phase(
        model, automaton, first.prompt_ids + first.token_ids + appended, automaton.starts[1], 2
    )
    row = episode_sample([first, second], [0.5, -0.5])
    assert len(row.masks) == len(row.completion_ids)
    n = len(first.token_ids)
    assert row.masks[n : n + 2] == [None, None]  # the appended turn
    assert sum(m is not None for m in row.masks) > 10
    batch = make_batch([row])
    loss = np.asarray(batch.loss_mask) > 0
    learner = _learner_logprobs(model, batch)[loss]
    np.testing.assert_allclose(learner, np.asarray(batch.sampler_logprobs)[loss], atol=1e-5)


def test_unmasked_samples_build_no_mask_tables_and_bad_masks_are_refused():
    ids = [1, 2, 3]
    plain = Sample(prompt_ids=[4], completion_ids=ids, sampler_logprobs=[-1.0] * 3, advantage=1.0)
    batch = make_batch([plain])
    assert batch.mask_table is None and batch.mask_index is None
    width = -(-lib.CONFIG.vocab_size // 32)
    bad = Sample(
        prompt_ids=[4], completion_ids=ids, sampler_logprobs=[-1.0] * 3, advantage=1.0,
        masks=[np.zeros(width, np.uint32)],
    )  # fmt: skip
    with pytest.raises(ValueError, match="1 masks for 3 completion tokens"):
        make_batch([bad])
    with pytest.raises(ValueError, match="masks need positions"):
        token_logprobs(
            lib.tiny_model(), jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32),
            masks=(jnp.zeros((1, 8, width), jnp.uint32), jnp.zeros((1, 3), jnp.int32)),
        )  # fmt: skip


def test_a_local_policy_records_masks_only_when_asked():
    """An AAC actor (record_masks) hands the learner each masked token's mask; a grader not."""
    import checkpoints
    from flax import nnx

    from pau_jax.env.answer_shape import AnswerShape
    from pau_jax.models import lora, qwen3
    from pau_jax.policy.config import SamplingConfig
    from pau_jax.policy.local import LocalPolicy
    from pau_jax.rl.rollout import _sample
    from pau_jax.tokenizer import load_tokenizer

    model = qwen3.Qwen3ForCausalLM(checkpoints.tiny_qwen3_config(), rngs=nnx.Rngs(0))
    lora.apply_lora(model, rank=2, alpha=2, seed=1)
    sampling = SamplingConfig(max_new_tokens=12, temperature=1.0, structured="constrain_inputs")
    conversation = [[{"role": "user", "content": "Write the arguments of test_func(a)."}]]
    shape = [AnswerShape("input", arity=1)]
    tokenizer = load_tokenizer("qwen3-offline")
    actor = LocalPolicy(model, tokenizer, sampling, record_masks=True)
    (reply,) = actor.complete(conversation, answers=shape)
    assert len(reply.masks) == len(reply.token_ids) and reply.masks[0] is not None
    sample = _sample(reply, 1.0, "test")
    batch = make_batch([sample])
    loss = np.asarray(batch.loss_mask) > 0
    np.testing.assert_allclose(
        _learner_logprobs(model, batch)[loss], np.asarray(batch.sampler_logprobs)[loss], atol=1e-5
    )
    grader = LocalPolicy(model, tokenizer, sampling)
    assert grader.complete(conversation, answers=shape)[0].masks == ()
