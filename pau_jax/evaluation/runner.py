"""Batched episode runner: many PAU episodes at once, one policy call per round.

At every round each active episode contributes the prompt of its current phase
to a single policy call; the sandbox calls of the episodes that produced an
input run in parallel threads over the executor's worker pool. Each finished
episode is appended to a JSONL file at once (flushed and fsynced), and a rerun
with the same file skips the episodes already recorded, so a killed run resumes
without redoing finished work.
"""

import concurrent.futures
import dataclasses
import json
import os
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

from pau_jax.env import episode
from pau_jax.env.episode import EpisodeConfig, EpisodeState, Phase


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpisodeSpec:
    """A task as the runner needs it: what the agent sees, and the code that answers calls."""

    task: episode.Task
    code: str
    entry: str = "test_func"


def episode_record(state: EpisodeState, *, seconds: float, extra: dict | None = None) -> dict:
    """The JSON-serialisable trajectory of a finished episode."""
    steps = [
        {
            "phase": s.phase.value,
            "messages": list(s.messages),
            "output": s.output,
            "parse_ok": s.parse_ok,
            "parse_error": s.parse_error,
            "call": s.call,
            "result": s.result,
            "call_ok": s.call_ok,
        }
        for s in state.steps
    ]
    record = {
        "task_id": state.task.task_id,
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
    record.update(extra or {})
    return record


def finished_ids(path: str | os.PathLike) -> set[str]:
    """Task ids already recorded in a JSONL file (a torn last line is ignored)."""
    path = pathlib.Path(path)
    done = set()
    if not path.exists():
        return done
    with path.open() as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                done.add(json.loads(line)["task_id"])
            except (json.JSONDecodeError, KeyError):
                continue  # A line cut by a crash; that episode is run again.
    return done


def _drop_torn_tail(path: pathlib.Path) -> None:
    """Cuts a last line left without its newline by a crash, so appends start clean."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


def _append(path: pathlib.Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


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
) -> list[dict]:
    """Runs every episode to the end; returns the records of the episodes run now.

    Args:
      specs: the episodes to run (task ids must be unique).
      policy: `policy(conversations) -> texts` (see `pau_jax.policy.Policy`).
      executor: a `pau_jax.sandbox.Executor` (thread-safe `call`).
      config: the protocol constants.
      out_path: JSONL file; episodes already in it are skipped, new ones appended.
      call_timeout_s: wall-clock limit of one sandbox call.
      max_parallel_calls: threads issuing sandbox calls at once.
      progress: print a progress line (episodes done, episodes/s) to stderr.
    """
    ids = [s.task.task_id for s in specs]
    if len(set(ids)) != len(ids):
        raise ValueError("task ids passed to run_episodes must be unique")
    path = pathlib.Path(out_path) if out_path is not None else None
    skip = finished_ids(path) if path is not None else set()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        _drop_torn_tail(path)
    by_id = {s.task.task_id: s for s in specs}
    active = {
        s.task.task_id: episode.start(s.task, config) for s in specs if s.task.task_id not in skip
    }
    started = {tid: time.perf_counter() for tid in active}
    records = []
    total, t0 = len(active), time.perf_counter()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_parallel_calls)
    try:
        while active:
            order = list(active)
            texts = policy([episode.messages(active[t], config) for t in order])
            calls = {}
            for tid, text in zip(order, texts, strict=True):
                state = active[tid]
                if state.phase is Phase.CONCEPTUALIZE:
                    active[tid] = episode.on_conceptualize(state, text, config)
                elif state.phase is Phase.GENERATE:
                    state, args = episode.on_generate(state, text, config)
                    active[tid] = state
                    if args is not None:
                        spec = by_id[tid]
                        calls[tid] = pool.submit(
                            executor.call, spec.code, args, timeout_s=call_timeout_s
                        )
                else:
                    active[tid] = episode.on_revise(state, text, config)
            for tid, future in calls.items():
                active[tid] = episode.on_result(active[tid], future.result(), config)
            for tid in [t for t in order if active[t].phase is Phase.DONE]:
                state = active.pop(tid)
                record = episode_record(state, seconds=time.perf_counter() - started[tid])
                records.append(record)
                if path is not None:
                    _append(path, record)
            if progress and total:
                rate = len(records) / max(time.perf_counter() - t0, 1e-9)
                print(
                    f"\repisodes {len(records)}/{total}  {rate:.2f} episodes/s",
                    end="" if active else "\n",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        pool.shutdown(wait=True)
    return records


def load_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All complete records of a JSONL trajectory file."""
    with pathlib.Path(path).open() as f:
        out = []
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out
