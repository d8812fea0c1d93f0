"""Scores finished episodes: judge rating and code match, added to each episode record.

`score_into_file` appends the scored records to a resumable `jsonl` file chunk
by chunk. A judge or coder that raises (e.g. `http.EndpointError`) stops the
scoring: the chunk being scored is not written, and a rerun scores it again.
"""

import contextlib
import dataclasses
import pathlib
import time
from collections.abc import Sequence

from pau_jax.env import jsonl, runner
from pau_jax.evaluation import code_match, failure_modes, judge
from pau_jax.tasks.reference import TaskReference

# The fields of an episode record that its scores are computed from.
SCORED_FROM = ("prediction", "observations", "prior_observations")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScoringConfig:
    """How an evaluation scores its runs and the statistics over the scores.

    Attributes:
      coder_observations: code-match variants: False = description only, True = the coder
        also sees the shown examples and observed calls; (False, True) reports both.
      timeout_s: wall-clock limit of one call of the coder's function (and of the true
        function when a task has no stored held-out outputs).
      batch_size: episodes per judge/coder call (each chunk is saved).
      attribute_failures: classify low-scoring episodes (pre-check + judge).
      low_code_match, low_judge_score: an episode is low-scoring below either bound.
      bootstrap_seed, bootstrap_resamples: the confidence intervals and paired tests.
    """

    coder_observations: tuple[bool, ...] = (False,)
    timeout_s: float = 2.0
    batch_size: int = 64
    attribute_failures: bool = True
    low_code_match: float = 0.5
    low_judge_score: int = 3
    bootstrap_seed: int = 0
    bootstrap_resamples: int = 10_000

    def __post_init__(self):
        variants = tuple(self.coder_observations or ())
        object.__setattr__(self, "coder_observations", variants)
        if not variants or len(set(variants)) != len(variants):
            raise ValueError(
                f"ScoringConfig.coder_observations must be (False,), (True,) or both, got "
                f"{variants}"
            )
        if not self.timeout_s > 0:
            raise ValueError(f"ScoringConfig.timeout_s must be > 0, got {self.timeout_s}")
        for name in ("batch_size", "bootstrap_resamples"):
            if getattr(self, name) < 1:
                raise ValueError(f"ScoringConfig.{name} must be >= 1, got {getattr(self, name)}")


@contextlib.contextmanager
def _progress(what: str):
    """One line when a grader stage starts and one with its seconds when it ends."""
    print(f"[eval] {what} ...", flush=True)
    started = time.perf_counter()
    yield
    print(f"[eval] {what}: done in {time.perf_counter() - started:.1f} s", flush=True)


def score_episodes(
    records: Sequence[dict],
    references: dict[str, TaskReference],
    *,
    judge_policy=None,
    coder_policy,
    executor,
    with_observations: bool = False,
    timeout_s: float = 2.0,
) -> list[dict]:
    """Returns copies of `records` with judge and code-match fields added.

    Added fields: `judge_score`, `judge_raw`, `judge_skipped`, `code_match` (None
    when no held-out input could be compared), `code_runnable`,
    `code_match_incomparable` (held-out inputs whose true result could not be
    obtained), `predicted_code`.

    The judge and the coder are each called once for all records (batched).
    Tasks with an empty gold description get `judge_score = None` and
    `judge_skipped = True` (nothing to compare with); the code match still runs.
    A reference's non-empty `source` and `description_origin` are copied into the record.

    Args:
      judge_policy: the judge; None skips judging (every record `judge_skipped`).
      with_observations: give the coder the shown examples and the episode's
        observed calls too (the "description + examples" variant; an episode
        started from an earlier one adds that one's calls first).
    """
    missing = [r["task_id"] for r in records if r["task_id"] not in references]
    if missing:
        raise ValueError(f"no reference for tasks {missing[:5]}; pass references for every record")
    to_judge = [
        r for r in records if judge_policy is not None and references[r["task_id"]].description
    ]
    verdicts = []
    if to_judge:
        with _progress(f"judge: {len(to_judge)} descriptions"):
            pairs = [(references[r["task_id"]].description, r["prediction"]) for r in to_judge]
            verdicts = judge.judge(judge_policy, pairs)
    by_id = {r["task_id"]: v for r, v in zip(to_judge, verdicts, strict=True)}
    coder_prompts = []
    for r in records:
        ref = references[r["task_id"]]
        observed = list(r.get("prior_observations", ())) + list(r["observations"])
        shown = (
            list(ref.examples) + [f"{o['call']} -> {o['result']}" for o in observed]
            if with_observations
            else []
        )
        coder_prompts.append(code_match.coder_messages(ref.header, r["prediction"], shown))
    codes = []
    if records:
        with _progress(f"coder: {len(records)} descriptions to code"):
            codes = code_match.write_code(coder_policy, coder_prompts)
    out = []
    for r, code in zip(records, codes, strict=True):
        ref = references[r["task_id"]]
        match = code_match.score_code(
            executor,
            ref.code,
            code,
            ref.held_out,
            timeout_s=timeout_s,
            expected_outputs=ref.held_out_outputs,
        )
        verdict = by_id.get(r["task_id"])
        extra = {"source": ref.source} if ref.source else {}
        if ref.description_origin:
            extra["description_origin"] = ref.description_origin
        out.append(
            dict(
                r,
                **extra,
                judge_score=verdict.score if verdict else None,
                judge_raw=verdict.raw if verdict else "",
                judge_skipped=verdict is None,
                code_match=match.score,
                code_runnable=match.runnable,
                code_match_incomparable=match.incomparable,
                predicted_code=code,
            )
        )
    return out


def score_into_file(
    records,
    references,
    path: pathlib.Path,
    *,
    judge_policy,
    coder_policy,
    executor,
    with_observations: bool,
    judged: dict | None,
    attribute: bool,
    low_code_match: float,
    low_judge_score: int,
    batch_size: int,
    timeout_s: float,
) -> list[dict]:
    """Scores the records not yet in `path` in chunks (appending each), returns all scored ones.

    A torn last line of `path` is cut and a corrupt line moved aside first (`jsonl.prepare`).
    A scored row whose scored fields (`SCORED_FROM`: the prediction and the calls) differ
    from its episode's record now (the episode was redone, e.g. after its line was found
    corrupt) is moved to `<file>.stale` and scored again: a score always belongs to the
    episode beside it.
    """
    jsonl.prepare(path, required=runner.RECORD_KEYS)
    current = {r["task_id"]: r for r in records}

    def stale(row: dict) -> bool:
        episode = current.get(row.get("task_id"))
        return episode is not None and any(row.get(k) != episode.get(k) for k in SCORED_FROM)

    jsonl.set_aside(path, stale, suffix=".stale", why="scores of episodes since redone")
    done = runner.finished_ids(path)
    pending = [r for r in records if r["task_id"] not in done]
    golds = {t: ref.description for t, ref in references.items()}
    for start in range(0, len(pending), batch_size):
        chunk = pending[start : start + batch_size]
        scored = score_episodes(
            chunk,
            references,
            judge_policy=None if judged is not None else judge_policy,
            coder_policy=coder_policy,
            executor=executor,
            with_observations=with_observations,
            timeout_s=timeout_s,
        )
        if judged is not None:  # Judge fields come from the run that was judged already.
            keys = ("judge_score", "judge_raw", "judge_skipped")
            scored = [dict(r, **{k: judged[r["task_id"]][k] for k in keys}) for r in scored]
        if attribute:
            scored = failure_modes.attribute(
                scored,
                judge_policy,
                golds=golds,
                code_match_below=low_code_match,
                judge_below=low_judge_score,
            )
        jsonl.append(path, scored)
        print(
            f"[eval] scored {min(start + batch_size, len(pending))}/{len(pending)} -> {path.name}"
        )
    wanted = {r["task_id"] for r in records}
    return [r for r in runner.load_records(path) if r["task_id"] in wanted]
