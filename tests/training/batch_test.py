"""Left padding to a given length, length buckets and the micro-batch plan."""

import numpy as np
import pytest

from pau_jax.training import batch


def test_buckets_are_few_and_waste_at_most_a_third():
    buckets = {batch.bucket_length(n, 64) for n in range(1, 8193)}
    assert sorted(buckets) == [
        64,
        128,
        192,
        256,
        384,
        512,
        768,
        1024,
        1536,
        2048,
        3072,
        4096,
        6144,
        8192,
    ]
    for n in range(1, 4000, 7):
        b = batch.bucket_length(n, 64)
        assert n <= b and (b - batch.round_up(n, 64)) <= b / 3


def test_micro_batches_go_longest_first_each_at_its_own_length():
    lengths = [30, 500, 70, 480, 65, 40, 900]
    plan = batch.micro_batches(lengths, size=2, pad_to_multiple=64)
    assert [rows for rows, _ in plan] == [[6, 1], [3, 2], [4, 5], [0]]
    # 900 would bucket to 1024: capped at the batch's own length, 960.
    assert [length for _, length in plan] == [960, 512, 128, 64]
    padded = sum(len(rows) * length for rows, length in plan)
    assert padded < len(lengths) * 960  # less padding than one batch at the longest row
    with pytest.raises(ValueError, match="at least one row"):
        batch.micro_batches([], size=2, pad_to_multiple=8)


def test_left_pad_to_a_given_length():
    ids, attention, loss = batch.left_pad(
        [[1, 2]], [[3]], pad_to_multiple=4, rows_multiple=2, length=6
    )
    np.testing.assert_array_equal(ids, [[0, 0, 0, 1, 2, 3], [0] * 6])
    np.testing.assert_array_equal(attention, [[0, 0, 0, 1, 1, 1], [0] * 6])
    np.testing.assert_array_equal(loss, [[0, 0, 0, 0, 0, 1], [0] * 6])
    with pytest.raises(ValueError, match="shorter than the longest row"):
        batch.left_pad([[1, 2]], [[3]], pad_to_multiple=4, rows_multiple=1, length=2)
