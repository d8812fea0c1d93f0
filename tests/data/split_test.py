"""Tests of the example split."""

import random

from pau_jax.data import split


def _obs(key, output, lines=(), arcs=(), seed=False):
    return split.Observation(
        args=(key,),
        key=key,
        output=output,
        lines=frozenset(lines),
        arcs=frozenset(arcs),
        is_seed=seed,
    )


def test_shown_examples_have_distinct_outputs_and_prefer_seeds():
    candidates = [
        _obs("a", "1", seed=True),
        _obs("b", "1", seed=True),
        _obs("c", "2"),
        _obs("d", "3", seed=True),
    ]
    for seed in range(20):
        shown = split.choose_shown(candidates, random.Random(seed))
        assert len(shown) == 2
        assert shown[0].output != shown[1].output
        assert all(o.is_seed for o in shown)


def test_shown_is_none_when_outputs_are_constant():
    assert split.choose_shown([_obs("a", "1"), _obs("b", "1")], random.Random(0)) is None


def test_heldout_covers_then_diversifies():
    statements = {1, 2, 3, 4}
    branches = {(2, 3), (2, 4)}
    pool = [
        _obs("p", "x", lines={1, 2, 3}, arcs={(2, 3)}),
        _obs("q", "x", lines={1, 2, 3}, arcs={(2, 3)}),
        _obs("r", "y", lines={1, 2, 4}, arcs={(2, 4)}),
        _obs("s", "z", lines={1, 2, 4}, arcs={(2, 4)}),
        _obs("t", "x", lines={1, 2, 4}, arcs={(2, 4)}),
    ]
    held = split.choose_heldout(pool, statements, branches, 3, random.Random(0))
    assert len(held) == 3
    covered_lines = set().union(*(o.lines for o in held))
    covered_arcs = set().union(*(o.arcs for o in held))
    assert covered_lines == statements and covered_arcs == branches
    # The extra input brings an output not yet held out.
    assert {o.output for o in held} == {"x", "y", "z"}
    assert split.choose_heldout(pool, statements, branches, 3, random.Random(0)) == held


def test_shown_avoids_inputs_that_coverage_needs_when_it_can():
    pool = [_obs("a", "1"), _obs("b", "2"), _obs("c", "1"), _obs("d", "2")]
    for seed in range(10):
        shown = split.choose_shown(pool, random.Random(seed), avoid={"a", "b"})
        assert {o.key for o in shown} == {"c", "d"}
    only = split.choose_shown(pool[:3], random.Random(0), avoid={"a", "b"})
    assert {o.key for o in only} in ({"c", "b"},)
