"""Held-out input search: coverage-guided, type-aware generation of valid inputs."""

import random
from collections.abc import Collection, Sequence

from pau_jax.data import argtypes, mutations, split
from pau_jax.data.execution import Outcome, encode_or_none, run_many
from pau_jax.data.measure import CodeCoverage
from pau_jax.data.pipeline_config import PipelineConfig


def observation(
    args: tuple, key: str, outcome: Outcome, measured: CodeCoverage, is_seed: bool
) -> split.Observation:
    """An observation of one call, with its lines and arcs mapped to statements."""
    lines, arcs = measured.translate(outcome.lines, outcome.arcs)
    return split.Observation(
        args=args, key=key, output=outcome.output, lines=lines, arcs=arcs, is_seed=is_seed
    )


def is_valid(outcome: Outcome, config: PipelineConfig) -> bool:
    """A call whose input can be kept: it returned an encodable value, small and fast."""
    return (
        outcome.ok
        and len(outcome.output) <= config.max_output_chars
        and outcome.wall_s <= config.max_call_s
    )


def search(
    code: str,
    specs: Sequence[argtypes.TypeSpec],
    observations: Sequence[split.Observation],
    measured: CodeCoverage,
    executor,
    rng: random.Random,
    config: PipelineConfig,
    excluded_keys: Collection[str],
    budget: int | None = None,
) -> tuple[list[split.Observation], int]:
    """Coverage-guided, type-aware search for held-out inputs.

    Batches of candidates (mutations of the corpus, crossovers, fresh values of `specs`) run
    in the sandbox with coverage; inputs adding statements or branch arcs join the corpus.
    The search stops once everything is covered and n_heldout + 4 inputs are available and
    two batches brought nothing new, or after max_candidates inputs or max_timeouts
    time-outs.

    Args:
      code: the anonymised module (coverage refers to it).
      specs: one TypeSpec per argument; candidates outside them are never run.
      observations: valid seed observations.
      measured: static coverage structure of `code`.
      executor: sandbox executor.
      rng: the item's seeded generator.
      config: pipeline settings.
      excluded_keys: inputs that may not be held out (the shown examples).
      budget: most inputs to try (default config.max_candidates).

    Returns:
      The pool of valid observations available for holding out, and the number of
      generated inputs tried.
    """
    pools = mutations.pools_for(code, [o.args for o in observations])
    gen = mutations.Generator(pools, rng, config.limits)
    seen = {o.key for o in observations} | set(excluded_keys)
    corpus = list(observations)
    pool = [o for o in observations if o.key not in excluded_keys]
    covered_s = set().union(*(o.lines for o in pool)) if pool else set()
    covered_b = set().union(*(o.arcs for o in pool)) if pool else set()
    tried, stale, timeouts = 0, 0, 0
    budget = config.max_candidates if budget is None else budget
    while tried < budget and timeouts < config.max_timeouts:
        complete = measured.statements <= covered_s and measured.branch_arcs <= covered_b
        if complete and len(pool) >= config.n_heldout + 4:
            break
        batch, keys = [], []
        # After a time-out, smaller batches limit the cost of inputs that loop.
        size = config.batch_size if not timeouts else max(1, config.batch_size // 4)
        for _ in range(size * 4):
            if len(batch) == size:
                break
            pick = rng.random()
            if corpus and pick < 0.75:
                args = gen.mutate_args(rng.choice(corpus).args, specs)
            elif len(corpus) > 1 and pick < 0.85:
                args = gen.crossover(rng.choice(corpus).args, rng.choice(corpus).args)
            else:
                args = gen.fresh_args(specs)
            key = encode_or_none(args)
            if key is None or key in seen or len(key) > config.max_input_chars:
                continue
            if not all(argtypes.matches(a, s) for a, s in zip(args, specs)):
                continue
            seen.add(key)
            batch.append(args)
            keys.append(key)
        if not batch:
            break
        tried += len(batch)
        outcomes = run_many(
            executor,
            code,
            batch,
            entry="test_func",
            timeout_s=config.timeout_s,
            coverage=True,
        )
        added = 0
        timeouts += sum(o.timed_out for o in outcomes)
        for args, key, outcome in zip(batch, keys, outcomes):
            if not is_valid(outcome, config):
                continue
            obs = observation(args, key, outcome, measured, False)
            new = not (obs.lines <= covered_s and obs.arcs <= covered_b)
            if new:
                corpus.append(obs)
                added += 1
            elif rng.random() < 0.2:
                corpus.append(obs)
            pool.append(obs)
            covered_s |= obs.lines
            covered_b |= obs.arcs
        stale = 0 if added else stale + 1
        if complete and stale >= 2:
            break
    return pool, tried
