"""Structured decoding in the jitted sampler: masked rows parse, free rows are untouched,
log-probs are the masked softmax, the draws follow it, and detector rows end at their label."""

import random
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from pau_jax.env import parse
from pau_jax.sampling import constraint, generate, logits, token_mask

# A 128-token byte vocabulary for the tiny model: printable ASCII, newline, wrapper and
# literal pieces, label pieces, split UTF-8; the last two ids are a stop token and another
# special token.
_PIECES = [bytes([b]) for b in [10, *range(0x20, 0x7F)]] + [
    b"```\n",
    b"\n```",
    b"```",
    b"True",
    b"None",
    b"False",
    b", ",
    b"12",
    b"[[",
    b"]]",
    b"Decision: ",
    b"STOP",
    b"CONTINUE",
    b"\xc3\xa9",
    b"\xc3",
    b"\xa9",
    b"'ab'",
    b"-3",
    b"1.5",
    b"b'",
    b"Hypothesis: ",
    b"decision",
    b": ",
    b"**",
    b"stop",
    b"),",
    b"(1",
    b"0,",
    b"\t",
    b"\n\n",
]
VOCAB = [*_PIECES, None, None]
STOP = len(_PIECES)
assert len(VOCAB) == 128


def _build(*components):
    return constraint.build_components(VOCAB, [STOP], list(components), vocab_size=128)


def _text(ids) -> str:
    return b"".join(VOCAB[i] or b"" for i in ids).decode("utf-8", "replace")


def _parses(text: str, arity: int) -> bool:
    """Whether the episode reads `text` as a call of `arity` arguments, leniently and strictly."""
    for fmt in ("lenient", "strict"):
        _, args, _ = parse.read_input(text, arity, fmt)
        if args is None or len(args) != arity:
            return False
    return True


PROMPTS = [[5, 9, 17, 3], [40, 41], [7, 8, 9, 10, 11, 12], [100, 3]]


def test_rows_in_the_free_state_sample_exactly_as_without_an_automaton(tiny_model):
    automaton = _build(constraint.Component("input", arity=2))
    for temperature in (0.0, 1.0):
        plain = generate(
            tiny_model, PROMPTS, max_new_tokens=12, temperature=temperature, n_samples=2, seed=4
        )
        free = generate(
            tiny_model, PROMPTS, max_new_tokens=12, temperature=temperature, n_samples=2, seed=4,
            automaton=automaton, automaton_starts=automaton.free,
        )  # fmt: skip
        assert plain.tokens == free.tokens
        for a, b in zip(plain.logprobs, free.logprobs, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-6)


def test_every_constrained_reply_parses_with_its_arity(tiny_model):
    """512 sampled replies of a random model, arities 1-3 side by side in each batch."""
    components = [constraint.Component("input", arity=k) for k in (1, 2, 3)]
    automaton = _build(*components)
    arities = [1, 2, 3, 2]
    starts = [automaton.starts[k - 1] for k in arities]
    bad, total = [], 0
    for seed in range(2):
        out = generate(
            tiny_model, PROMPTS, max_new_tokens=48, temperature=1.0, n_samples=64, seed=seed,
            automaton=automaton, automaton_starts=starts, stop_token_ids=[STOP],
        )  # fmt: skip
        for row, ids in enumerate(out.tokens):
            total += 1
            want = arities[row // 64]
            if not _parses(_text(ids), want) or out.finish_reasons[row] != "stop":
                bad.append((want, _text(ids), out.finish_reasons[row]))
    assert total == 512
    assert not bad, bad[:5]


def _fits(value, shape) -> bool:
    """Whether `value` is a literal of `shape` (an `input_example.value_shape` descriptor)."""
    kind = shape[0]
    if kind == "any":
        return True
    if kind == "alt":
        return any(_fits(value, s) for s in shape[1])
    if kind == "float":
        return type(value) in (int, float)
    scalar = {"bool": bool, "int": int, "str": str, "bytes": bytes, "none": type(None)}
    if kind in scalar:
        return type(value) is scalar[kind]
    if kind in ("list", "tuple", "set"):
        return type(value) is {"list": list, "tuple": tuple, "set": set}[kind] and all(
            _fits(v, shape[1]) for v in value
        )
    return type(value) is dict and all(
        _fits(k, shape[1]) and _fits(v, shape[2]) for k, v in value.items()
    )


SHAPED = {
    1: (("list", ("int",)),),
    2: (("str",), ("alt", (("none",), ("float",)))),
    3: (("dict", ("str",), ("list", ("bool",))), ("tuple", ("int",)), ("bytes",)),
}


def test_typed_replies_parse_with_each_argument_of_its_shape(tiny_model):
    """256 sampled replies under typed grammars: arities 1-3, each argument of its shape."""
    components = [constraint.Component("input", arity=k, shapes=SHAPED[k]) for k in (1, 2, 3)]
    automaton = _build(*components)
    arities = [1, 2, 3, 3]
    out = generate(
        tiny_model, PROMPTS, max_new_tokens=64, temperature=1.0, n_samples=64, seed=5,
        automaton=automaton, automaton_starts=[automaton.starts[k - 1] for k in arities],
        stop_token_ids=[STOP],
    )  # fmt: skip
    bad = []
    for row, ids in enumerate(out.tokens):
        arity, text = arities[row // 64], _text(ids)
        _, args, _ = parse.read_input(text, arity, "lenient")
        if args is None or not all(map(_fits, args, SHAPED[arity])):
            bad.append((arity, text, out.finish_reasons[row]))
    assert len(out.tokens) == 256 and not bad, bad[:5]


def _masked_reference(automaton, states, row_logits, remaining):
    """NumPy: log-softmax over the tokens the grammar allows and the budget leaves room for."""
    a = jax.tree.map(np.asarray, automaton)
    nxt = a.next_state[states][a.token_class].astype(np.int64)  # [V] next state per token
    allowed = nxt >= 0
    fits = allowed & (a.distance[np.maximum(nxt, 0)] < remaining)
    keep = fits if fits.any() else allowed
    x = np.where(keep, row_logits.astype(np.float64), -np.inf)
    return x - np.logaddexp.reduce(x[keep]), nxt


def test_logprobs_are_the_masked_softmax_of_a_full_forward(tiny_model):
    automaton = _build(constraint.Component("input", arity=2))
    budget = 16
    out = generate(
        tiny_model, PROMPTS[:2], max_new_tokens=budget, temperature=1.0, n_samples=3, seed=7,
        automaton=automaton, stop_token_ids=[STOP],
    )  # fmt: skip
    checked = 0
    for row, ids in enumerate(out.tokens):
        prompt = PROMPTS[row // 3]
        full = jnp.asarray([prompt + list(ids)])
        forward = np.asarray(tiny_model(full), np.float64)[0]  # [T, V]
        state = automaton.start
        for i, token in enumerate(ids):
            ref, nxt = _masked_reference(automaton, state, forward[len(prompt) - 1 + i], budget - i)
            assert np.isfinite(ref[token]), (row, i)
            np.testing.assert_allclose(out.logprobs[row][i], ref[token], atol=2e-4)
            state = int(nxt[token])
            checked += 1
        assert automaton.accepting[state]  # ended by completing its answer
    assert checked > 20


def test_draws_follow_the_masked_distribution():
    """Chi-square of 20,000 draws (one step, shared logits) against the masked softmax."""
    automaton = jax.device_put(_build(constraint.Component("input", arity=1)))
    rng = np.random.default_rng(0)
    rows = 20_000
    row_logits = rng.normal(size=128).astype(np.float32) * 2
    states = jnp.full(rows, automaton.start + 0, jnp.int32)
    # After "```\n(" the next token is a value's first piece: many tokens allowed.
    host = jax.tree.map(np.asarray, automaton)
    state = automaton.start
    for piece in (b"```\n", b"("):
        state = int(host.next_state[state, host.token_class[VOCAB.index(piece)]])
    states = jnp.full(rows, state, jnp.int32)
    masked = token_mask.mask_logits(
        automaton, states, jnp.tile(row_logits, (rows, 1)), jnp.full(rows, 64)
    )
    uniforms = jnp.asarray(rng.random((rows, 2), np.float32))
    tokens, logprobs, _ = logits.sample_tokens(
        masked, uniforms, jnp.ones(rows), jnp.zeros(rows, jnp.int32), jnp.ones(rows)
    )
    ref, _ = _masked_reference(automaton, state, row_logits, 64)
    probs = np.exp(ref)
    support = np.flatnonzero(probs > 0)
    assert 10 < len(support) < 128
    counts = np.bincount(np.asarray(tokens), minlength=128)
    assert counts[probs == 0].sum() == 0
    expected = probs[support] * rows
    big = expected >= 5
    observed, expect = counts[support][big], expected[big]
    if (~big).any():  # the rare tokens pooled into one bin
        observed = np.append(observed, counts[support][~big].sum())
        expect = np.append(expect, expected[~big].sum())
    assert stats.chisquare(observed, expect).pvalue > 1e-3
    np.testing.assert_allclose(np.asarray(logprobs), ref[np.asarray(tokens)], atol=1e-4)


# `env.parse`'s revision label with the detector's word boundaries (any non-ASCII character
# counts as a word character) and a closing non-word character.
_WORD = r"A-Za-z0-9_\x80-\U0010ffff"
_LABEL = re.compile(
    rf"(?<![{_WORD}])(?:decision|label|action)\s*[:=]\s*\**\s*(continue|stop)(?=[^{_WORD}])",
    re.I | re.A,
)


def test_the_decision_detector_fires_where_the_parser_first_reads_a_label():
    dfa, detector = constraint._byte_dfa(constraint.DECISION)
    assert detector
    pieces = ["Decision", "Decision:", "decision =", ":", " ", "\n", "**", "STOP", "stop."]
    pieces += ["CONTINUE", "Label:", "action", "=", "x", "in", ".", "_", "Hypothesis: f", "STOPx"]
    rng = random.Random(0)
    fired = 0
    for _ in range(5000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        state, first = 0, None
        for k, b in enumerate(text.encode()):
            state = int(dfa.delta[state, dfa.byte_class[b]])
            if dfa.accepting[state]:
                first = k + 1
                break
        match = _LABEL.search(text)
        assert first == (match.end() + 1 if match else None), text
        if first is not None:
            fired += 1
            cut = parse.parse_revision(text[:first])
            assert cut.stop == (match.group(1).upper() == "STOP")
    assert fired > 150


# A vocabulary in which a random model writes labels often.
_LABEL_VOCAB = (
    [b"Decision: "] * 30 + [b"STOP"] * 18 + [b"CONTINUE"] * 10 + [b"\n", b" ", b"*"] * 10
    + [b"x", b"decision", b":", b"=", b"_", b"stop"] * 6 + [b"\xc3\xa9"] * 2 + [None, None]
)  # fmt: skip


def test_detector_rows_end_with_the_token_that_completes_their_label(tiny_model):
    """Random replies under the detector: a row ends ('stop') exactly when its text has a label."""
    assert len(_LABEL_VOCAB) == 128
    stop = 126
    automaton = constraint.build_components(
        _LABEL_VOCAB, [stop], [constraint.Component("input", arity=1), constraint.DECISION]
    )
    detect = automaton.starts[1]
    out = generate(
        tiny_model, PROMPTS, max_new_tokens=40, temperature=1.0, n_samples=32, seed=2,
        automaton=automaton, automaton_starts=[detect, automaton.free, detect, detect],
        stop_token_ids=[stop],
    )  # fmt: skip

    def text(ids):
        return b"".join(_LABEL_VOCAB[i] or b"" for i in ids).decode("utf-8", "replace")

    ended, free_labels = 0, 0
    for row, ids in enumerate(out.tokens):
        if row // 32 == 1:  # free rows: a label does not stop them
            free_labels += bool(_LABEL.search(text(ids[:-1])))
            continue
        if out.finish_reasons[row] == "stop" and ids[-1] != stop:
            ended += 1
            assert _LABEL.search(text(ids)) and not _LABEL.search(text(ids[:-1])), text(ids)
        else:
            assert not _LABEL.search(text(ids)), text(ids)
    assert ended >= 20 and free_labels >= 5, (ended, free_labels)


def test_bad_starts_and_vocabulary_mismatch_fail_in_one_line(tiny_model):
    automaton = _build(constraint.Component("input", arity=1))
    with pytest.raises(ValueError, match="automaton_starts must each be one of"):
        generate(tiny_model, PROMPTS, max_new_tokens=4, automaton=automaton, automaton_starts=5)
    with pytest.raises(ValueError, match="without an automaton"):
        generate(tiny_model, PROMPTS, max_new_tokens=4, automaton_starts=0)
    wide = constraint.build_components(
        VOCAB, [STOP], [constraint.Component("input", arity=1)], vocab_size=160
    )
    with pytest.raises(ValueError, match="build it with vocab_size"):
        generate(tiny_model, PROMPTS, max_new_tokens=4, automaton=wide)


def test_every_masked_rating_reply_parses_within_its_budget(tiny_model):
    """A grader's reply under the rating mask always ends with a rating the judge reads."""
    from pau_jax.evaluation import judge

    automaton = _build(constraint.RATING)
    for budget, seed in ((12, 0), (40, 1)):
        out = generate(
            tiny_model, PROMPTS, max_new_tokens=budget, temperature=1.0, n_samples=32, seed=seed,
            automaton=automaton, automaton_starts=[automaton.starts[0]] * 4, stop_token_ids=[STOP],
        )  # fmt: skip
        texts = [_text(ids) for ids in out.tokens]
        scores = [judge.parse_rating(t) for t in texts]
        assert None not in scores, [t for t, s in zip(texts, scores) if s is None][:3]
        assert all(t.rstrip()[-1] == str(s) for t, s in zip(texts, scores))
        assert all(len(ids) <= budget for ids in out.tokens)
        if budget == 40:  # free text first: the replies are not all the shortest rating
            assert len(set(texts)) > 100 and min(len(t) for t in texts) > len("Rating: 5")


def test_every_masked_code_reply_is_one_closed_block_within_its_budget(tiny_model):
    """A coder's reply under the code mask is one ```python block, closed, read as written."""
    from pau_jax.evaluation import code_match

    automaton = _build(constraint.CODE)
    for budget, seed in ((8, 0), (40, 1)):
        out = generate(
            tiny_model, PROMPTS, max_new_tokens=budget, temperature=1.0, n_samples=32, seed=seed,
            automaton=automaton, automaton_starts=[automaton.starts[0]] * 4, stop_token_ids=[STOP],
        )  # fmt: skip
        texts = [_text(ids) for ids in out.tokens]
        for text in texts:
            assert text.lstrip().startswith("```") and text.endswith("```"), text
            body = text.lstrip().split("\n", 1)[1][:-3]  # after the opening fence's line
            assert "```" not in body and code_match.extract_code(text) == body.strip() + "\n"
        assert all(len(ids) <= budget for ids in out.tokens)
        assert len(set(texts)) > 64
