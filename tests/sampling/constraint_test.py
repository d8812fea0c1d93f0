"""The input-phase token automaton: random walks parse with the right arity; device == host."""

import ast
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pau_jax.env import parse
from pau_jax.sampling import byte_dfa, constraint, input_grammar, token_bytes, token_mask
from pau_jax.sandbox.args import parse_call_args

# A tiny byte vocabulary: every printable byte, tab and newline, pieces of the wrappers,
# multi-byte UTF-8 (whole and split), and pieces the parsers would misread.
_PIECES = [bytes([b]) for b in [9, 10, *range(0x20, 0x7F)]] + [
    b"```",
    b"```\n",
    b"\n```",
    b"```python\n",
    b"test_func(",
    b"Input: ",
    b"True",
    b"None",
    b"False",
    b"', '",
    b"),",
    b", ",
    b"12",
    b"[[",
    b"]]",
    b"b'",
    b"\xc3\xa9",
    b"\xc3",
    b"\xa9",
    b"\xe4\xb8",
    b"\xad",
    b"\xe4\xb8\xad",
    b"<think>",
    b"f(",
    b"ab(",
    b"a (",
    b"<t",
    b"< ",
    b"\x00",
    b"\\n",
    b"1.5e",
    b"-3",
]
VOCAB = [*_PIECES, None, None]  # a stop token and another special token
STOP = len(_PIECES)
VOCAB_SIZE = len(VOCAB) + 7  # the model's padded vocabulary


def _automaton(arity, wrapper="fence"):
    return constraint.build(VOCAB, [STOP], arity=arity, wrapper=wrapper, vocab_size=VOCAB_SIZE)


def _finish_tokens(a: constraint.TokenAutomaton) -> np.ndarray:
    """[S + 2] a token on a shortest path to completion from each state (host, for the walks)."""
    nxt = np.asarray(a.next_state)
    n = len(nxt)
    dist = np.where(np.asarray(a.accepting), 0, 10**6)
    dist[a.free] = dist[a.dead] = 0
    while True:
        via = np.where(nxt >= 0, dist[np.maximum(nxt, 0)] + 1, 10**6)
        via[:, 1] = 10**6  # the stop class
        new = np.minimum(dist, via.min(axis=1))
        if np.array_equal(new, dist):
            break
        dist = new
    reachable = np.zeros(n, bool)
    reachable[a.start] = True
    while True:
        grown = reachable.copy()
        grown[nxt[reachable][nxt[reachable] >= 0]] = True
        if np.array_equal(grown, reachable):
            break
        reachable = grown
    assert dist[reachable].max() < 10**6, "a reachable state cannot complete"
    best_class = np.where(np.asarray(a.accepting), 1, via.argmin(axis=1))
    classes = np.asarray(a.token_class)
    first = {c: int(np.flatnonzero(classes == c)[0]) for c in np.unique(best_class)}
    return np.array([first[c] for c in best_class[:n]], np.int32)


@functools.partial(jax.jit, static_argnames="steps")
def _walk(a, finish, budgets, key, stop, steps):
    """[B] walks: uniform among allowed tokens for `budgets` steps, then towards completion."""
    rows = budgets.shape[0]
    states = jnp.full((rows,), a.start, jnp.int32)

    def step(carry, t):
        states, done, key = carry
        key, sub = jax.random.split(key)
        noise = jax.random.gumbel(sub, (rows, a.vocab_size))
        towards = jnp.where(jnp.arange(a.vocab_size) == finish[states][:, None], 0.0, -1e9)
        logits = jnp.where((t < budgets)[:, None], noise, towards)
        tokens = jnp.argmax(token_mask.mask_logits(a, states, logits), axis=-1)
        tokens = jnp.where(done, -1, tokens)
        states = jnp.where(done, states, token_mask.advance(a, states, jnp.maximum(tokens, 0)))
        return (states, done | (tokens == stop), key), tokens

    (_, done, _), tokens = jax.lax.scan(step, (states, budgets < 0, key), jnp.arange(steps))
    return tokens.T, done


def _text(tokens) -> str:
    return b"".join(VOCAB[t] for t in tokens if t >= 0 and t != STOP).decode("utf-8")


def _args_text(text: str, wrapper: str) -> str:
    if wrapper == "fence":
        return text.removeprefix("```\n").removesuffix("\n```")
    if wrapper == "input_line":
        return text.removeprefix("Input: ")
    return text.removeprefix("```python\ntest_func").removesuffix("\n```")


def _check_reply(text: str, arity: int, wrapper: str) -> None:
    args_text = _args_text(text, wrapper)
    if wrapper == "call":  # the call's arguments, each a literal
        call = ast.parse("f" + args_text, mode="eval").body
        expected = tuple(ast.literal_eval(a) for a in call.args)
    else:
        expected = ast.literal_eval(args_text)
    assert isinstance(expected, tuple) and len(expected) == arity, text
    lenient = parse.input_candidates(text)
    assert lenient and parse_call_args(lenient[0], arity) == expected, (text, lenient)
    if wrapper != "call":  # the strict reader does not read calls
        strict = parse.extract_input(text)
        assert strict.ok and parse_call_args(strict.args_text, arity) == expected, text


@pytest.mark.parametrize(
    "arity,wrapper,rows",
    [
        (1, "fence", 192),
        (2, "fence", 192),
        (3, "fence", 192),
        (2, "input_line", 64),
        (1, "call", 64),
    ],
)
def test_random_walks_parse_with_the_right_arity(arity, wrapper, rows):
    a = jax.device_put(_automaton(arity, wrapper))
    finish = jnp.asarray(_finish_tokens(a))
    budgets = jnp.asarray(np.random.default_rng(arity).integers(0, 80, rows), jnp.int32)
    tokens, done = _walk(a, finish, budgets, jax.random.key(arity), STOP, steps=200)
    assert bool(done.all())
    texts = [_text(row) for row in np.asarray(tokens)]
    for text in texts:
        _check_reply(text, arity, wrapper)
    assert len(set(texts)) > rows // 2  # the walks explore


def test_bounded_tokens_keep_a_reply_within_its_bytes_and_digits():
    bounded = constraint.Component("input", arity=2, max_piece_bytes=2, max_piece_digits=1)
    a = constraint.build_components(VOCAB, [STOP], [bounded], vocab_size=VOCAB_SIZE)
    classes = np.asarray(a.token_class)
    never = [i for i, p in enumerate(VOCAB) if p and (len(p) > 2 or p == b"12")]
    assert b"```\n" in [VOCAB[i] for i in never] and all(classes[never] == 0)
    a = jax.device_put(a)
    finish = jnp.asarray(_finish_tokens(a))
    budgets = jnp.asarray(np.random.default_rng(5).integers(0, 60, 64), jnp.int32)
    tokens, done = _walk(a, finish, budgets, jax.random.key(5), STOP, steps=200)
    assert bool(done.all())
    for row in np.asarray(tokens):
        kept = [t for t in row if t >= 0 and t != STOP]
        assert all(len(VOCAB[t]) <= 2 and VOCAB[t] != b"12" for t in kept)
        _check_reply(_text(row), 2, "fence")  # a reply of n tokens: at most 2n bytes
    with pytest.raises(ValueError, match="only an 'input' component"):
        constraint.Component("decision", max_piece_bytes=3)


def test_arity_zero_and_rejected_replies():
    dfa = byte_dfa.compile_dfa(input_grammar.grammar(0))
    assert dfa.accepting[dfa.walk(0, b"```\n()\n```")]
    dfa = byte_dfa.compile_dfa(input_grammar.grammar(2))
    for bad in [
        b"```\n(1)\n```",
        b"```\n(1, 2, 3)\n```",
        b"```\n(01, 1)\n```",
    ]:
        end = dfa.walk(0, bad)
        assert end < 0 or not dfa.accepting[end], bad
    assert dfa.accepting[dfa.walk(0, b"```\n({1: [2.5e-3, b'x']}, ('(a)', '1 < 2'))\n```")]
    assert dfa.accepts(b"```\n('f(x)', 1)\n```")  # the parsers read a literal as a literal


def _host_live(dfa) -> np.ndarray:
    """[S] states from which some token sequence reaches an accepting state (by walking bytes)."""
    succ = [{dfa.walk(s, p) for p in VOCAB if p} - {-1} for s in range(len(dfa.delta))]
    live = dfa.accepting.copy()
    while True:
        grown = live | np.array([any(live[t] for t in ts) for ts in succ])
        if np.array_equal(grown, live):
            return live
        live = grown


def _host_next(a, dfa, live, state: int, token: int) -> int:
    if state == a.free:
        return a.free
    if token == STOP:
        return state if state == a.dead or dfa.accepting[state] else a.dead
    if state == a.dead or token >= len(VOCAB) or VOCAB[token] is None:
        return a.dead
    end = dfa.walk(state, VOCAB[token])
    return a.dead if end < 0 or not live[end] else end


def test_device_tables_agree_with_the_host_dfa():
    a = _automaton(2)
    dfa = byte_dfa.compile_dfa(input_grammar.grammar(2))
    live = _host_live(dfa)
    rng = np.random.default_rng(0)
    states = rng.integers(0, a.dead + 1, 512).astype(np.int32)
    tokens = rng.integers(0, VOCAB_SIZE, 512).astype(np.int32)
    nxt = jax.jit(token_mask.advance)(a, jnp.asarray(states), jnp.asarray(tokens))
    expected = [_host_next(a, dfa, live, int(s), int(t)) for s, t in zip(states, tokens)]
    np.testing.assert_array_equal(np.asarray(nxt), expected)
    logits = jnp.zeros((64, VOCAB_SIZE))
    masked = np.asarray(jax.jit(token_mask.mask_logits)(a, jnp.asarray(states[:64]), logits))
    for row, s in zip(masked, states[:64]):
        allowed = [
            t
            for t in range(VOCAB_SIZE)
            if s == a.free
            or (_host_next(a, dfa, live, int(s), t) != a.dead or (s == a.dead and t == STOP))
        ]
        np.testing.assert_array_equal(np.flatnonzero(np.isfinite(row)), allowed)


def test_free_rows_are_unchanged_and_masked_log_softmax_matches_numpy():
    a = jax.device_put(_automaton(1))
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(6, VOCAB_SIZE)).astype(np.float32) * 3
    states = jnp.asarray([a.free, a.start, 3, a.free, 7, a.dead], jnp.int32)
    masked = jax.jit(token_mask.mask_logits)(a, states, jnp.asarray(logits))
    np.testing.assert_array_equal(np.asarray(masked)[[0, 3]], logits[[0, 3]])
    got = np.asarray(jax.nn.log_softmax(masked, axis=-1))
    allowed = np.asarray(token_mask.allowed_tokens(a, states))
    for row in range(6):
        keep = allowed[row]
        top = logits[row][keep].max()
        ref = logits[row] - top - np.log(np.exp(logits[row][keep] - top).sum())
        np.testing.assert_allclose(got[row][keep], ref[keep], rtol=1e-5, atol=1e-5)
        assert np.all(np.isneginf(got[row][~keep]))


def test_the_build_is_cached_per_vocabulary_arity_and_wrapper():
    assert _automaton(2) is _automaton(2)
    assert _automaton(2, "input_line") is not _automaton(2)
    assert constraint.build(VOCAB[:-1] + [b"zz"], [STOP], arity=2, vocab_size=VOCAB_SIZE) is not (
        _automaton(2)
    )


@pytest.mark.slow
@pytest.mark.parametrize("arity", [1, 2, 3])
def test_random_walks_over_the_qwen_vocabulary_parse(arity):
    from pau_jax.tokenizer import load_tokenizer

    tok = load_tokenizer("qwen3-offline")
    stop = tok.eos_token_id
    a = constraint.build(token_bytes.vocabulary(tok), [stop], arity=arity, vocab_size=151_936)
    a = jax.device_put(a)
    finish = jnp.asarray(_finish_tokens(a))
    budgets = jnp.asarray(np.random.default_rng(arity).integers(0, 60, 32), jnp.int32)
    tokens, done = _walk(a, finish, budgets, jax.random.key(arity), stop, steps=160)
    assert bool(done.all())
    for row in np.asarray(tokens):
        _check_reply(tok.decode([int(t) for t in row if t >= 0 and t != stop]), arity, "fence")
