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

Modes: `interactive` and `in_context` (the paper's two), and the baselines
`memory` (a second interactive episode informed by critiques of retrieved train
functions; `memory.py`), `ft` (in-context with a LoRA adapter fine-tuned on the
train split's in-context prompt -> gold description pairs, by the injected
`fine_tune_fn`) and `gold` (the coder's code from the gold description and the
shown examples: the upper bound of code match; `gold.py`).

Written into `run_dir`, per run name (the mode, and `<mode>+observations` for the
coder variant that sees the observed calls): `<mode>_episodes.jsonl`
(resumable), `<run>_scored.jsonl` (resumable), `metrics.json`, `report.md` and
PNG plots; `memory/` and `ft/` hold the baselines' intermediate files.

A seat (agent, judge, coder, embedder) whose endpoint still fails after its
retries stops the run with an `http.EndpointError` naming the seat; what was
written stays and a rerun with the same `run_dir` resumes. A corrupt line of a
resumable file is moved to `<file>.corrupt` with a warning and its item redone;
`metrics.json` (`corrupt_records`) and `report.md` count such lines.
"""

import dataclasses
import itertools
import json
import pathlib
import time
from collections.abc import Sequence

from pau_jax.env import jsonl, runner
from pau_jax.env.episode import EpisodeConfig
from pau_jax.evaluation import (
    gold,
    in_context,
    metrics,
    report,
    score,
    stats,
)
from pau_jax.evaluation import memory as memory_lib
from pau_jax.policy import backends, embeddings
from pau_jax.policy.backends import SELF, LocalBackendConfig, Seat
from pau_jax.tasks import DatasetConfig, DemoTasksConfig, load_tasks

MODES = ("interactive", "in_context", "memory", "ft", "gold")
# Paired comparisons written to metrics.json when both runs are present: (a, b) -> "a vs b".
PAIRED = (("interactive", "in_context"), ("memory", "interactive"), ("ft", "in_context"))
SELF_GRADED_BANNER = (
    "**Self-graded**: the judge and/or the coder is the evaluated model itself, not the "
    "paper's fixed judge and coder; these scores are not comparable with published numbers."
)


def _train_dataset(dataset, train_dataset):
    """The train split the memory and ft baselines learn from."""
    if train_dataset is not None:
        return train_dataset
    if isinstance(dataset, DatasetConfig):
        return dataclasses.replace(dataset, split="train", limit=None)
    raise ValueError(
        "the memory and ft modes need the train split of the pau dataset: evaluate a "
        "DatasetConfig, or set train_dataset=DatasetConfig(split='train', ...)"
    )


def _check_baselines(modes, *, policy, memory, fine_tune_fn, dataset, train_dataset) -> None:
    """Refuses, before anything runs, a baseline mode whose requirements are missing."""
    if "memory" in modes:
        if "interactive" not in modes or modes.index("interactive") > modes.index("memory"):
            raise ValueError(
                "the memory mode starts from the interactive run: use "
                "modes=('interactive', 'memory') (interactive first)"
            )
        if memory is None or memory.embedder is None:
            raise ValueError(
                "the memory mode needs an embedder: memory=MemoryConfig(embedder="
                "LocalEmbeddingConfig(checkpoint_dir=...) or HTTPEmbeddingConfig(...)) "
                "(gin: eval/memory.gin and --gin.EMBEDDING_CHECKPOINT=...)"
            )
    if "ft" in modes:
        if fine_tune_fn is None:
            raise ValueError(
                "the ft mode needs fine_tune_fn (gin: eval/ft.gin binds "
                "@pau_jax.sft.finetune.train_adapter)"
            )
        if not isinstance(policy, LocalBackendConfig) or policy.adapter_dir:
            raise ValueError(
                "the ft mode fine-tunes a fresh LoRA on a local checkpoint: the agent must be a "
                "LocalBackendConfig without adapter_dir"
            )
    if "memory" in modes or "ft" in modes:
        _train_dataset(dataset, train_dataset)


def evaluate(
    *,
    run_dir: str,
    policy,
    dataset=DemoTasksConfig(),
    modes: Sequence[str] = ("interactive",),
    judge=None,
    coder=None,
    episode_config: EpisodeConfig = EpisodeConfig(),
    sandbox_workers: int = 2,
    call_timeout_s: float = 2.0,
    score_timeout_s: float = 2.0,
    max_parallel_calls: int = 8,
    coder_observations: Sequence[bool] = (False,),
    attribute_failures: bool = True,
    low_code_match: float = 0.5,
    low_judge_score: int = 3,
    in_context_batch_size: int | None = None,
    score_batch_size: int = 64,
    bootstrap_seed: int = 0,
    bootstrap_resamples: int = 10_000,
    title: str = "PAU evaluation",
    memory: memory_lib.MemoryConfig | None = None,
    fine_tune_fn=None,
    train_dataset=None,
) -> dict:
    """Runs the PAU protocol and writes episodes, scores, metrics and a report into `run_dir`.

    Args:
      run_dir: output folder (a rerun with the same folder resumes).
      policy: the agent's backend (a `pau_jax.policy.backends` `*BackendConfig`).
      dataset: `DatasetConfig` (a built TFDS split) or `DemoTasksConfig`.
      modes: any of 'interactive', 'in_context', 'memory' (after 'interactive'),
        'ft' and 'gold', run in this order.
      judge: the judge's backend (required), or 'self' for the agent's own model.
      coder: the coder's backend (required), or 'self' for the agent's own model.
      episode_config: the protocol constants (budget, history window, display).
      sandbox_workers: worker processes of the sandbox.
      call_timeout_s: wall-clock limit of one sandboxed call of an episode.
      score_timeout_s: wall-clock limit of one call of the coder's function (and of
        the true function when a task has no stored held-out outputs).
      max_parallel_calls: sandbox calls in flight at once during episodes.
      coder_observations: code-match variants: False = description only, True = the
        coder also sees the shown examples and observed calls. (False, True) reports both.
      attribute_failures: classify low-scoring episodes (pre-check + judge).
      low_code_match, low_judge_score: an episode is low-scoring below either bound.
      in_context_batch_size: tasks per policy call in in-context mode (None: all).
      score_batch_size: episodes per judge/coder call (each chunk is saved).
      bootstrap_seed, bootstrap_resamples: the confidence intervals and paired tests.
      title: heading of report.md.
      memory: the memory baseline's settings (its embedder is required for 'memory').
      fine_tune_fn: for 'ft': called as `fine_tune_fn(checkpoint_dir=, out_dir=, pairs=,
        dtype=, tokenizer=)` with the train pairs of `in_context.training_pairs`; returns the folder of the
        trained PEFT adapter (gin: `@pau_jax.sft.finetune.train_adapter`).
      train_dataset: the train split for 'memory' and 'ft'; default: `dataset` with
        split 'train' and no limit.

    Returns:
      The metrics written to metrics.json.

    Raises:
      http.EndpointError: a seat's endpoint still failed after its retries (finished
        episodes and scores stay in their files; rerun with the same `run_dir`).
    """
    from pau_jax.sandbox import Executor

    modes = tuple(modes)
    bad = [m for m in modes if m not in MODES]
    if bad or not modes or len(set(modes)) != len(modes):
        raise ValueError(f"modes must be a non-empty subset of {MODES}, got {modes}")
    if not coder_observations or len(set(coder_observations)) != len(coder_observations):
        raise ValueError(
            f"coder_observations must be (False,), (True,) or both, got {coder_observations}"
        )
    _check_baselines(
        modes,
        policy=policy,
        memory=memory,
        fine_tune_fn=fine_tune_fn,
        dataset=dataset,
        train_dataset=train_dataset,
    )
    agent_modes = [m for m in modes if m != "gold"]  # the gold mode needs the coder only
    judge_backend, judge_self, judge_text = None, False, "not used (gold mode only)"
    if agent_modes:
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
    out = pathlib.Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    runs, failures, baselines = {}, {}, {}
    with Executor(workers=sandbox_workers) as executor:
        specs, references = load_tasks(dataset, executor, episode_config)
        if not specs:
            raise ValueError(f"the dataset {dataset!r} has no items to evaluate")
        print(f"[eval] {len(specs)} tasks; modes {tuple(modes)}", flush=True)
        if grading["self_graded"]:
            print("[eval] SELF-GRADED: the judge or the coder is the evaluated model", flush=True)
        seats = backends.Backends(specs)
        # Each seat under its name, so that an endpoint that fails is named by its seat.
        model = seats.build(policy) if agent_modes or coder == SELF else None
        agent = Seat("agent", model) if model is not None else None
        judge_policy = None
        if agent_modes:
            judge_policy = Seat("judge", model if judge == SELF else seats.build(judge_backend))
        coder_policy = Seat("coder", model if coder == SELF else seats.build(coder_backend))
        ids = {s.task.task_id for s in specs}
        train = None
        if "memory" in modes or "ft" in modes:
            train = load_tasks(_train_dataset(dataset, train_dataset), executor, episode_config)
            print(f"[eval] train split: {len(train[0])} tasks", flush=True)
        for mode in modes:
            episodes_path = out / f"{mode}_episodes.jsonl"
            if mode == "gold":
                records = gold.gold_records(specs, references)
                gold_path = out / "gold_scored.jsonl"
                jsonl.prepare(gold_path, required=runner.RECORD_KEYS)
                missing = gold.record_missing(records, references, gold_path)
                if missing:
                    print(f"[eval] gold: {missing} tasks have no gold description", flush=True)
                score.score_into_file(
                    [r for r in records if r["prediction"]],
                    references,
                    gold_path,
                    judge_policy=None,
                    coder_policy=coder_policy,
                    executor=executor,
                    with_observations=True,
                    judged=None,
                    attribute=False,
                    low_code_match=low_code_match,
                    low_judge_score=low_judge_score,
                    batch_size=score_batch_size,
                    timeout_s=score_timeout_s,
                )
                runs["gold"] = [r for r in runner.load_records(gold_path) if r["task_id"] in ids]
                continue
            if mode == "memory":
                first = {
                    r["task_id"]: r
                    for r in runner.load_records(out / "interactive_episodes.jsonl")
                    if r["task_id"] in ids
                }
                memory_lib.run_memory(
                    specs=specs,
                    first_records=first,
                    train_specs=train[0],
                    train_references=train[1],
                    agent=agent,
                    embedder=backends.EmbedderSeat(memory.embedder),
                    embedder_name=embeddings.describe(memory.embedder),
                    executor=executor,
                    episode_config=episode_config,
                    config=memory,
                    run_dir=out,
                    call_timeout_s=call_timeout_s,
                    max_parallel_calls=max_parallel_calls,
                )
                baselines["memory"] = {
                    "embedder": embeddings.describe(memory.embedder),
                    "top_k": memory.top_k,
                    "train_tasks": len(train[0]),
                }
            elif mode == "ft":
                pairs = in_context.training_pairs(*train)
                print(f"[eval] ft: fine-tuning on {len(pairs)} train pairs", flush=True)
                adapter = fine_tune_fn(
                    checkpoint_dir=policy.checkpoint_dir,
                    out_dir=str(out / "ft"),
                    pairs=pairs,
                    dtype=policy.dtype,
                    tokenizer=policy.tokenizer,
                )
                ft_agent = Seat(
                    "agent", seats.build(dataclasses.replace(policy, adapter_dir=str(adapter)))
                )
                in_context.run_in_context(
                    specs,
                    ft_agent,
                    out_path=episodes_path,
                    batch_size=in_context_batch_size,
                    mode="ft",
                )
                baselines["ft"] = {"adapter": str(adapter), "train_pairs": len(pairs)}
            elif mode == "interactive":
                runner.run_episodes(
                    specs,
                    # Reply objects (token counts, finish reasons) when the backend has them:
                    # a prompt over SamplingConfig.max_prompt_tokens then ends its episode.
                    getattr(agent, "complete", agent),
                    executor,
                    episode_config,
                    out_path=episodes_path,
                    call_timeout_s=call_timeout_s,
                    max_parallel_calls=max_parallel_calls,
                )
            else:
                in_context.run_in_context(
                    specs, agent, out_path=episodes_path, batch_size=in_context_batch_size
                )
            records = [r for r in runner.load_records(episodes_path) if r["task_id"] in ids]
            print(f"[eval] {mode}: {len(records)} episodes in {episodes_path.name}", flush=True)
            judged = None
            for with_obs in coder_observations:
                name = f"{mode}+observations" if with_obs else mode
                scored = score.score_into_file(
                    records,
                    references,
                    out / f"{name}_scored.jsonl",
                    judge_policy=judge_policy,
                    coder_policy=coder_policy,
                    executor=executor,
                    with_observations=with_obs,
                    judged=judged,
                    attribute=attribute_failures,
                    low_code_match=low_code_match,
                    low_judge_score=low_judge_score,
                    batch_size=score_batch_size,
                    timeout_s=score_timeout_s,
                )
                judged = judged or {r["task_id"]: r for r in scored}
                runs[name] = scored
    # Requests that failed after their retries (each stopped its run: 0 in a finished run).
    for name, seat in (("policy", agent), ("judge", judge_policy), ("coder", coder_policy)):
        if hasattr(getattr(seat, "policy", None), "failures"):
            failures[name] = len(seat.policy.failures)
    corrupt = jsonl.corrupt_counts(out)

    seed, n_boot = bootstrap_seed, bootstrap_resamples
    summaries = {name: metrics.summarize(records) for name, records in runs.items()}
    intervals = {}
    for name, records in runs.items():
        matches = [r["code_match"] for r in records if r.get("code_match") is not None]
        judged_scores = [r["judge_score"] for r in records if r.get("judge_score") is not None]
        ivs = {"code_match": stats.bootstrap_interval(matches, seed, n_boot)}
        ivs["judge"] = stats.bootstrap_interval(judged_scores, seed, n_boot)
        intervals[name] = {k: v for k, v in ivs.items() if v is not None}
    comparisons, ensembles = {}, {}
    for (first, second), suffix in itertools.product(PAIRED, ("", "+observations")):
        a, b = runs.get(first + suffix), runs.get(second + suffix)
        if a is None or b is None:
            continue
        by_a = {r["task_id"]: r for r in a}
        by_b = {r["task_id"]: r for r in b}
        pair = {
            key: stats.paired_comparison(by_a, by_b, key, seed, n_boot)
            for key in ("code_match", "judge_score")
        }
        comparisons[f"{first}{suffix} vs {second}{suffix}"] = {
            k: v for k, v in pair.items() if v is not None
        }
    for suffix in ("", "+observations"):
        a, b = runs.get("interactive" + suffix), runs.get("in_context" + suffix)
        if a is None or b is None:
            continue
        by_a = {r["task_id"]: r for r in a}
        by_b = {r["task_id"]: r for r in b}
        best = stats.max_ensemble(
            {
                "interactive": {t: r["code_match"] for t, r in by_a.items()},
                "in_context": {t: r["code_match"] for t, r in by_b.items() if t in by_a},
            }
        )
        ensembles[f"max(interactive{suffix}, in_context{suffix})"] = {
            "code_match_mean": sum(best.values()) / len(best),
            "n": len(best),
        }
    gold_summary = metrics.gold_shares(summaries)
    result = {
        "grading": grading,
        "agent": backends.describe(policy),
        "modes": list(modes),
        "tasks": len(specs),
        "runs": summaries,
        "intervals": intervals,
        "comparisons": comparisons,
        "max_ensemble": ensembles,
        "gold": gold_summary,
        "baselines": baselines,
        "backend_failures": failures,
        "corrupt_records": corrupt,
        "bootstrap": {"seed": seed, "resamples": n_boot},
        "episode_config": dataclasses.asdict(episode_config),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    (out / "metrics.json").write_text(json.dumps(result, indent=2) + "\n")
    notes = [f"{len(specs)} tasks; call budget {episode_config.call_budget}"]
    notes += [f"judge: {grading['judge']}; coder: {grading['coder']}"]
    notes += [f"{k}: code match mean {v['code_match_mean']:.3f}" for k, v in ensembles.items()]
    if "gold" in runs and not gold_summary:
        notes += ["gold: no task has a gold description to write code from"]
    if gold_summary:
        shares = ", ".join(
            f"{name} {share:.0%}" for name, share in gold_summary["share_of_gold"].items()
        )
        notes += [
            f"gold (code from the gold description and the shown examples; the upper bound of "
            f"code match with this coder): {gold_summary['code_match_mean']:.3f}"
            + (f"; each run's code match as a share of it: {shares}" if shares else "")
        ]
    notes += [f"{seat} backend: {n} failed requests" for seat, n in failures.items() if n]
    notes += [
        f"{name}: {n} corrupt line{'s' if n != 1 else ''} moved to {name}{jsonl.SIDECAR_SUFFIX} "
        "(their items were run again)"
        for name, n in corrupt.items()
    ]
    path = report.write_report(
        out,
        runs,
        title=title,
        notes=notes,
        intervals=intervals,
        comparisons=comparisons,
        banner=SELF_GRADED_BANNER if grading["self_graded"] else "",
    )
    for name, s in summaries.items():
        j, c = s["judge"], s["code_match"]
        judge_text = f"{j['mean']:.2f}" if j["mean"] is not None else "n/a"
        code_text = f"{c['mean']:.3f}" if c["mean"] is not None else "n/a"
        print(
            f"[eval] {name}: episodes={s['episodes']} code_match={code_text} "
            f"judge={judge_text} (unparsed {j['unparsed']}) calls={s['calls']['mean']:.1f}",
            flush=True,
        )
    print(f"[eval] metrics: {out / 'metrics.json'}; report: {path}", flush=True)
    return result
