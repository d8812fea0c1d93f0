"""make_batch: left padding, masks and log-prob alignment by hand-built tables and by the sampler."""

import numpy as np
import pytest
import rl_testlib as lib

from pau_jax.rl.samples import Sample, make_batch
from pau_jax.sampling import generate
from pau_jax.training import logprobs as logprobs_lib


def _two_samples():
    return [
        Sample(
            prompt_ids=[5, 6, 7],
            completion_ids=[8, 9],
            sampler_logprobs=[-0.5, -1.5],
            advantage=1.25,
        ),
        Sample(prompt_ids=[3], completion_ids=[4], sampler_logprobs=[-2.0], advantage=-0.75),
    ]


def test_hand_built_table_with_row_padding():
    batch = make_batch(_two_samples(), pad_to_multiple=3, rows_multiple=4, pad_id=1)
    # Longest row has 5 tokens -> T = 6; 2 samples -> B = 4 (two padding rows).
    np.testing.assert_array_equal(
        np.asarray(batch.input_ids),
        [[1, 5, 6, 7, 8, 9], [1, 1, 1, 1, 3, 4], [1] * 6, [1] * 6],
    )
    np.testing.assert_array_equal(
        np.asarray(batch.attention_mask),
        [[0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1], [0] * 6, [0] * 6],
    )
    np.testing.assert_array_equal(
        np.asarray(batch.loss_mask),
        [[0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 1], [0] * 6, [0] * 6],
    )
    np.testing.assert_array_equal(
        np.asarray(batch.sampler_logprobs),
        [[0, 0, 0, 0, -0.5, -1.5], [0, 0, 0, 0, 0, -2.0], [0] * 6, [0] * 6],
    )
    np.testing.assert_array_equal(np.asarray(batch.advantages), [1.25, -0.75, 0, 0])
    assert batch.input_ids.dtype == np.int32
    assert batch.loss_mask.dtype == np.float32
    assert batch.sampler_logprobs.dtype == np.float32


@pytest.mark.parametrize(("multiple", "expected_t"), [(1, 5), (4, 8), (5, 5), (8, 8), (16, 16)])
def test_length_rounds_up_to_the_multiple(multiple, expected_t):
    batch = make_batch(_two_samples(), pad_to_multiple=multiple)
    assert batch.input_ids.shape == (2, expected_t)
    # The real tokens always end in the last column.
    assert np.asarray(batch.attention_mask)[:, -1].tolist() == [1, 1]


def test_sampler_logprobs_line_up_with_the_learner_log_probs():
    """Scores from `generate` (temperature 1) equal training.logprobs.token_logprobs on every completion token."""
    model = lib.tiny_model()
    prompts = [[3, 14, 15, 9, 2, 6], [5, 35], [8, 9, 7, 9]]
    out = generate(model, prompts, max_new_tokens=5, temperature=1.0, n_samples=2, seed=3)
    samples = [
        Sample(
            prompt_ids=prompts[row // 2],
            completion_ids=out.tokens[row],
            sampler_logprobs=out.plain_logprobs[row].tolist(),
            advantage=0.0,
        )
        for row in range(len(out.tokens))
    ]
    batch = make_batch(samples, rows_multiple=4)
    logp, _ = logprobs_lib.token_logprobs(model, batch.input_ids, batch.attention_mask)
    mask = np.asarray(batch.loss_mask) > 0
    assert mask.sum() == sum(len(t) for t in out.tokens)
    np.testing.assert_allclose(
        np.asarray(logp)[mask], np.asarray(batch.sampler_logprobs)[mask], atol=2e-5
    )
    # And not trivially: shifting the alignment by one column breaks the match.
    shifted = np.roll(np.asarray(batch.sampler_logprobs), 1, axis=1)
    assert not np.allclose(np.asarray(logp)[mask], shifted[mask], atol=1e-2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(completion_ids=[1, 2], sampler_logprobs=[-1.0]), "2 completion ids but 1"),
        (dict(completion_ids=[], sampler_logprobs=[]), "empty completion"),
        (dict(prompt_ids=[]), "empty prompt"),
        (dict(sampler_logprobs=[float("nan")]), "not finite"),
        (dict(sampler_logprobs=[0.5]), "<= 0"),
        (dict(advantage=float("inf")), "non-finite advantage"),
        (dict(prompt_ids=[-1]), "non-negative integers"),
    ],
)
def test_malformed_samples_fail_with_a_clear_message(kwargs, message):
    fields = dict(prompt_ids=[1], completion_ids=[2], sampler_logprobs=[-1.0], advantage=0.0)
    fields.update(kwargs)
    good = Sample(prompt_ids=[1], completion_ids=[2], sampler_logprobs=[-1.0], advantage=0.0)
    with pytest.raises(ValueError, match=message) as info:
        make_batch([good, Sample(**fields)])
    assert "sample 1" in str(info.value)


def test_bad_arguments():
    with pytest.raises(ValueError, match="at least one sample"):
        make_batch([])
    with pytest.raises(ValueError, match="pad_to_multiple"):
        make_batch(_two_samples(), pad_to_multiple=0)
    with pytest.raises(TypeError, match="expected a samples.Sample"):
        make_batch([{"prompt_ids": [1]}])
