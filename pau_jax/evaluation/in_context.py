"""In-context mode: the agent describes a function from its header and two examples, without calls.

All pending tasks go into one batched policy call (or one call per chunk of
`batch_size`); each answer becomes a JSONL record with the fields that
`score.score_episodes` and `metrics.summarize` read (`task_id`, `prediction`,
`n_calls = 0`, `observations = []`, ...). Records are appended and fsynced per
chunk, and a rerun with the same file skips tasks already recorded (a torn last
line is cut and a corrupt one moved aside first: `jsonl.prepare`). A policy that
raises (e.g. `http.EndpointError`) stops the run; the chunk it was answering is
not recorded and is asked again on the next run.
"""

import os
import pathlib
import sys
import time
from collections.abc import Sequence

from pau_jax.env import jsonl, parse, prompts, runner


def messages(task) -> list[dict]:
    """The in-context prompt of an `episode.Task` (header and shown examples only)."""
    view = prompts.EpisodeView(header=task.header, examples=task.examples)
    return prompts.in_context_messages(view)


def training_pairs(specs, references) -> list[dict]:
    """The ft baseline's training pairs: in-context prompt -> `Description: <gold description>`.

    Args:
      specs: `runner.EpisodeSpec`s of a train split.
      references: task id -> `TaskReference` (its gold description).

    Returns:
      One dict per task with a gold description: `id` (the task id), `messages`
      (the in-context prompt) and `completion` (the answer to learn, in the format
      `parse.parse_description` reads).
    """
    return [
        {
            "id": spec.task.task_id,
            "messages": messages(spec.task),
            "completion": f"Description: {references[spec.task.task_id].description}",
        }
        for spec in specs
        if references[spec.task.task_id].description
    ]


def in_context_record(task, text: str, *, seconds: float, mode: str = "in_context") -> dict:
    """The record of one answer; `stopped_by_agent` is None (the mode has no stop decision).

    `mode` names the run ('ft' for the fine-tuned baseline); it is the record's
    `mode` and `finish_reason`.
    """
    description = parse.parse_description(text)
    return {
        "task_id": task.task_id,
        "header": task.header,
        "mode": mode,
        "prediction": description,
        "finish_reason": mode,
        "stopped_by_agent": None,
        "n_calls": 0,
        "n_steps": 1,
        "observations": [],
        "steps": [
            {
                "phase": "in_context",
                "messages": messages(task),
                "output": text,
                "parse_ok": bool(description),
                "parse_error": "" if description else "empty description",
            }
        ],
        "seconds": seconds,
    }


def run_in_context(
    specs: Sequence[runner.EpisodeSpec],
    policy,
    *,
    out_path: str | os.PathLike | None = None,
    batch_size: int | None = None,
    progress: bool = True,
    mode: str = "in_context",
) -> list[dict]:
    """Asks for a description of every task; returns the records made now.

    Args:
      specs: the tasks (task ids must be unique); only `spec.task` is used.
      policy: `policy(conversations) -> texts`.
      out_path: JSONL file; tasks already in it are skipped, new records appended.
      batch_size: tasks per policy call; None puts all pending tasks in one call.
      progress: print a progress line to stderr.
      mode: the records' `mode` ('in_context'; 'ft' for the fine-tuned baseline).
    """
    ids = [s.task.task_id for s in specs]
    if len(set(ids)) != len(ids):
        raise ValueError("task ids passed to run_in_context must be unique")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
    path = pathlib.Path(out_path) if out_path is not None else None
    skip = set()
    if path is not None:
        jsonl.prepare(path, required=runner.RECORD_KEYS)
        skip = runner.finished_ids(path)
    pending = [s.task for s in specs if s.task.task_id not in skip]
    size = batch_size or max(len(pending), 1)
    records = []
    for start in range(0, len(pending), size):
        chunk = pending[start : start + size]
        t0 = time.perf_counter()
        texts = policy([messages(t) for t in chunk])
        seconds = (time.perf_counter() - t0) / len(chunk)
        made = [
            in_context_record(t, x, seconds=seconds, mode=mode)
            for t, x in zip(chunk, texts, strict=True)
        ]
        if path is not None:
            jsonl.append(path, made)
        records += made
        if progress:
            label = "in-context" if mode == "in_context" else mode
            print(f"{label} {len(records)}/{len(pending)}", file=sys.stderr, flush=True)
    return records
