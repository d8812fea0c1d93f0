"""One row per episode scores as one row per phase: loss and LoRA gradients, every aggregation."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rl_testlib as lib
from flax import nnx

from pau_jax.models import lora, qwen3
from pau_jax.rl import grpo, learner
from pau_jax.rl.grpo import GRPOConfig
from pau_jax.rl.samples import EpisodeSample, Sample, episode_sample, make_batch, make_micro_batches

BETA = 0.05  # large enough that the KL term moves the gradient visibly
CONFIGS = {
    "token-mean": GRPOConfig(beta=BETA),
    "sequence-mean-token-mean": GRPOConfig(beta=BETA, aggregation="sequence-mean-token-mean"),
    "sequence-mean-token-sum-norm": GRPOConfig(
        beta=BETA, aggregation="sequence-mean-token-sum-norm", max_length=16
    ),
}


@dataclasses.dataclass(frozen=True)
class Reply:
    """What the rollout reads of a `LocalPolicy` reply."""

    prompt_ids: tuple
    token_ids: tuple
    logprobs: tuple


def _episodes(seed: int, n: int = 4) -> tuple[list[list[Reply]], list[list[float]]]:
    """Random multi-turn episodes: each prompt = previous prompt + reply + appended turn."""
    rng = np.random.default_rng(seed)
    episodes, advantages = [], []
    for _ in range(n):
        phases = int(rng.integers(2, 6))
        ids = list(rng.integers(1, lib.CONFIG.vocab_size, int(rng.integers(3, 7))))
        replies = []
        for phase in range(phases):
            if phase:
                ids += list(rng.integers(1, lib.CONFIG.vocab_size, int(rng.integers(1, 4))))
            reply = tuple(
                int(t) for t in rng.integers(1, lib.CONFIG.vocab_size, int(rng.integers(1, 6)))
            )
            # Sampler log-probs near the policy's scale: some ratios clip, most do not.
            logprobs = tuple(float(x) for x in -rng.uniform(3.5, 5.5, len(reply)))
            replies.append(Reply(tuple(int(i) for i in ids), reply, logprobs))
            ids += list(reply)
        episodes.append(replies)
        advantages.append([float(a) for a in rng.standard_normal(phases)])
    return episodes, advantages


def _phase_rows(episodes, advantages) -> list[Sample]:
    return [
        Sample(
            prompt_ids=list(r.prompt_ids),
            completion_ids=list(r.token_ids),
            sampler_logprobs=list(r.logprobs),
            advantage=a,
        )
        for replies, adv in zip(episodes, advantages)
        for r, a in zip(replies, adv)
    ]


def _loss_and_grads(model, loss: grpo.GRPOLoss, batches):
    """(loss, gradients of the LoRA parameters) summed over batches as `training.step` does."""
    graphdef, lora, base = nnx.split(model, nnx.LoRAParam, ...)

    def sums(lora_state, batch):
        loss_sum, denominator, _ = loss(nnx.merge(graphdef, lora_state, base), batch)
        return loss_sum, denominator

    total, denominator, grads = 0.0, 0.0, None
    for batch in batches:
        (part, part_denominator), part_grads = jax.value_and_grad(sums, has_aux=True)(lora, batch)
        total, denominator = total + part, denominator + part_denominator
        grads = part_grads if grads is None else jax.tree.map(jnp.add, grads, part_grads)
    scale = 1.0 / max(float(denominator), 1.0)
    return float(total) * scale, [np.asarray(g) * scale for g in jax.tree.leaves(grads)]


def test_episode_sample_layout_by_hand():
    replies = [
        Reply((5, 6), (7, 8), (-0.5, -1.0)),
        Reply((5, 6, 7, 8, 9), (10,), (-2.0,)),
        Reply((5, 6, 7, 8, 9, 10, 11, 12), (13, 14), (-0.25, -0.75)),
    ]
    row = episode_sample(replies, [1.0, -2.0, 0.5])
    assert row.prompt_ids == [5, 6]
    assert row.completion_ids == [7, 8, 9, 10, 11, 12, 13, 14]
    assert row.phases == [1, 1, 0, 2, 0, 0, 3, 3]
    assert row.sampler_logprobs == [-0.5, -1.0, 0.0, -2.0, 0.0, 0.0, -0.25, -0.75]
    batch = make_batch([row], pad_to_multiple=4)  # 10 tokens -> T = 12
    np.testing.assert_array_equal(
        np.asarray(batch.loss_mask)[0], [0] * 4 + [1, 1, 0, 1, 0, 0, 1, 1]
    )
    np.testing.assert_array_equal(
        np.asarray(batch.advantages)[0], [0] * 4 + [1, 1, 0, -2, 0, 0, 0.5, 0.5]
    )
    np.testing.assert_array_equal(
        np.asarray(batch.sequence_tokens)[0], [0] * 4 + [2, 2, 0, 1, 0, 0, 2, 2]
    )
    assert np.asarray(batch.sequences).tolist() == [3.0]
    # A prompt that does not extend the previous prompt and reply has no episode row.
    fresh = [replies[0], Reply((5, 6, 99), (10,), (-2.0,))]
    assert episode_sample(fresh, [1.0, 2.0]) is None


@pytest.mark.parametrize("aggregation", sorted(CONFIGS))
def test_one_row_per_episode_equals_one_row_per_phase(aggregation):
    model = lib.tiny_model(seed=3)
    loss = grpo.GRPOLoss(config=CONFIGS[aggregation], chunk_tokens=16)
    episodes, advantages = _episodes(seed=11)
    rows = [episode_sample(r, a) for r, a in zip(episodes, advantages)]
    assert all(isinstance(r, EpisodeSample) for r in rows)
    phases = _phase_rows(episodes, advantages)
    assert len(phases) > len(rows)
    per_phase, grads_phase = _loss_and_grads(model, loss, [make_batch(phases, rows_multiple=4)])
    per_episode, grads_episode = _loss_and_grads(model, loss, [make_batch(rows, rows_multiple=4)])
    micro = make_micro_batches(rows, micro_batch_size=3, pad_to_multiple=4)
    per_micro, grads_micro = _loss_and_grads(model, loss, micro)
    assert abs(per_phase) > 1e-3  # not trivially zero
    assert per_episode == pytest.approx(per_phase, abs=1e-5)
    assert per_micro == pytest.approx(per_phase, abs=1e-5)
    assert max(np.abs(g).max() for g in grads_phase) > 1e-3
    for a, b, c in zip(grads_phase, grads_episode, grads_micro, strict=True):
        np.testing.assert_allclose(b, a, atol=1e-5)
        np.testing.assert_allclose(c, a, atol=1e-5)
    # And not by accident: one phase's advantage changed changes the loss.
    advantages[0][0] += 1.0
    shifted = [episode_sample(r, a) for r, a in zip(episodes, advantages)]
    moved, _ = _loss_and_grads(model, loss, [make_batch(shifted, rows_multiple=4)])
    assert abs(moved - per_phase) > 1e-4


def test_remat_gives_the_same_loss_and_gradients_and_is_really_used():
    """`LearnerConfig.remat` recomputes layer activations: same numbers, another program."""
    model = lib.tiny_model(seed=2)
    episodes, advantages = _episodes(seed=7)
    batch = make_batch([episode_sample(r, a) for r, a in zip(episodes, advantages)])
    plain = grpo.GRPOLoss(config=CONFIGS["token-mean"], chunk_tokens=16)
    remat = dataclasses.replace(plain, remat=True)
    loss, grads = _loss_and_grads(model, plain, [batch])
    loss_r, grads_r = _loss_and_grads(model, remat, [batch])
    assert abs(loss) > 1e-3
    assert loss_r == pytest.approx(loss, abs=1e-6)
    for a, b in zip(grads, grads_r, strict=True):
        np.testing.assert_allclose(b, a, atol=1e-6)
    # What remat is for: the gradient program of a deeper model holds far fewer temporaries.
    deep = qwen3.Qwen3ForCausalLM(
        dataclasses.replace(lib.CONFIG, num_hidden_layers=6, max_position_embeddings=1024),
        rngs=nnx.Rngs(0),
    )
    lora.apply_lora(deep, rank=lib.RANK, alpha=lib.ALPHA, seed=1)
    rng = np.random.default_rng(0)
    long_rows = [
        Sample(
            prompt_ids=list(rng.integers(1, lib.CONFIG.vocab_size, 400)),
            completion_ids=list(rng.integers(1, lib.CONFIG.vocab_size, 112)),
            sampler_logprobs=[-1.0] * 112,
            advantage=1.0,
        )
        for _ in range(2)
    ]
    long_batch = make_batch(long_rows)
    graphdef, lora_state, base = nnx.split(deep, nnx.LoRAParam, ...)

    def temporaries(loss_fn) -> int:
        def f(lora_state):
            return loss_fn(nnx.merge(graphdef, lora_state, base), long_batch)[0]

        compiled = jax.jit(jax.grad(f)).lower(lora_state).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    plain_bytes, remat_bytes = temporaries(plain), temporaries(remat)
    assert remat_bytes < 0.5 * plain_bytes, (remat_bytes, plain_bytes)
    # remat_min_tokens: a batch of fewer tokens keeps its activations; one that reaches it
    # recomputes them.
    tokens = long_batch.input_ids.size
    above = temporaries(dataclasses.replace(remat, remat_min_tokens=tokens + 1))
    assert above > 0.9 * plain_bytes, (above, plain_bytes)
    assert temporaries(dataclasses.replace(remat, remat_min_tokens=tokens)) == remat_bytes


def test_micro_batches_of_their_own_lengths_update_as_one_batch():
    episodes, advantages = _episodes(seed=5, n=7)
    rows = [episode_sample(r, a) for r, a in zip(episodes, advantages)] + _phase_rows(
        episodes[:2], advantages[:2]
    )
    config = learner.LearnerConfig(
        learning_rate=1e-2, micro_batch_size=2, grpo=CONFIGS["token-mean"]
    )
    micro = make_micro_batches(rows, micro_batch_size=2, pad_to_multiple=4)
    assert len({b.input_ids.shape[1] for b in micro}) > 1  # lengths of their own
    assert all(b.input_ids.shape[0] == 2 for b in micro)
    lengths = [int(np.asarray(b.attention_mask).sum(1).max()) for b in micro]
    assert lengths == sorted(lengths, reverse=True)  # longest first
    results = []
    for batches in (make_batch(rows, pad_to_multiple=4, rows_multiple=2), micro):
        model = lib.tiny_model(seed=1)
        step = learner.make_train_step(model, config)
        state, metrics = step(learner.init_state(model, config), batches)
        results.append((jax.device_get(metrics), jax.tree.leaves(state.lora)))
    (whole, whole_lora), (split, split_lora) = results
    for name in ("train/loss", "train/tokens", "grpo/kl", "train/grad_norm", "grpo/ratio_min"):
        assert float(split[name]) == pytest.approx(float(whole[name]), rel=1e-5, abs=1e-7), name
    for a, b in zip(whole_lora, split_lora, strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(phases=[1, 0]), "3 completion ids but 2 phases"),
        (dict(phases=[1, 0, 3]), "phases outside 1..2"),
        (dict(phases=[0, 0, 0]), "no phase in the loss"),
        (dict(advantages=[1.0, float("nan")]), "non-finite advantage"),
    ],
)
def test_malformed_episode_rows_fail_with_a_clear_message(fields, message):
    good = dict(
        prompt_ids=[1],
        completion_ids=[2, 3, 4],
        sampler_logprobs=[-1.0, 0.0, -1.0],
        phases=[1, 0, 2],
        advantages=[1.0, -1.0],
    )
    with pytest.raises(ValueError, match=message):
        make_batch([EpisodeSample(**dict(good, **fields))])
    with pytest.raises(ValueError, match="keep them per token"):
        make_batch([EpisodeSample(**good)], per_token_advantages=False)


@pytest.mark.parametrize("aggregation", sorted(CONFIGS))
def test_scoring_only_the_loss_columns_gives_the_same_loss_and_gradients(aggregation):
    """`Batch.score_positions`: the head on the loss columns only, the same numbers."""
    model = lib.tiny_model(seed=4)
    loss = grpo.GRPOLoss(config=CONFIGS[aggregation], chunk_tokens=16)
    episodes, advantages = _episodes(seed=13, n=5)
    rows = [episode_sample(r, a) for r, a in zip(episodes, advantages)] + _phase_rows(
        episodes[:2], advantages[:2]
    )
    for batches in (
        [make_batch(rows, rows_multiple=4)],
        make_micro_batches(rows, micro_batch_size=3, pad_to_multiple=4),
    ):
        every = [dataclasses.replace(b, score_positions=None) for b in batches]
        for b in batches:  # fewer columns than the row, and every loss column listed
            positions, mask = np.asarray(b.score_positions), np.asarray(b.loss_mask)
            assert positions.shape[1] < mask.shape[1]
            for row in range(mask.shape[0]):
                listed = set(positions[row][positions[row] > 0].tolist())
                assert listed == set(np.flatnonzero(mask[row][1:] > 0) + 1)
        scored, grads_scored = _loss_and_grads(model, loss, batches)
        full, grads_full = _loss_and_grads(model, loss, every)
        assert abs(full) > 1e-3
        assert scored == pytest.approx(full, abs=1e-6)
        for a, b in zip(grads_full, grads_scored, strict=True):
            np.testing.assert_allclose(b, a, atol=1e-6)
    # A position missing from the list drops its token from the loss: the list is what counts.
    batch = make_batch(rows, rows_multiple=4)
    short = np.asarray(batch.score_positions).copy()
    short[0, 0] = 0
    moved, _ = _loss_and_grads(
        model, loss, [dataclasses.replace(batch, score_positions=jnp.asarray(short))]
    )
    assert abs(moved - _loss_and_grads(model, loss, [batch])[0]) > 1e-7
