"""The input grammar against the parsers: every literal `repr` writes is accepted (complete), and
every reply the byte DFA accepts reads back, strict and lenient, as the literal it spells (sound)."""

import ast
import functools
import math
import random
import warnings

import numpy as np
import pytest

from pau_jax.env import input_example, parse
from pau_jax.sampling import byte_dfa, input_grammar
from pau_jax.sandbox import equality, values
from pau_jax.sandbox.args import parse_call_args


@functools.cache
def _dfa(arity: int, wrapper: str = "fence", shapes: tuple = ()) -> byte_dfa.ByteDFA:
    return byte_dfa.compile_dfa(input_grammar.grammar(arity, wrapper, shapes=shapes))


def _reply(args_text: str, wrapper: str = "fence") -> str:
    if wrapper == "fence":
        return f"```\n{args_text}\n```"
    if wrapper == "input_line":
        return f"Input: {args_text}"
    return f"```python\ntest_func{args_text}\n```"


def _write(value, scalar=repr) -> str:
    """`repr` (or `scalar` for each scalar), with inf as `1e999` (`repr`'s `inf` is no literal)."""
    if isinstance(value, float) and math.isinf(value):
        return "1e999" if value > 0 else "-1e999"
    items = functools.partial(_items, scalar=scalar)
    if isinstance(value, list):
        return f"[{items(value)}]"
    if isinstance(value, tuple):
        return f"({items(value)}{',' if len(value) == 1 else ''})"
    if isinstance(value, set):
        return f"{{{items(value)}}}" if value else "set()"
    if isinstance(value, dict):
        pairs = (f"{_write(k, scalar)}: {_write(v, scalar)}" for k, v in value.items())
        return "{" + ", ".join(pairs) + "}"
    return scalar(value)


def _items(values_, scalar) -> str:
    return ", ".join(_write(v, scalar) for v in values_)


def _same(a, b) -> bool:
    return equality.typed_equal(a, b, float_rtol=0.0)


def _read(reply: str, arity: int, wrapper: str = "fence") -> tuple:
    """The arguments the runner reads from `reply`, strict and lenient (which must agree)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an escape Python only warns about is not accepted
        lenient = parse.input_candidates(reply)
        assert lenient, reply
        args = parse_call_args(lenient[0], arity)
        if wrapper != "call":  # the strict reader does not read calls
            strict = parse.extract_input(reply)
            assert strict.ok, reply
            assert _same(parse_call_args(strict.args_text, arity), args), reply
    return args


# Replies a model may write: `repr`'s forms, and what Python also reads as a literal.
VALID = [
    (0, "()"),
    (0, "( )"),
    (1, "(1,)"),
    (1, "( 1 , )"),
    (2, "(1, 'a')"),
    (2, "(1,'a',)"),
    (2, "( -1 ,\t+ 2 )"),
    (1, "('\\x00<think>f(x)</think>```',)"),
    (1, "('a`b``c',)"),
    (1, "(b'\\xff\\x00\\n',)"),
    (3, "(1e+20, 1e-05, -0.0)"),
    (3, "(1., .5, 01.5E3)"),
    (2, "(1e999, -1e999)"),
    (2, "(00, -0)"),
    (1, "('\\u00e9\\U0001F600\\x41\\a\\b\\f\\v\\'\\\"\\\\',)"),
    (1, "('é😀\\u2028\u2028\x85',)"),
    (1, "('\\0\\101\\377\\47\\4x\\48',)"),
    (2, "(u'x', B\"y\")"),
    (1, '("it\'s",)'),
    (1, "({(1, 'a'): [1, 2], 2: {}},)"),
    (2, "({(1, 2), 3}, set())"),
    (1, "([[1], [2, 3,],],)"),
    (2, "({}, [])"),
    (1, "({1: {2: 3}},)"),
    (1, '("a\'b",)'),
    (2, "(True, None)"),
]

INVALID = [
    (2, "(1)"),
    (2, "(1, 2, 3)"),
    (1, "(1)"),  # read as (1,), but not the form the prompt asks for
    (1, "('a' 'b',)"),  # implicit concatenation
    (1, "('\\q',)"),  # an escape Python only warns about
    (1, "('\\477',)"),  # an octal escape past \377
    (1, "('\\400',)"),
    (1, "('\\U00110000',)"),
    (1, "('\\N{BULLET}',)"),
    (1, "(b'\\u0041',)"),
    (1, "(b'\xc3\xa9',)"),  # bytes hold ASCII only
    (1, "(inf,)"),
    (1, "(nan,)"),
    (1, "(1_000,)"),
    (1, "(0x10,)"),
    (1, "(01,)"),
    (1, "({[1]: 2},)"),  # unhashable keys and items
    (1, "({[1]},)"),
    (1, "({(1, [2]): 3},)"),
    (1, "([[[1]]],)"),  # deeper than the default depth 2
    (1, "(r'x',)"),
    (1, "('''x''',)"),
    (1, "('a\nb',)"),
    (1, "('\x01',)"),  # a raw control character
    (1, "(-(1),)"),
    (1, "(--1,)"),
    (1, "(f'x',)"),
]


@pytest.mark.parametrize("arity,args_text", VALID)
def test_hand_written_replies_are_accepted_and_read_as_written(arity, args_text):
    reply = _reply(args_text)
    assert _dfa(arity).accepts(reply.encode()), reply
    assert _same(_read(reply, arity), ast.literal_eval(args_text))


@pytest.mark.parametrize("arity,args_text", INVALID)
def test_replies_outside_the_grammar_are_refused(arity, args_text):
    assert not _dfa(arity).accepts(_reply(args_text).encode())


# --- a seeded corpus of awkward values ---------------------------------------------------

_AWKWARD = [
    "",
    "'",
    '"',
    "'\"",
    "\\",
    "`",
    "```",
    "<think>",
    "</think>",
    "f(x)",
    "test_func(1, 2)",
    "a (b",
    "\n",
    "\r\n",
    "\t",
    "\x00",
    "\x7f",
    "\x85",
    "\xa0",
    "\u2028",
    "\ud800",
    "\U0001f600",
    "\U000e0001",
    "é",
    "中",
    ">>> ",
    "Input: ",
    "arg0 = 1",
    "def f(x):",
]


def _random_str(rng: random.Random) -> str:
    pieces = []
    for _ in range(rng.randrange(4)):
        kind = rng.random()
        if kind < 0.4:
            pieces.append(rng.choice(_AWKWARD))
        elif kind < 0.6:
            pieces.append(chr(rng.randrange(0x80)))
        elif kind < 0.8:
            pieces.append(chr(rng.randrange(0x80, 0x800)))
        else:
            pieces.append(chr(rng.randrange(0x800, 0x110000)))
    return "".join(pieces)


def _random_float(rng: random.Random) -> float:
    kind = rng.random()
    if kind < 0.3:
        return float(np.frombuffer(rng.randbytes(8), np.float64)[0])  # any bit pattern...
    if kind < 0.5:
        return rng.choice([0.0, -0.0, 1e-05, 1e16, 1e22, 5e-324, 1.7976931348623157e308])
    if kind < 0.6:
        return rng.choice([math.inf, -math.inf])
    return round(rng.uniform(-1e3, 1e3), rng.randrange(8))


def _random_scalar(rng: random.Random):
    kind = rng.randrange(7)
    if kind == 0:
        return rng.choice([0, -1, 7, 10**30, -(10**99), rng.randrange(-(10**6), 10**6)])
    if kind == 1:
        value = _random_float(rng)
        return value if not math.isnan(value) else 0.5  # nan has no literal
    if kind == 2:
        return _random_str(rng)
    if kind == 3:
        return rng.randbytes(rng.randrange(5))
    if kind == 4:
        return rng.choice([True, False])
    if kind == 5:
        return None
    return rng.choice(_AWKWARD)


def _random_hashable(rng: random.Random, depth: int):
    if depth == 0 or rng.random() < 0.7:
        return _random_scalar(rng)
    return tuple(_random_hashable(rng, depth - 1) for _ in range(rng.randrange(3)))


def _random_value(rng: random.Random, depth: int):
    if depth == 0 or rng.random() < 0.4:
        return _random_scalar(rng)
    kind, n = rng.randrange(4), rng.randrange(4)
    if kind == 0:
        return [_random_value(rng, depth - 1) for _ in range(n)]
    if kind == 1:
        return tuple(_random_value(rng, depth - 1) for _ in range(n))
    if kind == 2:
        return {_random_hashable(rng, depth - 1) for _ in range(n)}
    return {_random_hashable(rng, depth - 1): _random_value(rng, depth - 1) for _ in range(n)}


def _corpus(n: int, seed: int = 0) -> list[tuple]:
    rng = random.Random(seed)
    return [tuple(_random_value(rng, 2) for _ in range(rng.randrange(4))) for _ in range(n)]


def test_the_repr_of_every_value_is_accepted_and_reads_back_as_the_value():
    for args in _corpus(600):
        arity = len(args)
        texts = {_write(args)}
        if _write(args) == repr(args):  # no inf: as `repr`, the display and the prompt write it
            texts |= {repr(args), values.display(args), input_example._literal(args)}
        for text in texts:
            reply = _reply(text)
            assert _dfa(arity).accepts(reply.encode()), reply
            assert _same(_read(reply, arity), args), reply


@pytest.mark.parametrize("wrapper", ["input_line", "call"])
def test_every_value_is_writable_in_the_other_wrappers(wrapper):
    """'call': `repr`; 'input_line': escapes for the non-ASCII, backticks and `<` it keeps out."""
    for args in _corpus(200, seed=1):
        arity = len(args)
        if wrapper == "call":
            if arity == 1 and isinstance(args[0], tuple):
                continue  # `test_func((x,))` is the call `test_func(x)`: no reply means (x,)
            text = _write(args) if arity != 1 else f"({_write(args[0])})"
        else:  # in a literal, a backtick or `<` is inside a string: its escape means the same
            text = _write(args, ascii).replace("`", "\\x60").replace("<", "\\x3c")
        reply = _reply(text, wrapper)
        assert _dfa(arity, wrapper).accepts(reply.encode()), reply
        assert _same(_read(reply, arity, wrapper), args), reply


def _shapes(args: tuple) -> tuple:
    return tuple(input_example.argument_shapes(len(args), [args]))


def test_typed_grammars_accept_the_values_of_their_shapes():
    for args in _corpus(40, seed=2):
        reply = _reply(_write(args))
        assert _dfa(len(args), shapes=_shapes(args)).accepts(reply.encode()), reply


# --- soundness: random replies the DFA accepts --------------------------------------------


def _distances(dfa: byte_dfa.ByteDFA) -> np.ndarray:
    """[S] fewest bytes from each state to an accepting one (large: none)."""
    big = 10**9
    dist = np.where(dfa.accepting, 0, big)
    while True:
        via = np.where(dfa.delta >= 0, dist[np.maximum(dfa.delta, 0)] + 1, big).min(axis=1)
        new = np.minimum(dist, via)
        if np.array_equal(new, dist):
            return dist
        dist = new


def _random_replies(dfa: byte_dfa.ByteDFA, n: int, seed: int) -> list[bytes]:
    """Walks choosing a byte class uniformly for a random length, then the shortest way out."""
    rng = np.random.default_rng(seed)
    dist = _distances(dfa)
    members = [np.flatnonzero(dfa.byte_class == k) for k in range(dfa.delta.shape[1])]
    out = []
    for _ in range(n):
        state, data, budget = 0, bytearray(), int(rng.integers(0, 120))
        while True:
            nxt = dfa.delta[state]
            ok = np.flatnonzero((nxt >= 0) & (dist[np.maximum(nxt, 0)] < 10**9))
            if dfa.accepting[state] and (len(data) >= budget or rng.random() < 0.1 or not len(ok)):
                break
            if len(data) >= budget:  # head for the end
                ok = ok[dist[nxt[ok]] == dist[nxt[ok]].min()]
            k = int(rng.choice(ok))
            data.append(int(rng.choice(members[k])))
            state = int(nxt[k])
        out.append(bytes(data))
    return out


_WRAPPED = {
    "fence": ("```\n", "\n```"),
    "input_line": ("Input: ", ""),
    "call": ("```python\ntest_func", "\n```"),
}


def _check_sound(dfa, arity: int, wrapper: str, n: int, seed: int) -> None:
    replies = _random_replies(dfa, n, seed)
    assert arity == 0 or len(set(replies)) > n * 3 // 4  # the walks explore
    prefix, suffix = _WRAPPED[wrapper]
    for data in replies:
        assert dfa.accepts(data)
        reply = data.decode("utf-8")  # the DFA spells UTF-8 (surrogates only as escapes)
        args = _read(reply, arity, wrapper)
        args_text = reply[len(prefix) : len(reply) - len(suffix)]
        if wrapper == "call":  # the call's arguments
            call = ast.parse("f" + args_text, mode="eval").body
            spelled = tuple(ast.literal_eval(a) for a in call.args)
        else:
            spelled = ast.literal_eval(args_text)
        assert _same(args, spelled), reply
        assert _same(parse_call_args(_write(args), arity), args), reply  # and round-trips


@pytest.mark.parametrize(
    "arity,wrapper",
    [(0, "fence"), (1, "fence"), (2, "fence"), (3, "fence"), (2, "input_line"), (1, "call")],
)
def test_random_accepted_replies_read_as_the_literal_they_spell(arity, wrapper):
    _check_sound(_dfa(arity, wrapper), arity, wrapper, n=300, seed=arity)


def test_random_typed_replies_read_as_the_literal_they_spell():
    # Shapes with unknown parts, also inside set items and dict keys (which must stay hashable).
    for args in [({(): 1}, [{()}]), ([], {1: [()]}), (set(), (1.5, "a")), ([[1], 2.0],)]:
        shapes = _shapes(args)
        _check_sound(_dfa(len(args), shapes=shapes), len(args), "fence", n=60, seed=len(shapes))


RATINGS_VALID = [
    ("Rating: 5", 5),
    ("The hypothesis states the same behaviour.\nRating: 4", 4),
    ("Explanation: wrong property.\n\nrating=2", 2),
    ("RATING : **3", 3),
    ("It is close (a detail differs).\nRating:1", 1),
    ("Rating: 2 at first, but on reflection:\nRating: 3", 3),
    ("é — Rating:\t5", 5),
]
RATINGS_INVALID = [
    "",
    "Rating: 6",
    "Rating: 0",
    "Rating: 5 because it matches",
    "Rating: 45",
    "rating 4",
    "xRating: 3",
    "Rating: five",
    "The rating is 2.",
]


@pytest.mark.parametrize("reply,score", RATINGS_VALID)
def test_hand_written_ratings_are_accepted_and_read_as_written(reply, score):
    from pau_jax.evaluation import judge

    assert _rating_dfa().accepts(reply.encode()), reply
    assert judge.parse_rating(reply) == score


@pytest.mark.parametrize("reply", RATINGS_INVALID)
def test_replies_without_a_final_rating_are_refused(reply):
    assert not _rating_dfa().accepts(reply.encode()), reply


@functools.cache
def _rating_dfa() -> byte_dfa.ByteDFA:
    return byte_dfa.compile_dfa(input_grammar.rating_grammar())


CODE_VALID = [
    "```python\ndef test_func(a):\n    return a + 1\n```",
    "```py\ndef test_func(a): return a\n```",
    "  ```Python \ndef test_func(s):\n    return s.replace('`', '')  # one `tick`\n```",
    "```\ndef test_func():\n    return '``x'\n```",
    "```python\ndef test_func(x):\n    return '<think>' + x\n```",
]
CODE_INVALID = [
    "",
    "def test_func(a):\n    return a",  # no block
    "```python\ndef test_func(a):\n    return a",  # not closed
    "Here:\n```python\ndef test_func(a): return a\n```",  # prose first
    "```python\ndef test_func(a): return a\n```\nDone.",  # prose after
    "```python def test_func(a): return a```",  # no newline after the fence
    "```python\nx = '```'\n```",  # a fence inside the body
    "```python\nx = 1`\n````",
]


@pytest.mark.parametrize("reply", CODE_VALID)
def test_hand_written_code_blocks_are_accepted_and_read_as_written(reply):
    from pau_jax.evaluation import code_match

    assert _code_dfa().accepts(reply.encode()), reply
    body = reply.split("\n", 1)[1].rsplit("```", 1)[0]
    assert code_match.extract_code(reply) == body.strip() + "\n"


@pytest.mark.parametrize("reply", CODE_INVALID)
def test_replies_that_are_not_one_closed_block_are_refused(reply):
    assert not _code_dfa().accepts(reply.encode()), reply


@functools.cache
def _code_dfa() -> byte_dfa.ByteDFA:
    return byte_dfa.compile_dfa(input_grammar.code_grammar())
