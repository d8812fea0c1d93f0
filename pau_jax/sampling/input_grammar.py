"""The grammar of the input-phase reply (a literal argument tuple of one arity), over bytes.

`grammar(arity, wrapper, depth)` is a regular expression over bytes, written as a
small tree (`byte_dfa.py`'s `set`, `seq`, `alt`, `star`): Python literals (int,
float, str, bytes, bool, None, and list/tuple/dict/set nested `depth` deep; set items
and dict keys are hashable: scalars and tuples of them), exactly `arity` of them in a
tuple (`(x,)` for one), inside the wrapper the generation prompt asks for.
`byte_dfa.compile_dfa` turns it into a `ByteDFA` (an NFA, subset construction over
byte classes, Moore minimisation); `constraint.py` walks the tokenizer's vocabulary
over it.

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
string literals (`text_blocks.strip_think`, `parse.input_candidates`). Only the unfenced
'input_line' wrapper keeps backticks and `<` out of its raw string characters
(escapes such as `\\x60` still write them). An accepted escape is one Python takes
without a warning: an octal escape never reads a third digit past `\\377`.

The grammar bounds nesting, not length: a reply's characters (the parser's
`MAX_CHARS`) and an int's digits (Python's 4,300) are bounded by the token mask
instead (`constraint.Component.max_piece_bytes`).
"""

import functools
import string

from pau_jax.sampling.byte_dfa import alt, byte_set, lit, opt, plus, seq, star

WRAPPERS = ("fence", "input_line", "call")


_DIGIT = byte_set(b"0123456789")
_HEX = byte_set(b"0123456789abcdefABCDEF")
_CONT = byte_set(range(0x80, 0xC0))
_UTF8 = alt(  # one multi-byte UTF-8 character (no surrogates, no overlongs)
    seq(byte_set(range(0xC2, 0xE0)), _CONT),
    seq(byte_set(b"\xe0"), byte_set(range(0xA0, 0xC0)), _CONT),
    seq(byte_set(bytes([*range(0xE1, 0xED), 0xEE, 0xEF])), _CONT, _CONT),
    seq(byte_set(b"\xed"), byte_set(range(0x80, 0xA0)), _CONT),
    seq(byte_set(b"\xf0"), byte_set(range(0x90, 0xC0)), _CONT, _CONT),
    seq(byte_set(range(0xF1, 0xF4)), _CONT, _CONT, _CONT),
    seq(byte_set(b"\xf4"), byte_set(range(0x80, 0x90)), _CONT, _CONT),
)
# Spacing Python allows between the tokens of a literal on one line. A star costs no
# state where the same state loops on it.
_BLANK = star(byte_set(b" \t"))


def _token(text: bytes) -> tuple:
    """Punctuation followed by any spacing."""
    return seq(lit(text), _BLANK)


def _hex(n: int) -> tuple:
    return seq(*[_HEX] * n)


# Escapes Python reads without a warning. `\U` stops at U+10FFFF.
_SIMPLE_ESCAPE = byte_set(b"\\'\"abfnrtv")
_UNICODE_ESCAPES = alt(
    seq(lit(b"u"), _hex(4)),
    seq(lit(b"U00"), alt(seq(lit(b"0"), _hex(5)), seq(lit(b"10"), _hex(4)))),
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
    escape = alt(
        _SIMPLE_ESCAPE,
        seq(lit(b"x"), _hex(2)),
        *([_UNICODE_ESCAPES] if unicode else []),
    )
    low = seq(byte_set(b"0123"), opt(byte_set(octal)), opt(byte_set(octal)))  # \0 .. \377
    high = seq(byte_set(b"4567"), opt(byte_set(octal)))  # \4 .. \77, ends the digits
    # A piece that does not start with an octal digit, and one that may.
    other = alt(
        byte_set(bytes(c for c in plain if c not in octal)),
        seq(lit(b"\\"), alt(escape, low)),
        *([_UTF8] if unicode else []),
    )
    piece = alt(other, byte_set(bytes(c for c in plain if c in octal)))
    highs = plus(seq(lit(b"\\"), high))
    body = seq(star(alt(piece, seq(highs, other))), opt(highs))
    return seq(lit(quote), body, lit(quote))


@functools.cache
def _str(excluded: bytes) -> tuple:
    prefix = opt(byte_set(b"uU"))
    return seq(prefix, alt(_quoted(b"'", True, excluded), _quoted(b'"', True, excluded)))


@functools.cache
def _bytes(excluded: bytes) -> tuple:
    prefix = byte_set(b"bB")
    return seq(prefix, alt(_quoted(b"'", False, excluded), _quoted(b'"', False, excluded)))


_SIGN = opt(seq(byte_set(b"+-"), _BLANK))
_DIGITS = plus(_DIGIT)
_EXPONENT = seq(byte_set(b"eE"), opt(byte_set(b"+-")), _DIGITS)
# Ints: no leading zero but in `0`, `00`...; floats (leading zeros allowed): `1.5`, `1.`,
# `.5`, `1e-05`, `01.5e3`.
_INT = seq(_SIGN, alt(plus(lit(b"0")), seq(byte_set(b"123456789"), star(_DIGIT))))
_FLOAT = seq(
    _SIGN,
    alt(
        seq(_DIGITS, lit(b"."), star(_DIGIT), opt(_EXPONENT)),
        seq(lit(b"."), _DIGITS, opt(_EXPONENT)),
        seq(_DIGITS, _EXPONENT),
    ),
)
_BOOL = alt(lit(b"True"), lit(b"False"))
_NONE = lit(b"None")


@functools.cache
def _scalar(excluded: bytes) -> tuple:
    return alt(_INT, _FLOAT, _str(excluded), _bytes(excluded), _BOOL, _NONE)


def _items(item) -> tuple:
    """One or more `item`s (each followed by spacing), comma-separated, a trailing comma allowed."""
    return seq(item, star(seq(_token(b","), item)), opt(_token(b",")))


def _spaced(part) -> tuple:
    return seq(part, _BLANK)


def _list_of(item) -> tuple:
    return seq(_token(b"["), opt(_items(_spaced(item))), lit(b"]"))


def _tuple_of(item, one_tuple: bool = True) -> tuple:
    """A tuple literal of `item`s: `()`, `(x,)` or `(x, y, ...)` (without `(x,)`: `one_tuple=False`)."""
    item = _spaced(item)
    more = seq(_token(b","), _items(item))  # a second item, and maybe more
    body = seq(item, _token(b","), opt(_items(item))) if one_tuple else seq(item, more)
    return seq(_token(b"("), opt(body), lit(b")"))


def _set_of(item) -> tuple:
    """`{x, ...}` (`{}` is a dict) or `set()`."""
    return alt(seq(_token(b"{"), _items(_spaced(item)), lit(b"}")), lit(b"set()"))


def _dict_of(key, value) -> tuple:
    entry = seq(_spaced(key), _token(b":"), _spaced(value))
    return seq(_token(b"{"), opt(_items(entry)), lit(b"}"))


@functools.cache
def _hashable(depth: int, excluded: bytes) -> tuple:
    """A set item or dict key: a scalar, or a tuple of them nested at most `depth` deep."""
    if depth == 0:
        return _scalar(excluded)
    return alt(_scalar(excluded), _tuple_of(_hashable(depth - 1, excluded)))


@functools.cache
def _value(depth: int, excluded: bytes, one_tuple: bool = True) -> tuple:
    """A literal whose containers nest at most `depth` deep.

    With `one_tuple=False` the outermost value is never a 1-tuple `(x,)`.
    """
    if depth == 0:
        return _scalar(excluded)
    inner = _value(depth - 1, excluded)
    return alt(
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
        "float": alt(_INT, _FLOAT),
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
        return alt(*(_shaped(s, excluded) for s in shape[1]))
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
        return alt(*(_shaped_hashable(s, excluded) for s in shape[1]))
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
        call = seq(_token(b"("), lit(b")"))
    elif arity == 1 and wrapper != "call":
        call = seq(_token(b"("), args[0], _token(b","), lit(b")"))
    else:  # `test_func(x)` and `(x, y)`: a trailing comma allowed
        rest = [seq(_token(b","), a) for a in args[1:]]
        call = seq(_token(b"("), args[0], *rest, opt(_token(b",")), lit(b")"))
    if wrapper == "fence":
        return seq(lit(b"```\n"), call, lit(b"\n```"))
    if wrapper == "input_line":
        return seq(lit(b"Input: "), call)
    return seq(lit(b"```python\ntest_func"), call, lit(b"\n```"))


def _nocase(word: bytes) -> tuple:
    return seq(*(byte_set(bytes({c, ord(chr(c).upper()), ord(chr(c).lower())})) for c in word))


# What `env.parse`'s revision label treats as a word character; bytes from 0x80 count as
# one too (a Unicode letter would), so the detector never fires where the parser reads no label.
_WORD = bytes(b"_" + string.ascii_letters.encode() + string.digits.encode()) + bytes(
    range(0x80, 0x100)
)
_NONWORD = byte_set(bytes(c for c in range(256) if c not in _WORD))
_SPACE = star(byte_set(b" \t\n\r\f\v"))


def decision_grammar() -> tuple:
    """Any reply up to and including its first complete revision label, then one more byte.

    `env.parse.parse_revision` reads `decision|label|action`, `:` or `=`, optional `*`,
    then `continue|stop` (any case) between word boundaries. This grammar is any bytes,
    then such a label at a word start, then the non-word byte that closes it: the shortest
    reply whose label the parser reads. Used as a detector (`constraint.DECISION`): the
    reply ends there, and nothing is masked before.
    """
    label = alt(_nocase(b"decision"), _nocase(b"label"), _nocase(b"action"))
    word_start = opt(seq(star(byte_set(range(256))), _NONWORD))
    return seq(
        word_start,
        label,
        _SPACE,
        byte_set(b":="),
        _SPACE,
        star(lit(b"*")),
        _SPACE,
        alt(_nocase(b"continue"), _nocase(b"stop")),
        _NONWORD,
    )


def rating_grammar(low: int = 1, high: int = 5) -> tuple:
    """Any reply that ends with a rating line's digit: `Rating: X`, X in `low..high`.

    `evaluation.judge.parse_rating` reads the last `rating`, `:` or `=`, optional `*`, then
    a digit in 1..5 at a word end (any case). This grammar is any bytes, then `rating` at
    a word start, `:` or `=`, optional `*`s and spaces, a digit, and the end of the reply:
    free reasoning first, and whatever the mask allows parses. Masked (not a detector), so
    with a token budget the rating is written before the budget ends
    (`token_mask.mask_logits`'s ``remaining``).
    """
    if not 0 <= low <= high <= 9:
        raise ValueError(f"a rating is one digit: need 0 <= low <= high <= 9, got {low}..{high}")
    word_start = opt(seq(star(byte_set(range(256))), _NONWORD))
    return seq(
        word_start,
        _nocase(b"rating"),
        _SPACE,
        byte_set(b":="),
        _SPACE,
        star(lit(b"*")),
        _SPACE,
        byte_set(bytes(range(ord("0") + low, ord("0") + high + 1))),
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
    not_tick = byte_set(bytes(b for b in range(256) if b != ord("`")))
    body = star(alt(not_tick, seq(lit(b"`"), not_tick), seq(lit(b"``"), not_tick)))
    return seq(
        _SPACE,
        lit(b"```"),
        opt(alt(_nocase(b"python"), _nocase(b"py"))),
        star(byte_set(b" \t")),
        lit(b"\n"),
        body,
        lit(b"```"),
    )


def stop_grammar(strings) -> tuple:
    """Any reply up to and including the first occurrence of one of `strings` (UTF-8)."""
    return seq(star(byte_set(range(256))), alt(*(lit(s.encode()) for s in strings)))


def either(*grammars) -> tuple:
    """A reply any of `grammars` matches (the one grammar itself when alone)."""
    return grammars[0] if len(grammars) == 1 else alt(*grammars)
