"""Example split: two shown examples with distinct outputs, held-out inputs chosen for coverage."""

import dataclasses
import random
from collections.abc import Collection, Sequence


@dataclasses.dataclass(frozen=True, kw_only=True)
class Observation:
    """One input run on the function.

    Attributes:
      args: the argument tuple.
      key: canonical encoding of `args` (identity of the input).
      output: canonical encoding of the return value.
      lines: executed line numbers of the measured code.
      arcs: executed (from_line, to_line) arcs of the measured code.
      is_seed: whether the input comes from the source's own tests.
    """

    args: tuple
    key: str
    output: str
    lines: frozenset[int]
    arcs: frozenset[tuple[int, int]]
    is_seed: bool


def choose_shown(
    candidates: Sequence[Observation],
    rng: random.Random,
    count: int = 2,
    avoid: Collection[str] = frozenset(),
) -> list[Observation] | None:
    """Picks `count` examples with pairwise distinct outputs, seeds first.

    Args:
      candidates: valid observations, in a deterministic order.
      rng: seeded generator.
      count: number of shown examples.
      avoid: keys of inputs to take only when no other input gives a new output (those
        that held-out coverage depends on).

    Returns:
      The chosen observations, or None when fewer than `count` distinct outputs exist.
    """
    groups = []
    for avoided in (False, True):
        for is_seed in (True, False):
            group = [o for o in candidates if o.is_seed == is_seed and (o.key in avoid) == avoided]
            rng.shuffle(group)
            groups.extend(group)
    chosen, outputs = [], set()
    for obs in groups:
        if obs.output not in outputs:
            chosen.append(obs)
            outputs.add(obs.output)
            if len(chosen) == count:
                return chosen
    return None


def choose_heldout(
    pool: Sequence[Observation],
    statements: Collection[int],
    branch_arcs: Collection[tuple[int, int]],
    count: int,
    rng: random.Random,
) -> list[Observation]:
    """Greedy coverage cover of the pool, then diverse extra inputs up to `count`.

    The cover repeatedly takes the input adding the most uncovered statements and branch
    arcs (ties: pool order); extras prefer outputs not yet held out, then seeds, then
    random order. The cover is kept whole even when it exceeds `count`.

    Args:
      pool: valid observations not shown to the agent, in a deterministic order.
      statements: the code's statement lines.
      branch_arcs: the code's possible branch arcs.
      count: wanted number of held-out inputs.
      rng: seeded generator.

    Returns:
      Held-out observations: the cover first, then extras.
    """
    targets_s, targets_b = set(statements), set(branch_arcs)
    chosen: list[Observation] = []
    remaining = list(pool)
    while remaining:
        gains = [len(o.lines & targets_s) + len(o.arcs & targets_b) for o in remaining]
        best = max(range(len(remaining)), key=lambda i: (gains[i], -i))
        if gains[best] == 0:
            break
        obs = remaining.pop(best)
        chosen.append(obs)
        targets_s -= obs.lines
        targets_b -= obs.arcs
    rng.shuffle(remaining)
    outputs = {o.output for o in chosen}
    while len(chosen) < count and remaining:
        fresh = [i for i, o in enumerate(remaining) if o.output not in outputs]
        seeds = [i for i, o in enumerate(remaining) if o.is_seed]
        index = (fresh or seeds or [0])[0]
        obs = remaining.pop(index)
        chosen.append(obs)
        outputs.add(obs.output)
    return chosen
