"""The quickstart run mode: data -> checkpoint -> evaluate -> AAC -> evaluate -> report.

`quickstart` (gin: `pau_jax.experiment.quickstart`) is the main job on an embedded default:
it builds `pau/debug`, writes a random Qwen3 with the real tokenizer (or uses a real
checkpoint), evaluates it, trains its adapters with AAC, evaluates again and writes a
before/after report. Each stage is one call into the layers below; nothing is computed here.
"""

import contextlib
import dataclasses
import functools
import json
import pathlib
import time

from pau_jax.policy.config import SamplingConfig


def _scored(eval_dir: pathlib.Path, mode: str) -> list[dict]:
    from pau_jax.env import runner

    return runner.load_records(eval_dir / f"{mode}_scored.jsonl")


def quickstart(
    *,
    run_dir: str,
    model_config=None,
    checkpoint: str | None = None,
    train_fn=None,
    evaluate_fn=None,
    actor=None,
    eval_data=None,
    train_data=None,
    modes: tuple[str, ...] = ("interactive", "in_context"),
    seed: int = 0,
    dtype: str = "float32",
    agent_sampling: SamplingConfig = SamplingConfig(max_new_tokens=32),
    judge_sampling: SamplingConfig = SamplingConfig(max_new_tokens=32),
    scoring=None,
    graders=None,
) -> dict:
    """The main job end to end: data → checkpoint → evaluate → AAC → evaluate → report.

    Builds the datasets, writes a random Qwen3 with the real offline tokenizer (or takes a
    real `checkpoint`), evaluates it (`run_dir/eval_before`; judge and coder are `graders`, or
    the same base checkpoint: self-graded, labelled so in every report), trains its LoRA adapters
    with AAC, the frozen base as critic (`run_dir/train`), evaluates base + adapter the
    same way (`run_dir/eval_after`) and writes `run_dir/report.md` (before vs after,
    paired tests) and `summary.json`.

    A rerun with the same `run_dir` resumes every stage.

    Args:
      run_dir: the run directory.
      model_config, checkpoint: exactly one: a `Qwen3Config` of a random model, or a Hugging
        Face checkpoint directory (gin: a path, or a `pau_jax.tools.fetch` function).
      train_fn, evaluate_fn: called with keyword arguments (`run_dir`, `actor`, `seed`,
        `dataset`; `run_dir`, `policy`, `judge`, `coder`, `dataset`, `modes`, `scoring`,
        `title`); gin binds the configured `pau_jax.experiment.train` and `.evaluate`.
        Defaults `rl.loop.train` and `evaluation.pipeline.evaluate`.
      actor: the adapters' settings (`training.run.ActorConfig`; its checkpoint and dtype
        are this run's); its `decode_weights` is also the evaluated agent's.
      eval_data, train_data: `tasks.DatasetConfig`s of what is evaluated and what AAC
        trains on (default: `pau/debug` test and train under ~/tensorflow_datasets); each
        is built first where `build_if_missing` (a config other than 'debug' from its
        `manual_dir`).
      modes: evaluation modes ('interactive', 'in_context').
      seed: seeds the random model, training and the bootstrap.
      dtype: parameter dtype of every local model.
      agent_sampling, judge_sampling: how the evaluated agent, and the judge and coder,
        sample (greedy by default).
      scoring: how both evaluations score and compare (`evaluation.score.ScoringConfig`,
        default with 2,000 bootstrap resamples); its bootstrap seed is `seed`.
      graders: the judge's and the coder's backend in both evaluations (a
        `policy.backends` config, e.g. a larger checkpoint); None: the base checkpoint
        grades its own agent (self-graded).

    Returns:
      The summary written to `run_dir/summary.json`.
    """
    from pau_jax.evaluation import pipeline
    from pau_jax.evaluation.score import ScoringConfig
    from pau_jax.rl import loop
    from pau_jax.tasks import DatasetConfig

    out = pathlib.Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    started, seconds = time.perf_counter(), {}
    eval_data = eval_data or DatasetConfig(config="debug", split="test", build_if_missing=True)
    train_data = train_data or DatasetConfig(config="debug", split="train", build_if_missing=True)
    with _stage(seconds, "setup", 1, f"dataset pau/{eval_data.config} under {eval_data.data_dir}"):
        model = _set_up(out, checkpoint, model_config, seed, (eval_data, train_data))
    scoring = dataclasses.replace(
        scoring or ScoringConfig(bootstrap_resamples=2000), bootstrap_seed=seed
    )
    actor = _actor(actor, model.checkpoint, dtype)
    run_eval = functools.partial(
        _evaluate,
        evaluate_fn or pipeline.evaluate,
        out,
        actor,
        dataset=eval_data,
        modes=tuple(modes),
        samplings=(agent_sampling, judge_sampling),
        scoring=scoring,
        graders=graders,
    )
    with _stage(seconds, "eval_before", 2, "evaluate the base model (before training)"):
        before = run_eval("eval_before", None, "PAU evaluation before AAC")
    text = f"AAC training on pau/{train_data.config} {train_data.split} (frozen base as critic)"
    with _stage(seconds, "train", 3, text):
        trained = (train_fn or loop.train)(
            run_dir=str(out / "train"), actor=actor, seed=seed, dataset=train_data
        )
    adapter = out / "train" / "adapter"
    with _stage(seconds, "eval_after", 4, f"evaluate the base model + trained adapter {adapter}"):
        after = run_eval("eval_after", str(adapter), "PAU evaluation after AAC")
    with _stage(seconds, "report", 5, "report: before vs after"):
        results = (before, after, trained)
        comparisons, history, path = _report(out, model, results, modes, scoring, eval_data)
    seconds["total"] = time.perf_counter() - started
    summary = _summary(model, before, after, trained, comparisons, history, modes)
    summary |= {"paths": _paths(out, model, adapter, path), "seconds": _rounded(seconds)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    _print_summary(summary, model, modes, adapter, path)
    return summary


@dataclasses.dataclass(frozen=True)
class _Model:
    """The quickstart's base model: its checkpoint directory and how reports describe it."""

    checkpoint: pathlib.Path
    text: str
    real: bool


@contextlib.contextmanager
def _stage(seconds: dict, key: str, n: int, text: str):
    """Prints the quickstart's stage `n` of 5 and records its duration as `seconds[key]`."""
    print(f"\n[quickstart] {n}/5 {text}", flush=True)
    t = time.perf_counter()
    yield
    seconds[key] = time.perf_counter() - t


def _set_up(out, checkpoint, model_config, seed, datasets) -> _Model:
    """Builds the datasets unless they are there; the given checkpoint or a random Qwen3."""
    from pau_jax.tasks import pau_dataset
    from pau_jax.training import artefacts

    if (checkpoint is None) == (model_config is None):
        raise ValueError(
            "quickstart needs exactly one of model_config= (a random model) and checkpoint= "
            "(a Hugging Face directory)"
        )
    for dataset in (d for d in datasets if d.build_if_missing):
        pau_dataset.ensure_built(
            dataset.data_dir, config=dataset.config, manual_dir=dataset.manual_dir
        )
    if checkpoint is not None:
        checkpoint = pathlib.Path(checkpoint).expanduser()
        if not (checkpoint / "config.json").is_file():
            raise FileNotFoundError(
                f"{checkpoint} has no config.json; pass a Hugging Face directory"
            )
        hf_config = json.loads((checkpoint / "config.json").read_text())
        text = (
            f"{hf_config.get('model_type', '?')} checkpoint {checkpoint.name} "
            f"({hf_config.get('num_hidden_layers', '?')} layers, hidden "
            f"{hf_config.get('hidden_size', '?')})"
        )
        print(f"[quickstart] real checkpoint: {checkpoint}", flush=True)
        return _Model(checkpoint, text, real=True)
    # Written under a temporary name and renamed; a half-written one is rebuilt.
    checkpoint = artefacts.random_base_model(
        out / "checkpoint", model_config, seed=seed, tag="quickstart"
    )
    text = (
        f"random {model_config.num_hidden_layers}-layer Qwen3 (hidden "
        f"{model_config.hidden_size}) over the real Qwen3 vocabulary: scores measure the "
        "pipeline, not a model"
    )
    print(f"[quickstart] random Qwen3 checkpoint (real Qwen3 tokenizer): {checkpoint}", flush=True)
    return _Model(checkpoint, text, real=False)


def _evaluate(
    evaluate_fn,
    out,
    actor,
    name: str,
    adapter: str | None,
    title: str,
    *,
    dataset,
    modes,
    samplings,
    scoring,
    graders,
) -> dict:
    """One evaluation into `out/name`: the agent (base + `adapter`, decoding as the actor
    does) graded by `graders`, or by the base model when None."""
    from pau_jax.policy import backends

    agent_sampling, judge_sampling = samplings
    checkpoint, dtype = str(actor.checkpoint), actor.dtype
    if graders is None:
        graders = backends.LocalBackendConfig(
            checkpoint_dir=checkpoint,
            sampling=judge_sampling,
            dtype=dtype,
            decode_weights=actor.decode_weights,
        )
    agent = backends.LocalBackendConfig(
        checkpoint_dir=checkpoint,
        sampling=agent_sampling,
        adapter_dir=adapter,
        dtype=dtype,
        decode_weights=actor.decode_weights,
    )
    return evaluate_fn(
        run_dir=str(out / name),
        policy=agent,
        judge=graders,
        coder=graders,
        dataset=dataset,
        modes=modes,
        scoring=scoring,
        title=title,
    )


def _actor(actor, checkpoint: pathlib.Path, dtype: str):
    """The trained actor's settings (default `ActorConfig()`) on this run's base and dtype."""
    from pau_jax.training.run import ActorConfig

    return dataclasses.replace(actor or ActorConfig(), checkpoint=str(checkpoint), dtype=dtype)


def _report(out, model, results, modes, scoring, eval_data):
    """Writes `out/report.md`; returns (paired comparisons, training history, report path)."""
    from pau_jax.evaluation import report, run_outputs, stats

    before, after, trained = results
    data_text = f"pau/{eval_data.config} {eval_data.split}"

    runs, intervals, comparisons = {}, {}, {}
    for mode in modes:
        scored = {name: _scored(out / f"eval_{name}", mode) for name in ("before", "after")}
        for name, result in (("before", before), ("after", after)):
            runs[f"{name}/{mode}"] = scored[name]
            intervals[f"{name}/{mode}"] = result["intervals"][mode]
        comparisons[f"after/{mode} vs before/{mode}"] = stats.compare_runs(
            scored["after"],
            scored["before"],
            seed=scoring.bootstrap_seed,
            resamples=scoring.bootstrap_resamples,
        )
    history = []
    metrics_path = out / "train" / "metrics.jsonl"
    if metrics_path.exists():
        history = [json.loads(line) for line in metrics_path.read_text().splitlines() if line]
    grading = before["grading"]
    graders = (
        "the base checkpoint"
        if grading["self_graded"]
        else f"{grading['judge']} (judge), {grading['coder']} (coder)"
    )
    notes = [
        model.text,
        f"{before['tasks']} tasks of {data_text}; judge and coder: {graders} in both "
        "evaluations; 'after' adds the AAC LoRA adapter to the agent only",
    ]
    if trained.get("credit"):
        notes.append(f"AAC credit rule: {trained['credit']}")
    path = report.write_report(
        out,
        runs,
        title="pau_jax quickstart: before vs after AAC",
        notes=notes,
        intervals=intervals,
        comparisons=comparisons,
        training=history,
        banner=run_outputs.SELF_GRADED_BANNER if grading["self_graded"] else "",
    )
    return comparisons, history, path


def _paths(out: pathlib.Path, model: _Model, adapter: pathlib.Path, report: pathlib.Path) -> dict:
    return {
        "checkpoint": str(model.checkpoint),
        "adapter": str(adapter),
        "metrics": str(out / "train" / "metrics.jsonl"),
        "report": str(report),
    }


def _rounded(seconds: dict) -> dict:
    return {k: round(v, 1) for k, v in seconds.items()}


def _headline(result: dict, modes) -> dict:
    """Per mode: mean code match, judge score, unparsed ratings and calls of an evaluation."""
    out = {}
    for mode in modes:
        s = result["runs"][mode]
        out[mode] = {
            "code_match": s["code_match"]["mean"],
            "judge": s["judge"]["mean"],
            "judge_unparsed": s["judge"]["unparsed"],
            "calls": s["calls"]["mean"],
        }
    return out


def _summary(model, before, after, trained, comparisons, history, modes) -> dict:
    """The quickstart's summary without its paths and seconds."""
    return {
        "model": model.text,
        "self_graded": bool(before["grading"]["self_graded"]),
        "structured_decoding": before.get("structured_decoding", "off"),
        "tasks": before["tasks"],
        "before": _headline(before, modes),
        "after": _headline(after, modes),
        "comparisons": comparisons,
        "train": {  # From metrics.jsonl, so that a resumed run reports its last step too.
            "steps": trained["steps"],
            "credit": trained.get("credit"),
            "loss": history[-1].get("train/loss") if history else None,
            "reward_mean": history[-1].get("rollout/reward_mean") if history else None,
        },
    }


def _print_summary(summary: dict, model: _Model, modes, adapter, path) -> None:
    if model.real:
        graded = "self-graded" if summary["self_graded"] else "graded by another model"
        print(f"\n[quickstart] summary ({model.text}; {graded})")
    else:
        print("\n[quickstart] summary (random weights: the numbers show the pipeline works)")
    for mode in modes:
        b, a = summary["before"][mode], summary["after"][mode]
        print(
            f"  {mode:12s} code match {b['code_match']:.3f} -> {a['code_match']:.3f}   "
            f"judge {_num(b['judge'])} -> {_num(a['judge'])}"
        )
    train = summary["train"]
    print(
        f"  AAC: {train['steps']} steps, last loss {_num(train['loss'], 4)}, "
        f"reward mean {_num(train['reward_mean'], 3)}"
    )
    print(f"  adapter: {adapter}\n  seconds: {summary['seconds']}")
    print(f"[quickstart] report: {path}", flush=True)


def _num(x, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"
