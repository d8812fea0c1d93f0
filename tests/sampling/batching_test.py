"""Shape buckets and the host-side batch layout of generation."""

import numpy as np
import pytest

from pau_jax.sampling import batching


def test_bucket_sizes_are_powers_of_two_then_multiples():
    sizes = [batching.bucket_size(n, minimum=32, granularity=512) for n in (0, 1, 32, 33, 200)]
    assert sizes == [32, 32, 32, 64, 256]
    assert batching.bucket_size(513, minimum=32, granularity=512) == 1024
    assert batching.bucket_size(1100, minimum=32, granularity=512) == 1536
    for n in range(1, 2000, 7):
        assert batching.bucket_size(n, minimum=1, granularity=64) >= n


def test_layout_dedups_prompts_and_orders_rows_prompt_major():
    prompts = [[1, 2, 3], [4, 5], [1, 2, 3]]
    layout = batching.layout_batch(prompts, n_samples=2)
    assert layout.num_distinct == 2 and layout.num_rows == 6
    np.testing.assert_array_equal(layout.row_source[:6], [0, 0, 1, 1, 0, 0])
    assert len(layout.row_source) == 8 and not layout.active[6:].any() and layout.active[:6].all()
    np.testing.assert_array_equal(layout.last_tokens[:6], [3, 3, 5, 5, 3, 3])
    np.testing.assert_array_equal(layout.prompt_lens[:6], [3, 3, 2, 2, 3, 3])
    # All but the last token, left-padded.
    assert layout.input_ids.shape == (2, 32)
    np.testing.assert_array_equal(layout.input_ids[0, -2:], [1, 2])
    np.testing.assert_array_equal(layout.input_ids[1, -1:], [4])
    np.testing.assert_array_equal(layout.mask.sum(-1), [2, 1])


def test_array_prompts_follow_their_mask():
    ids = np.array([[0, 0, 7, 8], [9, 10, 11, 0]])
    mask = np.array([[0, 0, 1, 1], [1, 1, 1, 0]])
    assert batching.prompts_as_lists(ids, mask) == [[7, 8], [9, 10, 11]]
    assert batching.prompts_as_lists(ids) == [[0, 0, 7, 8], [9, 10, 11, 0]]
    with pytest.raises(ValueError, match="shape"):
        batching.prompts_as_lists(ids, mask[:, :3])


def test_cache_rooms_double_from_a_quarter_of_the_prompt_width_to_the_budget():
    assert batching.cache_rooms(128, 64) == (32, 64)
    assert batching.cache_rooms(32, 16) == (16,)
    assert batching.cache_rooms(64, 64) == (16, 32, 64)
    assert batching.cache_rooms(2048, 512) == (512,)
    assert batching.cache_rooms(512, 1536) == (128, 256, 512, 1024, 1536)
    for width in (32, 64, 100, 512, 1024):
        for budget in (16, 64, 512, 2048):
            rooms = batching.cache_rooms(width, budget)
            assert rooms[-1] == budget and list(rooms) == sorted(set(rooms))
