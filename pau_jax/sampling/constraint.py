"""A token-level automaton for the input phase, built on the host as device tables.

`build(vocab, stop_ids, arity=, wrapper=, depth=)` compiles `input_grammar.grammar`
to a minimal byte DFA (`byte_dfa.compile_dfa`), then walks every token's bytes
from every state once (a walk over the sorted vocabulary's prefix trie). Tokens
that behave alike in every state share a class, so the tables are

  token_class [V] int32      the class of each token (stop tokens one class; tokens
                             never allowed, such as other special tokens, another)
  next_state  [S + 2, C] int16  next state per (state, class); -1: not allowed
                             (int32 from 32,767 states on)
  mask_row    [S + 2] int32  which row of `masks` a state uses
  masks       [M, ceil(V / 32)] uint32  the distinct allowed-token sets, packed

with two extra states: `free` (row S: everything allowed, for unconstrained rows;
it never changes) and `dead` (row S + 1: only stop tokens; a disallowed token
leads there). Accepting states allow only the stop tokens (the reply is
complete). Transitions into states from which no token sequence completes the
answer are dropped, so a row reached from `start` always has a token to sample.
The mask and the step over these tables, pure, per row and jittable, are
`token_mask.py`'s.
"""

import dataclasses
import functools
from collections.abc import Sequence

import jax
import numpy as np

from pau_jax.sampling import byte_dfa, input_grammar
from pau_jax.sampling.token_bytes import Vocabulary

WRAPPERS = input_grammar.WRAPPERS

# --- the token automaton ---------------------------------------------------------------


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["token_class", "next_state", "mask_row", "masks", "accepting", "distance"],
    meta_fields=["start", "starts", "free", "dead"],
)
@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenAutomaton:
    """The token-level tables, as device arrays (`build_components` puts them there once)."""

    token_class: np.ndarray | jax.Array  # [V] int32
    next_state: np.ndarray | jax.Array  # [S + 2, C] int16 (int32 if S is large), -1: not allowed
    mask_row: np.ndarray | jax.Array  # [S + 2] int32
    masks: np.ndarray | jax.Array  # [M, ceil(V / 32)] uint32, bit t % 32 of word t // 32
    accepting: np.ndarray | jax.Array  # [S + 2] bool: the answer is complete
    distance: np.ndarray | jax.Array  # [S + 2] int32: fewest tokens to complete (0: detector)
    start: int  # the first component's start
    starts: tuple[int, ...]  # each component's start (`build_components`)
    free: int  # the sentinel: every token allowed, never left
    dead: int  # after a disallowed token: only stop tokens

    @property
    def vocab_size(self) -> int:
        return int(self.token_class.shape[0])

    def table_bytes(self) -> dict[str, int]:
        """Bytes of each table (what the device holds)."""
        names = ("token_class", "next_state", "mask_row", "masks", "accepting", "distance")
        return {name: int(np.asarray(getattr(self, name)).nbytes) for name in names}

    def nbytes(self) -> int:
        return sum(self.table_bytes().values())


KINDS = ("input", "rating", "code", "decision", "stop")


@dataclasses.dataclass(frozen=True)
class Component:
    """One part of an automaton: an input grammar or a rating (masked), or a detector.

    'input': `input_grammar.grammar(arity, wrapper, depth, shapes)`, masked (only tokens
    that keep the reply in the grammar are allowed). 'rating': any reply ending with a
    `Rating: 1..5` line (`input_grammar.rating_grammar()`), masked: a grader's reply that
    always parses. 'code': one closed ```python block (`input_grammar.code_grammar()`),
    masked: a coder's reply whose block is always read. 'decision' and 'stop' are
    detectors: every token
    is allowed (special ones too) and the state only tells when the reply is complete:
    'decision' at its first revision label (`input_grammar.decision_grammar()`) or at any
    of `stop`, 'stop' at the first of the strings `stop` (as a server's stop strings).

    An input grammar bounds nesting, not length. `max_piece_bytes` and `max_piece_digits`
    (0: no bound) leave out of an input component every token longer than that, or
    holding more ASCII digits: a reply of at most N tokens then has at most N times
    each, which is how a caller keeps every reply the mask allows within a reader's
    limits (`LocalPolicy`: the argument parser's characters and Python's int digits).
    """

    kind: str
    arity: int = 0
    wrapper: str = "fence"
    depth: int = 2
    stop: tuple[str, ...] = ()
    shapes: tuple = ()  # 'input': one shape per argument (`input_grammar.grammar`), or any
    max_piece_bytes: int = 0  # 'input': the longest token allowed (0: any)
    max_piece_digits: int = 0  # 'input': the most digits a token may hold (0: any)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"a component's kind is one of {KINDS}, got {self.kind!r}")
        if isinstance(self.stop, str) or not all(isinstance(x, str) and x for x in self.stop):
            raise ValueError(f"stop must be a tuple of non-empty strings, got {self.stop!r}")
        if self.kind == "stop" and not self.stop:
            raise ValueError("a 'stop' component needs at least one stop string")
        if self.kind in ("input", "rating", "code") and self.stop:
            raise ValueError(
                f"an {self.kind!r} component ends with its grammar; it takes no stop strings"
            )
        if self.max_piece_bytes < 0 or self.max_piece_digits < 0:
            raise ValueError("max_piece_bytes and max_piece_digits must be >= 0 (0: no bound)")
        if self.kind != "input" and (self.max_piece_bytes or self.max_piece_digits):
            raise ValueError("only an 'input' component bounds its tokens")


DECISION = Component("decision")
RATING = Component("rating")
CODE = Component("code")


def build(
    vocab: Vocabulary | Sequence[bytes | None],
    stop_ids: Sequence[int],
    *,
    arity: int,
    wrapper: str = "fence",
    depth: int = 2,
    vocab_size: int | None = None,
) -> TokenAutomaton:
    """The token automaton of `input_grammar.grammar(arity, wrapper, depth)` over `vocab` (cached).

    Args:
      vocab: a `Vocabulary`, or each token id's bytes (None: never allowed, special
        tokens).
      stop_ids: the tokens that end the reply, allowed only once it is complete.
      arity: the function's number of parameters.
      wrapper: see `input_grammar.grammar`.
      depth: how deep containers nest.
      vocab_size: the model's vocabulary (the logits' width), at least `len(vocab)`.
    """
    return build_components(
        vocab, stop_ids, [Component("input", arity, wrapper, depth)], vocab_size
    )


def build_components(
    vocab: Vocabulary | Sequence[bytes | None],
    stop_ids: Sequence[int],
    components: Sequence[Component],
    vocab_size: int | None = None,
) -> TokenAutomaton:
    """One automaton holding several components, each with its own start (`starts[i]`).

    A row starts in the start of the component it needs (or in `free`) and stays inside
    it, so rows of one batch can follow different arities, the detector or nothing. Each
    component's table is built once per vocabulary (cached); joining them is cheap.
    """
    vocab_size = len(vocab) if vocab_size is None else vocab_size
    if vocab_size < len(vocab) or not stop_ids:
        raise ValueError(f"need vocab_size >= {len(vocab)} and some stop_ids")
    if not components:
        raise ValueError("need at least one component")
    if not isinstance(vocab, Vocabulary):
        vocab = Vocabulary(vocab)
    key = (vocab, tuple(sorted(stop_ids)), vocab_size)
    return _join(key, tuple(_component(key, c) for c in components))


def _prune(next_state: np.ndarray, accepting: np.ndarray) -> np.ndarray:
    """Drops the transitions into states from which no token sequence completes the answer.

    A token may end inside a UTF-8 character that no other token finishes; without
    this, a row could reach a state that allows nothing.
    """
    live = accepting.copy()
    while True:
        grown = live | (live[np.maximum(next_state, 0)] & (next_state >= 0)).any(axis=1)
        if np.array_equal(grown, live):
            break
        live = grown
    return np.where((next_state >= 0) & live[np.maximum(next_state, 0)], next_state, -1)


def clear_cache() -> None:
    """Forgets the automata `build` has cached (for timing a build)."""
    _component.cache_clear()
    _join.cache_clear()


@dataclasses.dataclass(frozen=True, eq=False)
class _Part:
    token_class: np.ndarray  # [V] int32; 0: never-allowed tokens, 1: stop tokens
    next_state: np.ndarray  # [S, C] int32, -1: not allowed; start is state 0
    accepting: np.ndarray  # [S] bool
    distance: np.ndarray  # [S] int32 fewest tokens to an accepting state (0 in a detector)


def _distances(next_state: np.ndarray, accepting: np.ndarray) -> np.ndarray:
    """[S] the fewest tokens from each state to an accepting one (stop tokens not counted)."""
    big = np.int32(2**30)
    dist = np.where(accepting, 0, big).astype(np.int32)
    steps = next_state.copy()
    steps[:, 1] = -1  # the stop class completes nothing
    while True:
        via = np.where(steps >= 0, dist[np.maximum(steps, 0)], big).min(axis=1)
        new = np.minimum(dist, np.minimum(via, big - 1) + 1)
        new = np.where(accepting, 0, new)
        if np.array_equal(new, dist):
            return dist
        dist = new


# Masked components whose grammar takes no settings: kind -> the grammar.
_WHOLE_REPLY = {"rating": input_grammar.rating_grammar, "code": input_grammar.code_grammar}


def _byte_dfa(component: Component) -> tuple[byte_dfa.ByteDFA, bool]:
    """The component's byte DFA and whether it is a detector (its accepting states absorb)."""
    if component.kind == "input":
        grammar = input_grammar.grammar(
            component.arity, component.wrapper, component.depth, component.shapes
        )
        return byte_dfa.compile_dfa(grammar), False
    if component.kind in _WHOLE_REPLY:
        return byte_dfa.compile_dfa(_WHOLE_REPLY[component.kind]()), False
    parts = [input_grammar.decision_grammar()] if component.kind == "decision" else []
    if component.stop:
        parts.append(input_grammar.stop_grammar(component.stop))
    dfa = byte_dfa.compile_dfa(input_grammar.either(*parts))
    delta = dfa.delta.copy()
    delta[dfa.accepting] = np.flatnonzero(dfa.accepting)[:, None]
    return dataclasses.replace(dfa, delta=delta), True


_DIGITS = frozenset(b"0123456789")


def _fits(component: Component, piece: bytes) -> bool:
    """Whether a token is within the component's bounds (a token outside is never allowed)."""
    if component.max_piece_bytes and len(piece) > component.max_piece_bytes:
        return False
    return not component.max_piece_digits or (
        sum(b in _DIGITS for b in piece) <= component.max_piece_digits
    )


@functools.lru_cache(maxsize=32)
def _component(key, component: Component) -> _Part:
    """Walks every token's bytes from every state of the component's DFA (a prefix-trie walk)."""
    vocab, stop_ids, vocab_size = key
    dfa, detector = _byte_dfa(component)
    n = dfa.delta.shape[0]
    # [S + 1, K]: a reject row at index n so that -1 stays -1 through a walk.
    delta = np.vstack([dfa.delta, np.full((1, dfa.delta.shape[1]), -1, np.int32)])
    delta[delta < 0] = n
    never, stop = 0, 1  # classes 0 and 1; token classes from 2 on
    same = np.arange(n, dtype=np.int32)
    if detector:  # special tokens and stop tokens leave a detector where it was
        columns = [same, same]
    else:
        columns = [np.full(n, -1, np.int32), np.where(dfa.accepting, same, -1)]
    seen: dict[bytes, int] = {}
    token_class = np.full(vocab_size, never, np.int32)
    token_class[list(stop_ids)] = stop
    ids = sorted(
        (p, i)
        for i, p in enumerate(vocab.pieces)
        if p and i not in stop_ids and _fits(component, p)
    )
    stack, prev = [same], b""
    for piece, i in ids:
        common = 0
        limit = min(len(prev), len(piece), len(stack) - 1)
        while common < limit and prev[common] == piece[common]:
            common += 1
        del stack[common + 1 :]
        for b in piece[common:]:
            stack.append(delta[stack[-1], dfa.byte_class[b]])
        prev = piece
        column = np.where(stack[-1] == n, -1, stack[-1]).astype(np.int32)
        key_ = column.tobytes()
        if key_ not in seen:
            seen[key_] = len(columns)
            columns.append(column)
        token_class[i] = seen[key_]
    next_state = _prune(np.stack(columns, axis=1), dfa.accepting)  # [S, C]
    distance = np.zeros(n, np.int32) if detector else _distances(next_state, dfa.accepting)
    return _Part(
        token_class=token_class,
        next_state=next_state,
        accepting=dfa.accepting,
        distance=distance,
    )


@functools.lru_cache(maxsize=8)  # device memory: a few automata (up to ~20 MiB each)
def _join(key, parts: tuple[_Part, ...]) -> TokenAutomaton:
    """The components side by side (states offset), classes refined to tell all apart."""
    vocab_size = key[2]
    # A token's joint class is its tuple of component classes; (0, ...) and (1, ...) stay 0, 1.
    pairs = np.stack([p.token_class for p in parts], axis=1)  # [V, k]
    first = np.stack([np.zeros(len(parts), np.int32), np.ones(len(parts), np.int32)])
    keys, token_class = np.unique(np.vstack([first, pairs]), axis=0, return_inverse=True)
    token_class = token_class.reshape(-1)[2:].astype(np.int32)
    # np.unique sorts rows; (0, ...) and (1, ...) sort first since classes are >= 0.
    assert (keys[0] == 0).all() and (keys[1] == 1).all()
    blocks, offset, starts = [], 0, []
    for j, part in enumerate(parts):
        nxt = part.next_state[:, keys[:, j]]  # [S_j, C]
        blocks.append(np.where(nxt >= 0, nxt + offset, -1))
        starts.append(offset)
        offset += len(part.next_state)
    next_state = np.vstack(blocks)
    free, dead = offset, offset + 1
    stop = 1
    free_row = np.full((1, next_state.shape[1]), free, np.int32)
    dead_row = np.full((1, next_state.shape[1]), -1, np.int32)
    dead_row[0, stop] = dead
    next_state = np.vstack([next_state, free_row, dead_row])
    # int16 while the states fit (halves the largest table); `advance` returns int32.
    next_state = next_state.astype(np.int16 if len(next_state) < 2**15 else np.int32)
    allowed = next_state >= 0  # [S + 2, C]
    allowed[free] = True
    rows, mask_row = np.unique(allowed, axis=0, return_inverse=True)
    words = -(-vocab_size // 32)
    bits = np.zeros((len(rows), words * 32), bool)
    bits[:, :vocab_size] = rows[:, token_class]
    bits[rows.all(axis=1), :] = True  # rows allowing everything allow the padding too
    packed = np.packbits(bits, axis=1, bitorder="little").view("<u4").astype(np.uint32)
    accepting = np.concatenate([*(p.accepting for p in parts), [False, False]])
    distance = np.concatenate([*(p.distance for p in parts), [0, 0]]).astype(np.int32)
    # On the device once, here: a decode call then transfers nothing.
    automaton = TokenAutomaton(
        token_class=token_class,
        next_state=next_state,
        mask_row=mask_row.reshape(-1).astype(np.int32),
        masks=packed,
        accepting=accepting,
        distance=distance,
        start=starts[0],
        starts=tuple(starts),
        free=free,
        dead=dead,
    )
    return jax.device_put(automaton)
