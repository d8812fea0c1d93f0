"""Batched episode runner: many PAU episodes at once, one policy call per round.

At every round each active episode contributes the prompt of its current phase
to a single policy call; the sandbox calls of the episodes that produced an
input run in parallel threads over the executor's worker pool. Each finished
episode is appended to a JSONL file at once (flushed and fsynced), and a rerun
with the same file skips the episodes already recorded, so a killed run resumes
without redoing finished work. The file is a `jsonl` file: a line torn by a
kill is cut and a corrupt line is moved to `<file>.corrupt` with a warning
before the run resumes; both episodes are run again. A policy that raises (e.g.
`http.EndpointError`) stops the run; the episodes not finished are not recorded
and run again on the next run.

The runner calls the policy's `complete` (`pau_jax.policy.Policy`) with each
episode's `answer_shape.answer_shape`, what its reply must hold (a policy that masks
its tokens, structured decoding, reads it; others ignore it). It returns plain
texts or reply objects with a `.text` (e.g. `LocalPolicy.complete`'s `Completion`,
with token ids and log-probs); `run_episode_states` keeps those replies per step
together with each finished `EpisodeState`, which is what rollouts for training
need. Episodes are keyed by `EpisodeSpec.episode_id` (the task id unless set), so
one task can be run many times at once (a GRPO group). In a multi-turn
conversation the previous reply's token ids ride on its assistant message
(`turns.with_tokens`), so a local policy extends its last prompt by ids; the
recorded messages stay plain text.
"""

import collections
import concurrent.futures
import dataclasses
import os
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

from pau_jax.env import answer_shape, episode, jsonl, turns
from pau_jax.env.episode import EpisodeConfig, EpisodeState, Phase


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpisodeSpec:
    """A task as the runner needs it: what the agent sees, and the code that answers calls."""

    task: episode.Task
    code: str
    entry: str = "test_func"
    episode_id: str = ""

    def __post_init__(self):
        if not self.episode_id:
            object.__setattr__(self, "episode_id", self.task.task_id)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FinishedEpisode:
    """An episode run to its end.

    Attributes:
      spec: what was run.
      state: the final state (`finish_reason` set).
      replies: per step of `state.steps`, what the policy returned for it (a text,
        or a reply object with `.text`, e.g. a `Completion` with token ids).
      seconds: wall time from the episode's first round to its last.
      record: its JSON record (`episode_record`).
    """

    spec: EpisodeSpec
    state: EpisodeState
    replies: tuple[Any, ...]
    seconds: float
    record: dict


def _reply_fields(reply: Any) -> dict:
    """What a step record keeps of a reply object beyond its text."""
    fields = {}
    for name in ("finish_reason", "prompt_tokens", "completion_tokens"):
        value = getattr(reply, name, None)
        if value is not None:
            fields[name] = value
    return fields


def episode_record(
    state: EpisodeState,
    *,
    seconds: float,
    extra: dict | None = None,
    episode_id: str | None = None,
    replies: Sequence[Any] | None = None,
) -> dict:
    """The JSON-serialisable trajectory of a finished episode.

    Args:
      state: the final state.
      seconds: wall time of the episode.
      extra: more top-level fields.
      episode_id: the episode's id (default: its task id).
      replies: per step, the policy's reply; reply objects add their finish
        reason and token counts to the step.

    An episode whose task carries an initial hypothesis, prior observations or a
    critique records them (`initial_hypothesis`, `prior_observations`, `critique`).
    """
    steps = [
        {
            "phase": s.phase.value,
            "messages": list(s.messages),
            "output": s.output,
            "parse_ok": s.parse_ok,
            "parse_error": s.parse_error,
            "input_text": s.input_text,
            "call": s.call,
            "result": s.result,
            "call_ok": s.call_ok,
        }
        for s in state.steps
    ]
    for step, reply in zip(steps, replies or ()):
        step.update(_reply_fields(reply))
    record = {
        "task_id": state.task.task_id,
        "episode_id": episode_id or state.task.task_id,
        "header": state.task.header,
        "prediction": state.prediction,
        "finish_reason": state.finish_reason,
        "stopped_by_agent": state.stopped_by_agent,
        "n_calls": state.n_calls,
        "n_steps": len(state.steps),
        "observations": [dataclasses.asdict(o) for o in state.observations],
        "steps": steps,
        "seconds": seconds,
    }
    task = state.task  # An episode started from an earlier one (the memory baseline) says so.
    if task.initial_hypothesis:
        record["initial_hypothesis"] = task.initial_hypothesis
    if task.prior_observations:
        record["prior_observations"] = [dataclasses.asdict(o) for o in task.prior_observations]
    if task.critique:
        record["critique"] = task.critique
    record.update(extra or {})
    return record


# Keys every record of an episodes (or scored) file has.
RECORD_KEYS = ("task_id",)


def record_id(record: dict) -> str:
    """The episode id of a record; records written before episodes had their own ids count
    by their task id."""
    return record.get("episode_id") or record["task_id"]


def finished_ids(path: str | os.PathLike) -> set[str]:
    """Episode ids already recorded in a JSONL file (none when it does not exist).

    Read with `jsonl.read`: a torn last line is ignored, a corrupt line raises
    `jsonl.CorruptRecordError` (`jsonl.prepare` moves those aside first). An id
    recorded twice (see `load_records`) counts once.
    """
    path = pathlib.Path(path)
    if not path.exists():
        return set()
    return {record_id(r) for r in jsonl.read(path, required=RECORD_KEYS)}


def drop_torn_tail(path: pathlib.Path) -> None:
    """Readies a records file for appends: a torn last line cut, corrupt lines moved aside."""
    jsonl.prepare(path, required=RECORD_KEYS)


def _text(reply: Any) -> str:
    return reply if isinstance(reply, str) else reply.text


def _conversation(state: EpisodeState, replies: list, config: EpisodeConfig) -> list[dict]:
    """The current phase's conversation; multi-turn: the last reply's ids on its message."""
    conversation = episode.messages(state, config)
    if config.conversation == "multi_turn":
        conversation = turns.with_tokens(conversation, replies[-1] if replies else None)
    return conversation


def _finished(spec: EpisodeSpec, state: EpisodeState, replies: list, seconds: float):
    """The `FinishedEpisode` of an episode that ended, with its record."""
    record = episode_record(state, seconds=seconds, episode_id=spec.episode_id, replies=replies)
    return FinishedEpisode(
        spec=spec, state=state, replies=tuple(replies), seconds=seconds, record=record
    )


def _on_reply(state: EpisodeState, reply, replies: list, config: EpisodeConfig):
    """The state after one reply (appended to `replies`), and the arguments to call, if any."""
    if getattr(reply, "finish_reason", None) == "prompt_length":
        # The policy refused the prompt as too long: the episode ends, no step.
        return episode.on_prompt_too_long(state, config), None
    replies.append(reply)
    text = _text(reply)
    if state.phase is Phase.CONCEPTUALIZE:
        return episode.on_conceptualize(state, text, config), None
    if state.phase is Phase.GENERATE:
        return episode.on_generate(state, text, config)
    return episode.on_revise(state, text, config), None


def run_episode_states(
    specs: Sequence[EpisodeSpec],
    policy,
    executor,
    config: EpisodeConfig,
    *,
    out_path: str | os.PathLike | None = None,
    call_timeout_s: float = 2.0,
    max_parallel_calls: int = 8,
    progress: bool = True,
    max_active: int | None = None,
) -> list[FinishedEpisode]:
    """Runs every episode to the end; returns the episodes run now, in the order they finished.

    Args:
      specs: the episodes to run (episode ids must be unique).
      policy: a `pau_jax.policy.Policy`, called `policy.complete(conversations,
        answers=...)` with each episode's `answer_shape.answer_shape`; each reply a text or
        an object with a `.text`.
      executor: a `pau_jax.sandbox.Executor` (thread-safe `call`).
      config: the protocol constants.
      out_path: JSONL file; episodes already in it are skipped, new ones appended.
      call_timeout_s: wall-clock limit of one sandbox call.
      max_parallel_calls: threads issuing sandbox calls at once.
      progress: print a progress line (episodes done, episodes/s) to stderr.
      max_active: at most this many episodes in one policy call; the next one starts
        as one ends (in the order of `specs`), which bounds the memory of a call on a
        long task list. None: every episode at once. A greedy policy's replies depend
        on it only through float rounding; a sampling policy's draws follow its rows.

    Raises:
      What the policy raises (e.g. `http.EndpointError`), after the episodes
      finished so far were written to `out_path`.
    """
    ids = [s.episode_id for s in specs]
    if len(set(ids)) != len(ids):
        raise ValueError("episode ids passed to run_episodes must be unique")
    if max_active is not None and max_active < 1:
        raise ValueError(f"max_active must be >= 1 or None, got {max_active}")
    path = pathlib.Path(out_path) if out_path is not None else None
    skip = set()
    if path is not None:
        jsonl.prepare(path, required=RECORD_KEYS)
        skip = finished_ids(path)
    by_id = {s.episode_id: s for s in specs}
    waiting = collections.deque(s for s in specs if s.episode_id not in skip)
    limit = max_active or max(len(waiting), 1)
    active: dict[str, EpisodeState] = {}
    replies: dict[str, list] = {}
    started: dict[str, float] = {}

    def admit():
        while waiting and len(active) < limit:
            spec = waiting.popleft()
            active[spec.episode_id] = episode.start(spec.task, config)
            replies[spec.episode_id], started[spec.episode_id] = [], time.perf_counter()

    finished = []
    total, t0 = len(waiting), time.perf_counter()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_parallel_calls)
    try:
        admit()
        while active:
            order = list(active)
            conversations = [_conversation(active[e], replies[e], config) for e in order]
            answers = [answer_shape.answer_shape(active[e], config) for e in order]
            outputs = policy.complete(conversations, answers=answers)
            calls = {}
            for eid, reply in zip(order, outputs, strict=True):
                active[eid], args = _on_reply(active[eid], reply, replies[eid], config)
                if args is not None:
                    calls[eid] = pool.submit(
                        executor.call, by_id[eid].code, args, timeout_s=call_timeout_s
                    )
            for eid, future in calls.items():
                active[eid] = episode.on_result(active[eid], future.result(), config)
            for eid in [e for e in order if active[e].phase is Phase.DONE]:
                seconds = time.perf_counter() - started[eid]
                done = _finished(by_id[eid], active.pop(eid), replies.pop(eid), seconds)
                finished.append(done)
                if path is not None:
                    jsonl.append(path, [done.record])
            admit()
            if progress and total:
                rate = len(finished) / max(time.perf_counter() - t0, 1e-9)
                print(
                    f"\repisodes {len(finished)}/{total}  {rate:.2f} episodes/s",
                    end="" if active else "\n",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        pool.shutdown(wait=True)
        if progress and total and active:  # stopped by an error: end the progress line
            print(file=sys.stderr, flush=True)
    return finished


def run_episodes(
    specs: Sequence[EpisodeSpec],
    policy,
    executor,
    config: EpisodeConfig,
    *,
    out_path: str | os.PathLike | None = None,
    call_timeout_s: float = 2.0,
    max_parallel_calls: int = 8,
    progress: bool = True,
    max_active: int | None = None,
) -> list[dict]:
    """Runs every episode to the end; returns the JSON records of the episodes run now.

    Arguments as `run_episode_states`.
    """
    finished = run_episode_states(
        specs,
        policy,
        executor,
        config,
        out_path=out_path,
        call_timeout_s=call_timeout_s,
        max_parallel_calls=max_parallel_calls,
        progress=progress,
        max_active=max_active,
    )
    return [f.record for f in finished]


def load_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a JSONL trajectory (or scored) file, in order, one per episode id.

    Read as `finished_ids` reads them. A file that two runs appended to at once (which
    a run directory's lock, `pau_jax.run_claim`, now prevents) may hold an episode
    twice: the first complete record of each id is kept, and one warning on stderr
    counts the records dropped.
    """
    every, records, seen = jsonl.read(path, required=RECORD_KEYS), [], set()
    for record in every:
        if record_id(record) not in seen:
            seen.add(record_id(record))
            records.append(record)
    dropped = len(every) - len(records)
    if dropped:
        print(
            f"[runner] warning: {path}: {dropped} record{'s' if dropped != 1 else ''} of "
            "episodes recorded earlier in the file dropped (the first record of each kept)",
            file=sys.stderr,
            flush=True,
        )
    return records
