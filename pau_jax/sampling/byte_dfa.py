"""Regular expressions over bytes, written as small trees, and their minimal DFA.

A regular expression is a tree of tuples: `("set", mask)` (one byte of those whose bits
are set in an int mask), `("seq", [parts])`, `("alt", [parts])` and `("star", part)`,
built with `byte_set`, `lit`, `seq`, `alt`, `star`, `opt` and `plus`. `compile_dfa` turns
one into a `ByteDFA` (an NFA, subset construction over byte classes, Moore
minimisation). `input_grammar.py` writes the grammars of structured decoding in it.
"""

import dataclasses

import numpy as np


def _bits(chars: bytes | range) -> int:
    out = 0
    for c in chars:
        out |= 1 << c
    return out


def byte_set(chars) -> tuple:
    return ("set", chars if isinstance(chars, int) else _bits(chars))


def lit(text: bytes) -> tuple:
    return ("seq", [byte_set(bytes([c])) for c in text])


def seq(*parts) -> tuple:
    return ("seq", list(parts))


def alt(*parts) -> tuple:
    return ("alt", list(parts))


def star(part) -> tuple:
    return ("star", part)


def opt(part) -> tuple:
    return ("alt", [part, ("seq", [])])


def plus(part) -> tuple:
    return seq(part, star(part))


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
