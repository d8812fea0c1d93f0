"""The eval run mode: episodes (interactive and/or in-context), scoring, failure modes, metrics, report.

`evaluate` is the function gin binds as `pau_jax.experiment.evaluate`. Every
choice is a keyword argument; the dataset and the three model seats (agent,
judge, coder) are small frozen configs chosen by gin reference:

    pau_jax.experiment.evaluate.dataset = @pau_jax.tasks.DatasetConfig()
    pau_jax.experiment.evaluate.policy = @policy/pau_jax.policy.backends.HTTPBackendConfig()
    pau_jax.experiment.evaluate.judge = @judge/pau_jax.policy.backends.LocalBackendConfig()

The judge and the coder must be given: the paper grades every model with the
same fixed judge and coder, so a model must not grade itself unless that is
asked for explicitly with `judge='self'` / `coder='self'`; such a run is marked
"self-graded" at the top of `report.md` and in `metrics.json` (`grading`). A
seat that is the agent's own checkpoint or endpoint counts as self-graded too.

Modes (one module each under `modes/`, named in `modes.REGISTRY`): `interactive`
and `in_context` (the paper's two), and the baselines `memory` (a second
interactive episode informed by critiques of retrieved train functions;
`memory_baseline.py`), `ft` (in-context with a LoRA adapter fine-tuned on the train
split's in-context prompt -> gold description pairs, by the trainer injected
as `baselines['ft']`) and `gold` (the coder's code from the gold description and the
shown examples: the upper bound of code match; `gold.py`). Their statistics are
`stats.summarize_runs`.

Written into `run_dir`, per run name (the mode, and `<mode>+observations` for the
coder variant that sees the observed calls): `<mode>_episodes.jsonl`
(resumable), `<run>_scored.jsonl` (resumable), `metrics.json`, `report.md` and
PNG plots; `memory/` and `ft/` hold the baselines' intermediate files.

The run holds `run_dir` while it runs (`run_claim`): a second process writing
into it stops with one line naming the holder, and a rerun whose settings differ
from those the folder's results came from (`fingerprint.json`: agent, judge,
coder, dataset, modes, protocol, scoring, prompt versions) stops with one line
naming each field that differs, instead of resuming them as its own.

A seat (agent, judge, coder, embedder) whose endpoint still fails after its
retries stops the run with an `http.EndpointError` naming the seat; what was
written stays and a rerun with the same `run_dir` resumes. A corrupt line of a
resumable file is moved to `<file>.corrupt` with a warning and its item redone;
`metrics.json` (`corrupt_records`) and `report.md` count such lines.
"""

import pathlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pau_jax import run_claim
from pau_jax.env import (
    prompts,
    runner,  # noqa: F401 (kept as `pipeline.runner` for callers)
)
from pau_jax.env.episode import EpisodeConfig
from pau_jax.evaluation import (
    code_match,
    failure_modes,
    run_outputs,
    score,  # noqa: F401 (kept as `pipeline.score` for callers)
)
from pau_jax.evaluation.judge import JUDGE_PROMPT_VERSION
from pau_jax.evaluation.modes import REGISTRY, Context, Options
from pau_jax.evaluation.modes.context import train_dataset as _train_dataset
from pau_jax.evaluation.score import ScoringConfig
from pau_jax.policy import backends
from pau_jax.policy.backends import SELF, Seat
from pau_jax.tasks import DemoTasksConfig, load_tasks

MODES = tuple(REGISTRY)


def _check_arguments(modes: tuple[str, ...], options: Options) -> None:
    """Refuses, before anything runs, unknown or repeated modes, bad coder variants and a
    mode's missing requirements."""
    unknown = [m for m in modes if m not in REGISTRY]
    if unknown or not modes or len(set(modes)) != len(modes):
        what = f"unknown mode {unknown[0]!r}: " if unknown else ""
        raise ValueError(f"{what}modes must be a non-empty subset of {MODES}, got {modes}")
    if not isinstance(options.scoring, ScoringConfig):
        raise TypeError(f"scoring must be a ScoringConfig, got {type(options.scoring).__name__}")
    if options.batch_size is not None and options.batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 or None, got {options.batch_size}")
    strays = sorted(set(options.baselines) - set(REGISTRY))
    if strays:
        raise ValueError(f"baselines are keyed by mode name ({MODES}); unknown: {strays}")
    for name, mode in REGISTRY.items():
        if name in modes and mode.check is not None:
            mode.check(modes, options)
    if any(REGISTRY[m].needs_train for m in modes):
        _train_dataset(options)


def _grading(modes, policy, judge, coder):
    """(judge backend, coder backend, the `grading` entry of metrics.json)."""
    judge_backend, judge_self, judge_text = None, False, "not used (gold mode only)"
    if any(REGISTRY[m].needs_agent for m in modes):
        judge_backend, judge_self = backends.resolve_seat("judge", judge, policy)
        judge_text = (
            "self (the evaluated model)" if judge_self else backends.describe(judge_backend)
        )
    coder_backend, coder_self = backends.resolve_seat("coder", coder, policy)
    grading = {
        "judge": judge_text,
        "coder": "self (the evaluated model)" if coder_self else backends.describe(coder_backend),
        "self_graded": judge_self or coder_self,
    }
    return judge_backend, coder_backend, grading


def _fingerprint(modes, options: Options, judge, coder) -> dict:
    """What produces an evaluation's records: the settings its run directory is claimed with.

    Left out, as they may change when a run resumes: the wall-clock limits of a call
    (`call_timeout_s`, `ScoringConfig.timeout_s`: they depend on the machine), the batching
    and parallelism (`max_parallel_calls`, `batch_size`, `ScoringConfig.batch_size`,
    `sandbox_workers`) and what every run computes afresh from the records
    (`ScoringConfig.bootstrap_*`, `title`); and the fields of
    `run_claim.RESUMABLE_FIELDS`. The agent counts only when a mode runs it or it is the
    coder, the judge only when a mode runs the agent, the train split only when a mode
    learns from it. Modes and coder variants are sets: their order changes no record.
    """
    uses_agent = any(REGISTRY[m].needs_agent for m in modes)
    return {
        "agent": options.policy if uses_agent or coder == SELF else None,
        "judge": judge if uses_agent else None,
        "coder": coder,
        "dataset": options.dataset,
        "train_dataset": (
            _train_dataset(options) if any(REGISTRY[m].needs_train for m in modes) else None
        ),
        "modes": sorted(modes),
        "episode_config": options.episode_config,
        "coder_observations": sorted(options.scoring.coder_observations),
        "attribute_failures": options.scoring.attribute_failures,
        "low_code_match": options.scoring.low_code_match,
        "low_judge_score": options.scoring.low_judge_score,
        "memory": options.baselines.get("memory"),
        "fine_tune_fn": options.baselines.get("ft"),
        "prompt_versions": {
            "episode": prompts.PROMPT_VERSION,
            "multi_turn": prompts.MULTI_TURN_PROMPT_VERSION,
            "judge": JUDGE_PROMPT_VERSION,
            "coder": code_match.CODER_PROMPT_VERSION,
            "failure_modes": failure_modes.FAILURE_PROMPT_VERSION,
        },
    }


def _run_modes(
    options, modes, *, judge, coder, judge_backend, coder_backend, self_graded, sandbox_workers
):
    """Loads the tasks, builds the seats and runs each mode in order.

    Returns:
      (tasks evaluated, run name -> scored records, mode -> baseline entry,
       seat -> requests that failed after their retries).
    """
    from pau_jax.sandbox import Executor

    uses_agent = any(REGISTRY[m].needs_agent for m in modes)
    runs, baselines = {}, {}
    with Executor(workers=sandbox_workers) as executor:
        specs, references = load_tasks(options.dataset, executor, options.episode_config)
        if not specs:
            raise ValueError(f"the dataset {options.dataset!r} has no items to evaluate")
        print(f"[eval] {len(specs)} tasks; modes {modes}", flush=True)
        if self_graded:
            print("[eval] SELF-GRADED: the judge or the coder is the evaluated model", flush=True)
        seats = backends.Backends(specs)
        # Each seat under its name, so that an endpoint that fails is named by its seat.
        model = seats.build(options.policy) if uses_agent or coder == SELF else None
        agent = Seat("agent", model) if model is not None else None
        judge_seat = None
        if uses_agent:
            judge_seat = Seat("judge", model if judge == SELF else seats.build(judge_backend))
        coder_seat = Seat("coder", model if coder == SELF else seats.build(coder_backend))
        train = None
        if any(REGISTRY[m].needs_train for m in modes):
            train = load_tasks(_train_dataset(options), executor, options.episode_config)
            print(f"[eval] train split: {len(train[0])} tasks", flush=True)
        context = Context(
            options=options,
            specs=specs,
            references=references,
            ids=frozenset(s.task.task_id for s in specs),
            executor=executor,
            seats=seats,
            agent=agent,
            judge=judge_seat,
            coder=coder_seat,
            train=train,
        )
        for name in modes:
            produced = REGISTRY[name].run(context)
            runs.update(produced.runs)
            if produced.baseline is not None:
                baselines[name] = produced.baseline
    # Requests that failed after their retries (each stopped its run: 0 in a finished run).
    failures = {}
    for name, seat in (("policy", agent), ("judge", judge_seat), ("coder", coder_seat)):
        if hasattr(getattr(seat, "policy", None), "failures"):
            failures[name] = len(seat.policy.failures)
    return len(specs), runs, baselines, failures


def evaluate(
    *,
    run_dir: str,
    policy,
    dataset=DemoTasksConfig(),
    modes: Sequence[str] = ("interactive",),
    judge=None,
    coder=None,
    episode_config: EpisodeConfig = EpisodeConfig(),
    scoring: ScoringConfig = ScoringConfig(),
    baselines: Mapping[str, Any] | None = None,
    train_dataset=None,
    sandbox_workers: int = 2,
    call_timeout_s: float = 2.0,
    max_parallel_calls: int = 8,
    batch_size: int | None = None,
    title: str = "PAU evaluation",
) -> dict:
    """Runs the PAU protocol and writes episodes, scores, metrics and a report into `run_dir`.

    Args:
      run_dir: output folder (a rerun with the same folder and settings resumes; see
        `run_claim`).
      policy: the agent's backend (a `pau_jax.policy.backends` `*BackendConfig`).
      dataset: `DatasetConfig` (a built TFDS split) or `DemoTasksConfig`.
      modes: names in `modes.REGISTRY`: any of 'interactive', 'in_context', 'memory'
        (after 'interactive'), 'ft' and 'gold', run in this order.
      judge: the judge's backend (required), or 'self' for the agent's own model.
      coder: the coder's backend (required), or 'self' for the agent's own model.
      episode_config: the protocol constants (budget, history window, display).
      scoring: how runs are scored: code-match variants, the coder's call limit, failure
        attribution, the bootstrap (`score.ScoringConfig`; gin:
        `pau_jax.evaluation.score.ScoringConfig.*`).
      baselines: mode name -> that baseline's settings: 'memory' -> `MemoryConfig` (its
        embedder is required), 'ft' -> the adapter trainer, called as
        `fn(checkpoint_dir=, out_dir=, pairs=, dtype=, tokenizer=)` with the train pairs of
        `in_context.training_pairs`, returning the trained PEFT adapter's folder (gin:
        `@pau_jax.sft.finetune.train_adapter`).
      train_dataset: the train split for 'memory' and 'ft'; default: `dataset` with
        split 'train' and no limit.
      sandbox_workers: worker processes of the sandbox.
      call_timeout_s: wall-clock limit of one sandboxed call of an episode.
      max_parallel_calls: sandbox calls in flight at once during episodes.
      batch_size: at most this many episodes (interactive: episodes in flight, the next
        starting as one ends) or tasks (in-context) in one policy call; None: all at once.
        Bounds a call's memory on a long task list.
      title: heading of report.md.

    Returns:
      The metrics written to metrics.json.

    Raises:
      http.EndpointError: a seat's endpoint still failed after its retries (finished
        episodes and scores stay in their files; rerun with the same `run_dir`).
      run_claim.RunDirError: another process is writing `run_dir`, or it holds the
        results of other settings.
    """
    modes = tuple(modes)
    options = Options(
        out=pathlib.Path(run_dir),
        policy=policy,
        dataset=dataset,
        train_dataset=train_dataset,
        episode_config=episode_config,
        call_timeout_s=call_timeout_s,
        max_parallel_calls=max_parallel_calls,
        scoring=scoring,
        batch_size=batch_size,
        baselines=dict(baselines or {}),
    )
    _check_arguments(modes, options)
    judge_backend, coder_backend, grading = _grading(modes, policy, judge, coder)
    settings = _fingerprint(modes, options, judge, coder)
    # The folder is held until the report is written; a refusal leaves it as it was.
    with run_claim.claim(options.out, kind="eval", settings=settings) as out:
        t0 = time.perf_counter()
        n_tasks, runs, baselines_run, failures = _run_modes(
            options,
            modes,
            judge=judge,
            coder=coder,
            judge_backend=judge_backend,
            coder_backend=coder_backend,
            self_graded=grading["self_graded"],
            sandbox_workers=sandbox_workers,
        )
        result = run_outputs.metrics_json(
            out,
            runs,
            modes=modes,
            tasks=n_tasks,
            grading=grading,
            options=options,
            baselines=baselines_run,
            failures=failures,
        )
        result["seconds"] = round(time.perf_counter() - t0, 2)
        run_outputs.write_outputs(out, runs, result, title=title, episode_config=episode_config)
    return result
