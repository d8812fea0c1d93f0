"""The grammar of the input-phase reply (a literal argument tuple of one arity) as a minimal byte DFA.

`grammar(arity, wrapper, depth)` is a regular expression over bytes, written as a
small tree (`set`, `seq`, `alt`, `star`): Python literals (int, float, str, bytes,
bool, None, and list/tuple/dict/set nested `depth` deep; set items and dict keys
are scalars), exactly `arity` of them in a tuple (`(x,)` for one), inside the
wrapper the generation prompt asks for. `compile_dfa` turns it into a `ByteDFA`
(Thompson construction, subset construction over byte classes, Moore
minimisation); `constraint.py` walks the tokenizer's vocabulary over it.

String and bytes literals exclude what would make the parsers in `env/parse.py`
misread the reply: control characters, backticks (a fence), `<` before anything
but a space, `=` or a digit (`<think>`), and `(` after a letter, digit or space
(a call `f(...)`); escapes are `\\\\ \\' \\" \\n \\r \\t \\0`. Integers have no leading
zeros; floats are `1.5`, `-0.25e-3` (digits on both sides of the point).
"""

import dataclasses
import functools
import string

import numpy as np

WRAPPERS = ("fence", "input_line", "call")


def _bits(chars: bytes | range) -> int:
    out = 0
    for c in chars:
        out |= 1 << c
    return out


def _set(chars) -> tuple:
    return ("set", chars if isinstance(chars, int) else _bits(chars))


def _lit(text: bytes) -> tuple:
    return ("seq", [_set(bytes([c])) for c in text])


def _seq(*parts) -> tuple:
    return ("seq", list(parts))


def _alt(*parts) -> tuple:
    return ("alt", list(parts))


def _star(part) -> tuple:
    return ("star", part)


def _opt(part) -> tuple:
    return ("alt", [part, ("seq", [])])


_DIGIT = _set(b"0123456789")
_CONT = _set(range(0x80, 0xC0))
_UTF8 = _alt(  # one multi-byte UTF-8 character (no surrogates, no overlongs)
    _seq(_set(range(0xC2, 0xE0)), _CONT),
    _seq(_set(b"\xe0"), _set(range(0xA0, 0xC0)), _CONT),
    _seq(_set(bytes([*range(0xE1, 0xED), 0xEE, 0xEF])), _CONT, _CONT),
    _seq(_set(b"\xed"), _set(range(0x80, 0xA0)), _CONT),
    _seq(_set(b"\xf0"), _set(range(0x90, 0xC0)), _CONT, _CONT),
    _seq(_set(range(0xF1, 0xF4)), _CONT, _CONT, _CONT),
    _seq(_set(b"\xf4"), _set(range(0x80, 0x90)), _CONT, _CONT),
)
_SEP = _seq(_lit(b","), _opt(_lit(b" ")))
_COLON = _seq(_lit(b":"), _opt(_lit(b" ")))


def _quoted(quote: bytes, unicode: bool) -> tuple:
    """A string (or bytes) body between `quote`s, free of what the reply parsers misread."""
    special = quote + b"\\`<("
    punct = bytes(c for c in string.punctuation.encode() if c not in special)
    plain = bytes(c for c in range(0x20, 0x7F) if c not in special and c not in punct) + b"\t"
    parens = _star(_lit(b"("))
    piece = _alt(
        _set(plain),
        _seq(_set(punct), parens),
        _seq(_lit(b"\\"), _set(b"\\'\"nrt0")),
        _seq(_lit(b"<"), _set(b" =0123456789")),
        *([_UTF8] if unicode else []),
    )
    return _seq(_lit(quote), parens, _star(piece), _lit(quote))


_NATURAL = _alt(_lit(b"0"), _seq(_set(b"123456789"), _star(_DIGIT)))
_INT = _seq(_opt(_lit(b"-")), _NATURAL)
_FLOAT = _seq(
    _opt(_lit(b"-")),
    _NATURAL,
    _lit(b"."),
    _DIGIT,
    _star(_DIGIT),
    _opt(_seq(_set(b"eE"), _opt(_set(b"+-")), _DIGIT, _star(_DIGIT))),
)
_STR = _alt(_quoted(b"'", True), _quoted(b'"', True))
_BYTES = _alt(_seq(_lit(b"b"), _quoted(b"'", False)), _seq(_lit(b"b"), _quoted(b'"', False)))
_BOOL = _alt(_lit(b"True"), _lit(b"False"))
_SCALAR = _alt(_INT, _FLOAT, _STR, _BYTES, _BOOL, _lit(b"None"))


def _items(item) -> tuple:
    return _seq(item, _star(_seq(_SEP, item)))


def _list_of(item) -> tuple:
    return _seq(_lit(b"["), _opt(_items(item)), _lit(b"]"))


def _tuple_of(item, one_tuple: bool = True) -> tuple:
    """A tuple literal of `item`s: `()`, `(x,)` or `(x, y, ...)` (without `(x,)`: `one_tuple=False`)."""
    if one_tuple:
        body = _seq(item, _lit(b","), _opt(_seq(_lit(b" "), _items(item))))
    else:
        body = _seq(item, _SEP, _items(item))
    return _seq(_lit(b"("), _opt(body), _lit(b")"))


def _set_of(item) -> tuple:
    return _seq(_lit(b"{"), _items(item), _lit(b"}"))  # non-empty: `{}` is a dict


def _dict_of(key, value) -> tuple:
    return _seq(_lit(b"{"), _opt(_items(_seq(key, _COLON, value))), _lit(b"}"))


@functools.cache
def _value(depth: int, one_tuple: bool = True) -> tuple:
    """A literal whose containers nest at most `depth` deep (set items, dict keys: scalars).

    With `one_tuple=False` the outermost value is never a 1-tuple `(x,)`.
    """
    if depth == 0:
        return _SCALAR
    inner = _value(depth - 1)
    return _alt(
        _SCALAR,
        _list_of(inner),
        _tuple_of(inner, one_tuple),
        _set_of(_SCALAR),
        _dict_of(_SCALAR, inner),
    )


def _hashable(shape: tuple) -> tuple:
    """A set item or dict key: the shape itself, or any scalar where the shape is unknown."""
    return _SCALAR if shape[0] == "any" else _shaped(shape)


def _shaped(shape: tuple) -> tuple:
    """The literals of one argument shape (`env.input_example.value_shape`)."""
    kind = shape[0]
    scalars = {
        "bool": _BOOL,
        "int": _INT,
        "float": _alt(_INT, _FLOAT),
        "str": _STR,
        "bytes": _BYTES,
        "none": _lit(b"None"),
    }
    if kind in scalars:
        return scalars[kind]
    if kind == "list":
        return _list_of(_shaped(shape[1]))
    if kind == "tuple":
        return _tuple_of(_shaped(shape[1]))
    if kind == "set":
        return _set_of(_hashable(shape[1]))
    if kind == "dict":
        return _dict_of(_hashable(shape[1]), _shaped(shape[2]))
    if kind == "alt":
        return _alt(*(_shaped(s) for s in shape[1]))
    if kind == "any":
        return _value(1)
    raise ValueError(f"unknown argument shape {shape!r}")


def grammar(arity: int, wrapper: str = "fence", depth: int = 2, shapes: tuple = ()) -> tuple:
    """The reply's grammar: `arity` literals as a tuple (`(x,)` for one) inside `wrapper`.

    'fence' (what `env.prompts.generate_messages` asks for): "```\\n(1, 'a')\\n```";
    'input_line': "Input: (1, 'a')"; 'call': "```python\\ntest_func(1, 'a')\\n```"
    (read only by the lenient parser; at arity 1 its argument is never a 1-tuple, which
    the parser would read as the arguments themselves).

    With `shapes` (one per argument, `env.input_example.value_shape` descriptors, as
    `argument_shapes` derives from the shown examples), each argument is a literal of its
    shape instead of any literal ('fence' and 'input_line' only).
    """
    if wrapper not in WRAPPERS:
        raise ValueError(f"wrapper must be one of {WRAPPERS}, got {wrapper!r}")
    if arity < 0 or depth < 0:
        raise ValueError(f"arity and depth must be >= 0, got {arity} and {depth}")
    # `test_func((x,))` is read as the call `test_func(x)` (`sandbox.args.parse_call_args`).
    if shapes and (len(shapes) != arity or wrapper == "call"):
        raise ValueError(f"shapes need one per argument ({arity}) and a 'fence' or 'input_line'")
    args = [_value(depth, one_tuple=arity != 1 or wrapper != "call")] * arity
    if shapes:
        args = [_shaped(shape) for shape in shapes]
    inner = [args[0]] + [_seq(_SEP, a) for a in args[1:]] if args else []
    trailing = [_lit(b",")] if arity == 1 and wrapper != "call" else []
    call = _seq(_lit(b"("), *inner, *trailing, _lit(b")"))
    if wrapper == "fence":
        return _seq(_lit(b"```\n"), call, _lit(b"\n```"))
    if wrapper == "input_line":
        return _seq(_lit(b"Input: "), call)
    return _seq(_lit(b"```python\ntest_func"), call, _lit(b"\n```"))


def _nocase(word: bytes) -> tuple:
    return _seq(*(_set(bytes({c, ord(chr(c).upper()), ord(chr(c).lower())})) for c in word))


# What `env.parse`'s revision label treats as a word character; bytes from 0x80 count as
# one too (a Unicode letter would), so the detector never fires where the parser reads no label.
_WORD = bytes(b"_" + string.ascii_letters.encode() + string.digits.encode()) + bytes(
    range(0x80, 0x100)
)
_NONWORD = _set(bytes(c for c in range(256) if c not in _WORD))
_SPACE = _star(_set(b" \t\n\r\f\v"))


def decision_grammar() -> tuple:
    """Any reply up to and including its first complete revision label, then one more byte.

    `env.parse.parse_revision` reads `decision|label|action`, `:` or `=`, optional `*`,
    then `continue|stop` (any case) between word boundaries. This grammar is any bytes,
    then such a label at a word start, then the non-word byte that closes it: the shortest
    reply whose label the parser reads. Used as a detector (`constraint.DECISION`): the
    reply ends there, and nothing is masked before.
    """
    label = _alt(_nocase(b"decision"), _nocase(b"label"), _nocase(b"action"))
    word_start = _opt(_seq(_star(_set(range(256))), _NONWORD))
    return _seq(
        word_start,
        label,
        _SPACE,
        _set(b":="),
        _SPACE,
        _star(_lit(b"*")),
        _SPACE,
        _alt(_nocase(b"continue"), _nocase(b"stop")),
        _NONWORD,
    )


def stop_grammar(strings) -> tuple:
    """Any reply up to and including the first occurrence of one of `strings` (UTF-8)."""
    return _seq(_star(_set(range(256))), _alt(*(_lit(s.encode()) for s in strings)))


def either(*grammars) -> tuple:
    """A reply any of `grammars` matches (the one grammar itself when alone)."""
    return grammars[0] if len(grammars) == 1 else _alt(*grammars)


# --- grammar -> minimal byte DFA -------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class ByteDFA:
    """A DFA over bytes: `delta[state, byte_class[byte]]` (-1: reject); start is state 0."""

    byte_class: np.ndarray  # [256] int32
    delta: np.ndarray  # [S, K] int32
    accepting: np.ndarray  # [S] bool

    def walk(self, state: int, data: bytes) -> int:
        """The state after `data` from `state`, or -1."""
        for b in data:
            if state < 0:
                return -1
            state = int(self.delta[state, self.byte_class[b]])
        return state


def _compile(expr, edges: list, eps: list) -> tuple[int, int]:
    """Thompson construction of `expr` into `edges`/`eps`; returns (start, end)."""

    def new() -> int:
        edges.append([])
        eps.append([])
        return len(edges) - 1

    kind, body = expr
    start, end = new(), new()
    if kind == "set":
        edges[start].append((body, end))
    elif kind == "seq":
        at = start
        for part in body:
            s, e = _compile(part, edges, eps)
            eps[at].append(s)
            at = e
        eps[at].append(end)
    elif kind == "alt":
        for part in body:
            s, e = _compile(part, edges, eps)
            eps[start].append(s)
            eps[e].append(end)
    else:  # star
        s, e = _compile(body, edges, eps)
        eps[start] += [s, end]
        eps[e] += [s, end]
    return start, end


def compile_dfa(expr) -> ByteDFA:
    """Subset construction over byte classes, then Moore minimisation."""
    edges: list = []
    eps: list = []
    start, accept = _compile(expr, edges, eps)
    masks = sorted({m for row in edges for m, _ in row})
    signatures = {}
    byte_class = np.zeros(256, np.int32)
    for b in range(256):
        key = tuple((m >> b) & 1 for m in masks)
        byte_class[b] = signatures.setdefault(key, len(signatures))
    reps = [int(np.flatnonzero(byte_class == k)[0]) for k in range(len(signatures))]

    def closure(states) -> frozenset:
        seen, todo = set(states), list(states)
        while todo:
            for t in eps[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(seen)

    first = closure([start])
    ids, order, rows = {first: 0}, [first], []
    while len(rows) < len(order):
        current = order[len(rows)]
        row = []
        for b in reps:
            targets = [t for s in current for m, t in edges[s] if (m >> b) & 1]
            if not targets:
                row.append(-1)
                continue
            nxt = closure(targets)
            if nxt not in ids:
                ids[nxt] = len(order)
                order.append(nxt)
            row.append(ids[nxt])
        rows.append(row)
    delta = np.array(rows, np.int32)
    accepting = np.array([accept in s for s in order])
    # Moore: refine by (accepting, classes of successors) until stable; -1 stays its own class.
    labels = accepting.astype(np.int64)
    while True:
        succ = np.where(delta >= 0, labels[np.maximum(delta, 0)], -1)
        _, new = np.unique(np.column_stack([labels, succ]), axis=0, return_inverse=True)
        new = new.reshape(-1)
        if len(np.unique(new)) == len(np.unique(labels)):
            break
        labels = new
    # Renumber so the start state is 0.
    order_ = np.unique(labels, return_index=True)[1]
    classes = labels[np.sort(order_)]
    relabel = np.empty(labels.max() + 1, np.int32)
    relabel[classes] = np.arange(len(classes))
    labels = relabel[labels]  # numbered by first appearance: the start state is 0
    n = labels.max() + 1
    small = np.full((n, delta.shape[1]), -1, np.int32)
    small[labels] = np.where(delta >= 0, labels[np.maximum(delta, 0)], -1)
    acc = np.zeros(n, bool)
    acc[labels] = accepting
    return ByteDFA(byte_class=byte_class, delta=small, accepting=acc)
