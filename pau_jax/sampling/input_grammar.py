"""The grammar of the input-phase reply (a literal argument tuple of one arity) as a minimal byte DFA.

`grammar(arity, wrapper, depth)` is a regular expression over bytes, written as a
small tree (`set`, `seq`, `alt`, `star`): Python literals (int, float, str, bytes,
bool, None, and list/tuple/dict/set nested `depth` deep; set items and dict keys
are hashable: scalars and tuples of them), exactly `arity` of them in a tuple
(`(x,)` for one), inside the wrapper the generation prompt asks for. `compile_dfa`
turns it into a `ByteDFA` (an NFA, subset construction over byte classes, Moore
minimisation); `constraint.py` walks the tokenizer's vocabulary over it.

Complete: whatever `repr` writes for these types is accepted (so is the generation
prompt's example), and the forms Python also reads: any spacing (spaces and tabs)
between tokens on the line, trailing commas, `+`/`-` signs, floats such as `1e-05`,
`1.`, `.5` (`1e999` is how inf is written; nan has no literal), string escapes
`\\\\ \\' \\" \\a \\b \\f \\n \\r \\t \\v`, `\\xhh`, octal `\\ooo` up to `\\377`, `\\uhhhh` and
`\\Uhhhhhhhh` (str), `u`/`b` prefixes and `set()`. Left out, since `repr` never writes
them: raw and triple-quoted strings, `\\N{...}`, hex/octal/binary ints and digit
underscores, implicit string concatenation, line breaks.

Sound: every accepted reply is read by `env/parse.py` (strict and lenient) and
`sandbox.args.parse_call_args` as the literal it spells. Strings hold any character
(a raw one, or an escape): the parsers read a fenced block as Python, skipping its
string literals (`parse.strip_think`, `parse.input_candidates`). Only the unfenced
'input_line' wrapper keeps backticks and `<` out of its raw string characters
(escapes such as `\\x60` still write them). An accepted escape is one Python takes
without a warning: an octal escape never reads a third digit past `\\377`.

The grammar bounds nesting, not length: a reply's characters (the parser's
`MAX_CHARS`) and an int's digits (Python's 4,300) are bounded by the token mask
instead (`constraint.Component.max_piece_bytes`).
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


def _plus(part) -> tuple:
    return _seq(part, _star(part))


_DIGIT = _set(b"0123456789")
_HEX = _set(b"0123456789abcdefABCDEF")
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
# Spacing Python allows between the tokens of a literal on one line. A star costs no
# state where the same state loops on it.
_BLANK = _star(_set(b" \t"))


def _token(text: bytes) -> tuple:
    """Punctuation followed by any spacing."""
    return _seq(_lit(text), _BLANK)


def _hex(n: int) -> tuple:
    return _seq(*[_HEX] * n)


# Escapes Python reads without a warning. `\U` stops at U+10FFFF.
_SIMPLE_ESCAPE = _set(b"\\'\"abfnrtv")
_UNICODE_ESCAPES = _alt(
    _seq(_lit(b"u"), _hex(4)),
    _seq(_lit(b"U00"), _alt(_seq(_lit(b"0"), _hex(5)), _seq(_lit(b"10"), _hex(4)))),
)


def _quoted(quote: bytes, unicode: bool, excluded: bytes) -> tuple:
    """A string (or bytes) literal between `quote`s, its body any characters but `excluded`.

    A character is written as itself (printable ASCII and tab, and for str any other
    UTF-8 character) or as an escape. Octal escapes: `\\[0-3]oo` (to `\\377`), or one or
    two digits; after `\\[4-7]` or `\\[4-7]o` no octal digit follows (Python would read
    it into the escape, past `\\377`).
    """
    plain = bytes(
        c for c in [9, *range(0x20, 0x7F)] if c not in quote + b"\\" and c not in excluded
    )
    octal = b"01234567"
    escape = _alt(
        _SIMPLE_ESCAPE,
        _seq(_lit(b"x"), _hex(2)),
        *([_UNICODE_ESCAPES] if unicode else []),
    )
    low = _seq(_set(b"0123"), _opt(_set(octal)), _opt(_set(octal)))  # \0 .. \377
    high = _seq(_set(b"4567"), _opt(_set(octal)))  # \4 .. \77, ends the digits
    # A piece that does not start with an octal digit, and one that may.
    other = _alt(
        _set(bytes(c for c in plain if c not in octal)),
        _seq(_lit(b"\\"), _alt(escape, low)),
        *([_UTF8] if unicode else []),
    )
    piece = _alt(other, _set(bytes(c for c in plain if c in octal)))
    highs = _plus(_seq(_lit(b"\\"), high))
    body = _seq(_star(_alt(piece, _seq(highs, other))), _opt(highs))
    return _seq(_lit(quote), body, _lit(quote))


@functools.cache
def _str(excluded: bytes) -> tuple:
    prefix = _opt(_set(b"uU"))
    return _seq(prefix, _alt(_quoted(b"'", True, excluded), _quoted(b'"', True, excluded)))


@functools.cache
def _bytes(excluded: bytes) -> tuple:
    prefix = _set(b"bB")
    return _seq(prefix, _alt(_quoted(b"'", False, excluded), _quoted(b'"', False, excluded)))


_SIGN = _opt(_seq(_set(b"+-"), _BLANK))
_DIGITS = _plus(_DIGIT)
_EXPONENT = _seq(_set(b"eE"), _opt(_set(b"+-")), _DIGITS)
# Ints: no leading zero but in `0`, `00`...; floats (leading zeros allowed): `1.5`, `1.`,
# `.5`, `1e-05`, `01.5e3`.
_INT = _seq(_SIGN, _alt(_plus(_lit(b"0")), _seq(_set(b"123456789"), _star(_DIGIT))))
_FLOAT = _seq(
    _SIGN,
    _alt(
        _seq(_DIGITS, _lit(b"."), _star(_DIGIT), _opt(_EXPONENT)),
        _seq(_lit(b"."), _DIGITS, _opt(_EXPONENT)),
        _seq(_DIGITS, _EXPONENT),
    ),
)
_BOOL = _alt(_lit(b"True"), _lit(b"False"))
_NONE = _lit(b"None")


@functools.cache
def _scalar(excluded: bytes) -> tuple:
    return _alt(_INT, _FLOAT, _str(excluded), _bytes(excluded), _BOOL, _NONE)


def _items(item) -> tuple:
    """One or more `item`s (each followed by spacing), comma-separated, a trailing comma allowed."""
    return _seq(item, _star(_seq(_token(b","), item)), _opt(_token(b",")))


def _spaced(part) -> tuple:
    return _seq(part, _BLANK)


def _list_of(item) -> tuple:
    return _seq(_token(b"["), _opt(_items(_spaced(item))), _lit(b"]"))


def _tuple_of(item, one_tuple: bool = True) -> tuple:
    """A tuple literal of `item`s: `()`, `(x,)` or `(x, y, ...)` (without `(x,)`: `one_tuple=False`)."""
    item = _spaced(item)
    more = _seq(_token(b","), _items(item))  # a second item, and maybe more
    body = _seq(item, _token(b","), _opt(_items(item))) if one_tuple else _seq(item, more)
    return _seq(_token(b"("), _opt(body), _lit(b")"))


def _set_of(item) -> tuple:
    """`{x, ...}` (`{}` is a dict) or `set()`."""
    return _alt(_seq(_token(b"{"), _items(_spaced(item)), _lit(b"}")), _lit(b"set()"))


def _dict_of(key, value) -> tuple:
    entry = _seq(_spaced(key), _token(b":"), _spaced(value))
    return _seq(_token(b"{"), _opt(_items(entry)), _lit(b"}"))


@functools.cache
def _hashable(depth: int, excluded: bytes) -> tuple:
    """A set item or dict key: a scalar, or a tuple of them nested at most `depth` deep."""
    if depth == 0:
        return _scalar(excluded)
    return _alt(_scalar(excluded), _tuple_of(_hashable(depth - 1, excluded)))


@functools.cache
def _value(depth: int, excluded: bytes, one_tuple: bool = True) -> tuple:
    """A literal whose containers nest at most `depth` deep.

    With `one_tuple=False` the outermost value is never a 1-tuple `(x,)`.
    """
    if depth == 0:
        return _scalar(excluded)
    inner = _value(depth - 1, excluded)
    return _alt(
        _scalar(excluded),
        _list_of(inner),
        _tuple_of(inner, one_tuple),
        _set_of(_hashable(depth - 1, excluded)),
        _dict_of(_hashable(depth - 1, excluded), inner),
    )


def _shaped(shape: tuple, excluded: bytes) -> tuple:
    """The literals of one argument shape (`env.input_example.value_shape`)."""
    kind = shape[0]
    scalars = {
        "bool": _BOOL,
        "int": _INT,
        "float": _alt(_INT, _FLOAT),
        "str": _str(excluded),
        "bytes": _bytes(excluded),
        "none": _NONE,
    }
    if kind in scalars:
        return scalars[kind]
    if kind == "list":
        return _list_of(_shaped(shape[1], excluded))
    if kind == "tuple":
        return _tuple_of(_shaped(shape[1], excluded))
    if kind == "set":
        return _set_of(_shaped_hashable(shape[1], excluded))
    if kind == "dict":
        return _dict_of(_shaped_hashable(shape[1], excluded), _shaped(shape[2], excluded))
    if kind == "alt":
        return _alt(*(_shaped(s, excluded) for s in shape[1]))
    if kind == "any":
        return _value(1, excluded)
    raise ValueError(f"unknown argument shape {shape!r}")


def _shaped_hashable(shape: tuple, excluded: bytes) -> tuple:
    """A set item or dict key of `shape`; where the shape is unknown, any hashable literal.

    Unknown parts inside a tuple stay hashable too (`{(): 1}` gives `("tuple", ("any",))`).
    """
    kind = shape[0]
    if kind == "any":
        return _hashable(1, excluded)
    if kind == "tuple":
        return _tuple_of(_shaped_hashable(shape[1], excluded))
    if kind == "alt":
        return _alt(*(_shaped_hashable(s, excluded) for s in shape[1]))
    if kind in ("list", "set", "dict"):
        raise ValueError(f"a set item or dict key cannot have the shape {shape!r}")
    return _shaped(shape, excluded)


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
    # Outside a fence a backtick would open one, and `<` a think block, for the parsers.
    excluded = b"`<" if wrapper == "input_line" else b""
    if shapes:
        args = [_spaced(_shaped(shape, excluded)) for shape in shapes]
    else:
        one_tuple = arity != 1 or wrapper != "call"
        args = [_spaced(_value(depth, excluded, one_tuple))] * arity
    if not args:
        call = _seq(_token(b"("), _lit(b")"))
    elif arity == 1 and wrapper != "call":
        call = _seq(_token(b"("), args[0], _token(b","), _lit(b")"))
    else:  # `test_func(x)` and `(x, y)`: a trailing comma allowed
        rest = [_seq(_token(b","), a) for a in args[1:]]
        call = _seq(_token(b"("), args[0], *rest, _opt(_token(b",")), _lit(b")"))
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


def rating_grammar(low: int = 1, high: int = 5) -> tuple:
    """Any reply that ends with a rating line's digit: `Rating: X`, X in `low..high`.

    `evaluation.judge.parse_rating` reads the last `rating`, `:` or `=`, optional `*`, then
    a digit in 1..5 at a word end (any case). This grammar is any bytes, then `rating` at
    a word start, `:` or `=`, optional `*`s and spaces, a digit, and the end of the reply:
    free reasoning first, and whatever the mask allows parses. Masked (not a detector), so
    with a token budget the rating is written before the budget ends
    (`constraint.mask_logits`'s ``remaining``).
    """
    if not 0 <= low <= high <= 9:
        raise ValueError(f"a rating is one digit: need 0 <= low <= high <= 9, got {low}..{high}")
    word_start = _opt(_seq(_star(_set(range(256))), _NONWORD))
    return _seq(
        word_start,
        _nocase(b"rating"),
        _SPACE,
        _set(b":="),
        _SPACE,
        _star(_lit(b"*")),
        _SPACE,
        _set(bytes(range(ord("0") + low, ord("0") + high + 1))),
    )


def code_grammar() -> tuple:
    """A reply that is one fenced Python block, closed: `evaluation.code_match`'s reading.

    The coder is asked for "the complete function in one ```python code block, nothing
    else". This grammar is optional leading spaces, the opening fence (```, optionally
    `python` or `py` in any case, spaces or tabs), a newline, a body in which ``` never
    occurs (a backtick is followed by anything but a backtick, and the body does not end
    with one), then the closing ``` that ends the reply. `code_match.extract_code` then
    reads the body as written. Masked, so with a token budget the block is closed before
    the budget ends.
    """
    not_tick = _set(bytes(b for b in range(256) if b != ord("`")))
    body = _star(_alt(not_tick, _seq(_lit(b"`"), not_tick), _seq(_lit(b"``"), not_tick)))
    return _seq(
        _SPACE,
        _lit(b"```"),
        _opt(_alt(_nocase(b"python"), _nocase(b"py"))),
        _star(_set(b" \t")),
        _lit(b"\n"),
        body,
        _lit(b"```"),
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

    def accepts(self, data: bytes) -> bool:
        """Whether the grammar matches all of `data`."""
        end = self.walk(0, data)
        return end >= 0 and bool(self.accepting[end])


def _compile(expr, start: int, edges: list, eps: list) -> int:
    """Adds `expr` to the NFA from state `start`; returns its end state.

    `edges[s]` holds (byte mask, target) pairs, `eps[s]` the epsilon targets. A sequence
    chains its parts and the parts of an alternative share its start, so only a byte set,
    the end of an alternative and a star add states; a star gets a fresh state between
    its iterations, from which nothing else leaves.
    """

    def new() -> int:
        edges.append([])
        eps.append([])
        return len(edges) - 1

    kind, body = expr
    if kind == "set":
        end = new()
        edges[start].append((body, end))
        return end
    if kind == "seq":
        for part in body:
            start = _compile(part, start, edges, eps)
        return start
    if kind == "alt":
        end = new()
        for part in body:
            eps[_compile(part, start, edges, eps)].append(end)
        return end
    loop = new()  # star
    eps[start].append(loop)
    eps[_compile(body, loop, edges, eps)].append(loop)
    return loop


def _signatures(delta: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """[S, K + 1] each state's class and its successors' classes (-1: reject)."""
    return np.column_stack([labels, np.where(delta >= 0, labels[np.maximum(delta, 0)], -1)])


def _moore(delta: np.ndarray, accepting: np.ndarray) -> np.ndarray:
    """[S] class of each state in the coarsest partition that respects acceptance and steps.

    Moore's refinement, with each state's signature hashed to one 64-bit word (a
    wrapping dot product with random odd weights), so a round is one `np.unique` of
    [S] words instead of a sort of [S, K + 1] rows. The result is checked exactly: the
    states of a class must have the same signature. A hash collision that merged two
    states would fail the check (the check passing proves the partition a congruence,
    so the quotient accepts the same language); the rows are then refined unhashed.
    """
    weights = np.random.default_rng(0).integers(1, 2**63, delta.shape[1] + 1, dtype=np.uint64)
    weights |= np.uint64(1)
    labels = accepting.astype(np.int64)
    count = len(np.unique(labels))
    for _ in range(len(delta)):  # Moore needs at most S rounds
        keys = _signatures(delta, labels).astype(np.uint64) @ weights
        distinct, refined = np.unique(keys, return_inverse=True)
        if len(distinct) == count:
            break
        labels, count = refined.reshape(-1), len(distinct)
    signatures = _signatures(delta, labels)
    first = np.unique(labels, return_index=True)[1]
    if np.array_equal(signatures, signatures[first[labels]]):
        return labels
    labels = accepting.astype(np.int64)
    while True:  # a collision: exact refinement
        _, new = np.unique(_signatures(delta, labels), axis=0, return_inverse=True)
        new = new.reshape(-1)
        if len(np.unique(new)) == len(np.unique(labels)):
            return labels
        labels = new


def compile_dfa(expr) -> ByteDFA:
    """Subset construction over byte classes, then Moore minimisation."""
    edges: list = [[]]
    eps: list = [[]]
    accept = _compile(expr, 0, edges, eps)
    masks = sorted({m for row in edges for m, _ in row})
    signatures = {}
    byte_class = np.zeros(256, np.int32)
    for b in range(256):
        key = tuple((m >> b) & 1 for m in masks)
        byte_class[b] = signatures.setdefault(key, len(signatures))
    reps = [int(np.flatnonzero(byte_class == k)[0]) for k in range(len(signatures))]
    covers = {m: [k for k, b in enumerate(reps) if (m >> b) & 1] for m in masks}
    closures: dict[frozenset, frozenset] = {}

    def closure(states) -> frozenset:
        key = frozenset(states)
        if key not in closures:
            seen, todo = set(key), list(key)
            while todo:
                for t in eps[todo.pop()]:
                    if t not in seen:
                        seen.add(t)
                        todo.append(t)
            closures[key] = frozenset(seen)
        return closures[key]

    first = closure([0])
    ids, order, rows = {first: 0}, [first], []
    while len(rows) < len(order):
        targets: list[list[int]] = [[] for _ in reps]
        for s in order[len(rows)]:
            for m, t in edges[s]:
                for k in covers[m]:
                    targets[k].append(t)
        row = []
        for found in targets:
            if not found:
                row.append(-1)
                continue
            nxt = closure(found)
            if nxt not in ids:
                ids[nxt] = len(order)
                order.append(nxt)
            row.append(ids[nxt])
        rows.append(row)
    delta = np.array(rows, np.int32)
    accepting = np.array([accept in s for s in order])
    labels = _moore(delta, accepting)
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
