"""From a source task to a benchmark record: filter, anonymise, prove, validate, generate, split."""

import dataclasses
import random

from pau_jax.data import anonymize as anonymize_lib
from pau_jax.data import argtypes, inputs, mutations, safety, split, validators
from pau_jax.data.execution import UNENCODABLE, Outcome, encode_or_none, run_many
from pau_jax.data.measure import CodeCoverage

# Defined in its own module, so that `inputs` reads it without importing this one.
from pau_jax.data.pipeline_config import PipelineConfig
from pau_jax.data.sources import SourceTask

# Exclusion reasons, in pipeline order.
UNSAFE = "unsafe code"
UNSUPPORTED = "cannot anonymise"
SOURCE_TESTS_FAIL = "source tests fail on the original"
NONDETERMINISTIC = "nondeterministic"
BEHAVIOUR_CHANGED = "anonymisation changes behaviour"
NO_VALID_SEED = "no valid seed input"
UNSUPPORTED_TYPE = "unsupported argument type"
FEW_OUTPUTS = "fewer than 2 distinct outputs"
FEW_HELDOUT = "too few held-out inputs"
LOW_COVERAGE = "coverage below threshold"
VALIDATED_FAILS = "validated code fails on a kept input"
REASONS = (
    UNSAFE,
    UNSUPPORTED,
    SOURCE_TESTS_FAIL,
    NONDETERMINISTIC,
    BEHAVIOUR_CHANGED,
    NO_VALID_SEED,
    UNSUPPORTED_TYPE,
    FEW_OUTPUTS,
    FEW_HELDOUT,
    LOW_COVERAGE,
    VALIDATED_FAILS,
)

_RECORDER = """

def __pau_record():
    import copy as __pau_copy
    import random as __pau_random
    __pau_random.seed(0)
    __pau_calls = []

    def __pau_candidate(*args):
        __pau_calls.append(__pau_copy.deepcopy(args))
        return {entry}(*args)
    __pau_source_test(__pau_candidate)
    return __pau_calls
"""
_CHECKER = """

def __pau_check():
    import random as __pau_random
    __pau_random.seed(0)
    __pau_source_test({entry})
    return True
"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Exclusion:
    """Why a candidate did not become a record."""

    task_id: str
    source: str
    reason: str
    detail: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Example:
    """One input with its output, both in the typed codec."""

    args: str
    output: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Record:
    """One benchmark item (prompts are built by the environment, not stored).

    Attributes:
      task_id, source, entry_point: identity of the original function.
      header: "def test_func(arg0, ...):".
      code: executable code: anonymised module with validate_input_args called first.
      anonymized_code: the anonymised module without the validator (coverage refers to it).
      original_code: the source's code.
      description, description_origin: gold description and where it comes from.
      arg_types: one type per argument, in the text form of argtypes.TypeSpec.
      shown: the examples given to the agent.
      heldout: E_test, the held-out examples.
      statement_coverage, branch_coverage: coverage of anonymized_code by E_test.
      n_statements, n_branches: sizes behind the coverage fractions.
      n_seeds: valid inputs found in the source's tests.
      n_candidates: generated inputs tried.
    """

    task_id: str
    source: str
    entry_point: str
    header: str
    code: str
    anonymized_code: str
    original_code: str
    description: str
    description_origin: str
    arg_types: tuple[str, ...]
    shown: tuple[Example, ...]
    heldout: tuple[Example, ...]
    statement_coverage: float
    branch_coverage: float
    n_statements: int
    n_branches: int
    n_seeds: int
    n_candidates: int


class _Excluded(Exception):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def _drawn_seeds(task: SourceTask, config: PipelineConfig) -> list[tuple]:
    """Seeds of a source without tests, drawn from its declared argument types."""
    if not task.arg_types:
        raise _Excluded(NO_VALID_SEED, "no tests and no declared argument types")
    specs = [argtypes.parse(t) for t in task.arg_types]
    rng = random.Random(f"{config.seed}:seeds:{task.task_id}")
    gen = mutations.Generator(mutations.pools_for(task.code, []), rng, config.limits)
    seeds, seen = [], set()
    for _ in range(config.max_seeds * 3):
        args = gen.fresh_args(specs)
        key = encode_or_none(args)
        if key is not None and key not in seen:
            seen.add(key)
            seeds.append(args)
    return seeds[: config.max_seeds]


def _record_seeds(task: SourceTask, executor, config: PipelineConfig) -> list[tuple]:
    if not task.test_code:
        return _drawn_seeds(task, config)
    code = task.code + "\n\n" + task.test_code + _RECORDER.format(entry=task.entry_point)
    [outcome] = run_many(
        executor, code, [()], entry="__pau_record", timeout_s=config.harness_timeout_s
    )
    if not outcome.ok:
        if outcome.error_type == UNENCODABLE:
            return list(task.test_inputs)
        raise _Excluded(SOURCE_TESTS_FAIL, outcome.error_type)
    seeds, seen = [], set()
    for args in outcome.value:
        key = encode_or_none(tuple(args))
        if key is not None and key not in seen:
            seen.add(key)
            seeds.append(tuple(args))
    return seeds[: config.max_seeds]


def _check_determinism(task, seeds, executor, check_executor, config) -> list[Outcome]:
    """Runs the original on every seed in two executors; any difference excludes the task."""
    first = run_many(executor, task.code, seeds, entry=task.entry_point, timeout_s=config.timeout_s)
    second = run_many(
        check_executor, task.code, seeds, entry=task.entry_point, timeout_s=config.timeout_s
    )
    for args, a, b in zip(seeds, first, second):
        if not (a.unstable or b.unstable or a.same_behaviour(b)):
            raise _Excluded(NONDETERMINISTIC, f"outputs differ on {args!r:.80}")
    return [b if a.unstable else a for a, b in zip(first, second)]


def _prove_behaviour(task, anonymized, seeds, original, executor, config) -> list[Outcome]:
    """Runs the source test on the anonymised code and compares outputs on every seed."""
    if task.test_code:
        _check_source_test(task, anonymized, executor, config)
    renamed = run_many(
        executor,
        anonymized.code,
        seeds,
        entry="test_func",
        timeout_s=config.timeout_s,
        coverage=True,
    )
    for args, a, b in zip(seeds, original, renamed):
        if not (a.unstable or b.unstable or a.same_behaviour(b)):
            raise _Excluded(BEHAVIOUR_CHANGED, f"outputs differ on {args!r:.80}")
    # A seed that timed out on either side is not used.
    return [
        dataclasses.replace(b, ok=False) if a.unstable else b for a, b in zip(original, renamed)
    ]


def _check_source_test(task, anonymized, executor, config) -> None:
    """The source's own test passes with test_func in place of the original."""
    # Tests may call the original by name as a reference (HumanEval/33): it is defined first,
    # and the anonymised module after it, so that test_func and its helpers are the new ones.
    checker = "\n\n".join([task.code, anonymized.code, task.test_code]) + _CHECKER.format(
        entry="test_func"
    )
    [check] = run_many(
        executor, checker, [()], entry="__pau_check", timeout_s=config.harness_timeout_s
    )
    if not check.ok:
        raise _Excluded(BEHAVIOUR_CHANGED, f"source test: {check.error_type}")


def build_record(
    task: SourceTask, executor, check_executor, config: PipelineConfig
) -> Record | Exclusion:
    """Turns one source task into a record, or says why it is excluded.

    Args:
      task: the candidate function.
      executor: sandbox executor for the construction runs.
      check_executor: a second executor (separate workers) for the determinism check.
      config: settings.

    Returns:
      A Record, or an Exclusion naming one of REASONS.
    """
    try:
        return _build(task, executor, check_executor, config)
    except _Excluded as e:
        return Exclusion(task_id=task.task_id, source=task.source, reason=e.reason, detail=e.detail)


def _validated(anonymized, kept, chosen, check_executor, config) -> tuple[str, list]:
    """(the code with its input validator, the argument specs), the chosen examples re-run.

    The validator accepts exactly the types of the valid inputs kept (seeds and examples);
    every chosen example must give its recorded output again through it.
    """
    specs = [
        argtypes.join_all(argtypes.infer(o.args[i]) for o in kept)
        for i in range(len(anonymized.arg_names))
    ]
    validator = validators.validator_source(anonymized.arg_names, specs)
    code = validators.attach(anonymized.code, validator)
    rerun = run_many(
        check_executor,
        code,
        [o.args for o in chosen],
        entry="test_func",
        timeout_s=config.check_timeout_s,
    )
    for obs, outcome in zip(chosen, rerun):
        if (outcome.ok and outcome.output != obs.output) or outcome.unstable:
            raise _Excluded(NONDETERMINISTIC, f"{obs.key:.80}")
        if not outcome.ok:
            raise _Excluded(VALIDATED_FAILS, f"{outcome.error_type} on {obs.key:.80}")
    return code, specs


def _build(task, executor, check_executor, config) -> Record:
    reasons = safety.unsafe_reasons(task.code)
    if reasons:
        raise _Excluded(UNSAFE, ", ".join(reasons))
    try:
        anonymized = anonymize_lib.anonymize(task.code, task.entry_point)
    except anonymize_lib.AnonymizeError as e:
        raise _Excluded(UNSUPPORTED, str(e)) from e
    seeds = _record_seeds(task, executor, config)
    original = _check_determinism(task, seeds, executor, check_executor, config)
    seed_outcomes = _prove_behaviour(task, anonymized, seeds, original, executor, config)
    rng = random.Random(f"{config.seed}:{task.task_id}")
    with CodeCoverage(anonymized.code) as measured:
        observations = []
        for args, outcome in zip(seeds, seed_outcomes):
            key = encode_or_none(args)
            if inputs.is_valid(outcome, config) and len(key) <= config.max_input_chars:
                if len(args) == len(anonymized.arg_names):
                    observations.append(inputs.observation(args, key, outcome, measured, True))
        if not observations:
            raise _Excluded(NO_VALID_SEED)
        try:
            specs = [
                argtypes.join_all(argtypes.infer(o.args[i]) for o in observations)
                for i in range(len(anonymized.arg_names))
            ]
        except argtypes.UnsupportedTypeError as e:
            raise _Excluded(UNSUPPORTED_TYPE, str(e)) from e
        shown = split.choose_shown(observations, rng, config.n_shown)
        shown_keys = {o.key for o in shown} if shown else set()
        pool, tried = inputs.search(
            anonymized.code, specs, observations, measured, executor, rng, config, shown_keys
        )
        if shown is None:
            # Shown examples chosen now must not take inputs that coverage depends on.
            cover = split.choose_heldout(pool, measured.statements, measured.branch_arcs, 0, rng)
            shown = split.choose_shown(pool, rng, config.n_shown, avoid={o.key for o in cover})
            if shown is None:
                raise _Excluded(FEW_OUTPUTS)
            shown_keys = {o.key for o in shown}
            if shown_keys & {o.key for o in cover}:
                # A shown example was needed for coverage: search on without it.
                more, extra = inputs.search(
                    anonymized.code,
                    specs,
                    pool,
                    measured,
                    executor,
                    rng,
                    config,
                    shown_keys,
                    budget=config.max_candidates - tried,
                )
                pool, tried = more, tried + extra
            pool = [o for o in pool if o.key not in shown_keys]
        heldout = split.choose_heldout(
            pool, measured.statements, measured.branch_arcs, config.n_heldout, rng
        )
        if len(heldout) < config.min_heldout:
            raise _Excluded(FEW_HELDOUT, str(len(heldout)))
        figures = measured.figures(
            [line for o in heldout for line in o.lines], [arc for o in heldout for arc in o.arcs]
        )
    if (
        figures.statements < config.min_statement_coverage
        or figures.branches < config.min_branch_coverage
    ):
        raise _Excluded(
            LOW_COVERAGE, f"statements {figures.statements:.3f}, branches {figures.branches:.3f}"
        )
    code, specs = _validated(
        anonymized, [*observations, *shown, *heldout], [*shown, *heldout], check_executor, config
    )
    return Record(
        task_id=task.task_id,
        source=task.source,
        entry_point=task.entry_point,
        header=anonymized.header,
        code=code,
        anonymized_code=anonymized.code,
        original_code=task.code,
        description=task.description,
        description_origin=task.description_origin,
        arg_types=tuple(str(s) for s in specs),
        shown=tuple(Example(args=o.key, output=o.output) for o in shown),
        heldout=tuple(Example(args=o.key, output=o.output) for o in heldout),
        statement_coverage=figures.statements,
        branch_coverage=figures.branches,
        n_statements=figures.n_statements,
        n_branches=figures.n_branches,
        n_seeds=len(observations),
        n_candidates=tried,
    )
