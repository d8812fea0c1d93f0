"""The memory baseline: retrieve similar train functions, learn from critiques of exploring them, explore again.

After the first interactive run, per test task:

1. retrieval: the gold descriptions of the train split and the run's predicted
   description are embedded (unit vectors, last-token pooled); the `top_k`
   train items with the largest dot product are retrieved;
2. critiques: the agent explores each retrieved train item in an ordinary
   interactive episode, then is shown the item's true description, its held-out
   calls, the calls it tried and its prediction, and asked what its exploration
   missed and which strategy would have found it (one critique per train item,
   reused by every test task that retrieves it);
3. summary: the agent merges the critiques of the retrieved items into one (a
   single critique is used as it is);
4. second episode: a fresh interactive episode on the test task whose reasoning
   prompts carry the merged critique, whose hypothesis starts as the first
   prediction and whose prompts show the first run's calls.

Every stage appends to its own file under `<run_dir>/memory/` and a rerun skips
what is there (each a resumable `jsonl` file: a torn last line is cut and a
corrupt one moved aside before it is read); the second episodes go to
`<run_dir>/memory_episodes.jsonl`. An agent or embedder that raises (e.g.
`http.EndpointError`) stops the run with what the stages wrote kept.
"""

import dataclasses
import hashlib
import json
import os
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np

from pau_jax.env import episode, jsonl, runner
from pau_jax.env.prompts import Observation
from pau_jax.evaluation.memory_prompts import (
    critique_messages,
    held_out_observations,
    parse_critique,
    summary_messages,
)

EMPTY_PREDICTION = "(no description)"  # What an empty first prediction is embedded as.


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryConfig:
    """Settings of the memory baseline.

    Attributes:
      embedder: `policy.embeddings.LocalEmbeddingConfig` (a Qwen3-Embedding or BERT
        sentence-embedder checkpoint, e.g. all-MiniLM-L6-v2 from `pau_jax.tools.fetch`)
        or `HTTPEmbeddingConfig` (an `/v1/embeddings` endpoint); required.
      top_k: train items retrieved per test task (paper and released code: 5).
      max_held_out_shown: held-out calls shown in a critique prompt; None shows all
        (the released code).
      batch_size: critique and summary prompts per policy call; None: all at once.
    """

    embedder: object = None
    top_k: int = 5
    max_held_out_shown: int | None = None
    batch_size: int | None = None

    def __post_init__(self):
        if self.top_k < 1:
            raise ValueError(f"MemoryConfig.top_k must be >= 1, got {self.top_k}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"MemoryConfig.batch_size must be >= 1 or None, got {self.batch_size}")


def top_k(queries: np.ndarray, keys: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices and scores of the `k` keys with the largest dot product, per query.

    Args:
      queries: [Q, D] unit vectors.
      keys: [N, D] unit vectors.
      k: how many (at most N are returned).

    Returns:
      ([Q, min(k, N)] int indices, best first, ties broken by the lower index;
       [Q, min(k, N)] float scores).
    """
    scores = np.asarray(queries, np.float64) @ np.asarray(keys, np.float64).T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(scores, order, axis=1)


def _observations(record: dict) -> tuple[Observation, ...]:
    return tuple(Observation(call=o["call"], result=o["result"]) for o in record["observations"])


def _append(path: pathlib.Path, rows: Sequence[dict]) -> None:
    jsonl.prepare(path, required=runner.RECORD_KEYS)  # a torn line must not swallow the next row
    jsonl.append(path, rows)


def _keyed(path: pathlib.Path) -> dict[str, dict]:
    """Task id -> row of a stage's file, once its torn tail is cut and corrupt lines moved aside."""
    jsonl.prepare(path, required=runner.RECORD_KEYS)
    return {r["task_id"]: r for r in runner.load_records(path)} if path.exists() else {}


def _chunks(items: list, size: int | None):
    size = size or max(len(items), 1)
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _check_manifest(folder: pathlib.Path, manifest: dict) -> None:
    """Writes the manifest of a fresh memory folder; refuses one made with other settings."""
    path = folder / "manifest.json"
    if path.exists():
        old = json.loads(path.read_text())
        if old != manifest:
            changed = sorted(k for k in manifest if old.get(k) != manifest[k])
            raise ValueError(
                f"{folder} was made with other memory settings ({', '.join(changed)}); "
                "use a new run_dir or delete that folder"
            )
        return
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=2) + "\n")


def _train_embeddings(folder: pathlib.Path, embedder, ids: list[str], texts: list[str]):
    path = folder / "train_embeddings.npy"
    if path.exists():
        keys = np.load(path)
        if keys.shape[0] == len(ids):
            return keys
    print(f"[memory] embedding {len(texts)} train descriptions", flush=True)
    keys = np.asarray(embedder.embed(texts), np.float32)
    tmp = folder / "train_embeddings.tmp.npy"
    np.save(tmp, keys)
    tmp.replace(path)
    return keys


def _retrieve(folder, specs, first_records, embedder, train_ids, texts, config) -> dict:
    """Stage 1: the top-k train items of each test task by embedding similarity of its first
    prediction to the train items' gold descriptions; task id -> retrieval row."""
    retrieval_path = folder / "retrieval.jsonl"
    retrieved = _keyed(retrieval_path)
    pending = [s.task.task_id for s in specs if s.task.task_id not in retrieved]
    if pending:
        keys = _train_embeddings(folder, embedder, train_ids, texts)
        queries = [first_records[t]["prediction"] or EMPTY_PREDICTION for t in pending]
        print(f"[memory] retrieving the top {config.top_k} of {len(train_ids)} train items "
              f"for {len(pending)} tasks", flush=True)  # fmt: skip
        order, scores = top_k(np.asarray(embedder.embed(queries)), keys, config.top_k)
        rows = [
            {
                "task_id": t,
                "query": q,
                "retrieved": [train_ids[j] for j in idx],
                "scores": [float(x) for x in row],
            }
            for t, q, idx, row in zip(pending, queries, order, scores, strict=True)
        ]
        _append(retrieval_path, rows)
        retrieved.update({r["task_id"]: r for r in rows})
    return retrieved


def _critique_train_items(
    folder,
    specs,
    retrieved,
    train,
    train_references,
    agent,
    executor,
    episode_config,
    config,
    call_timeout_s,
    max_parallel_calls,
) -> dict:
    """Stage 2: one interactive episode and one critique per retrieved train item; train task
    id -> critique row."""
    needed = list(dict.fromkeys(t for s in specs for t in retrieved[s.task.task_id]["retrieved"]))
    by_train = {s.task.task_id: s for s in train}
    critiques_path = folder / "critiques.jsonl"
    critiques = _keyed(critiques_path)
    todo = [t for t in needed if t not in critiques]
    if todo:
        episodes_path = folder / "train_episodes.jsonl"
        print(f"[memory] {len(todo)} episodes on retrieved train items", flush=True)
        runner.run_episodes(
            [by_train[t] for t in todo],
            agent,
            executor,
            episode_config,
            out_path=episodes_path,
            call_timeout_s=call_timeout_s,
            max_parallel_calls=max_parallel_calls,
        )
        train_records = _keyed(episodes_path)
        for chunk in _chunks(todo, config.batch_size):
            conversations = []
            for t in chunk:
                record, ref = train_records[t], train_references[t]
                conversations.append(
                    critique_messages(
                        header=ref.header,
                        description=ref.description,
                        held_out=held_out_observations(
                            ref, episode_config.display_mode, config.max_held_out_shown
                        ),
                        tried=by_train[t].task.examples + _observations(record),
                        prediction=record["prediction"],
                    )
                )
            texts_out = agent(conversations)
            rows = [
                {"task_id": t, "messages": m, "output": x, "critique": parse_critique(x)}
                for t, m, x in zip(chunk, conversations, texts_out, strict=True)
            ]
            _append(critiques_path, rows)
            critiques.update({r["task_id"]: r for r in rows})
            print(f"[memory] critiques {len(critiques)}/{len(needed)}", flush=True)
    return critiques


def _merge_critiques(folder, specs, retrieved, critiques, agent, config) -> dict:
    """Stage 3: one merged critique per test task (a single critique is kept as it is); task
    id -> summary row."""
    summaries_path = folder / "summaries.jsonl"
    summaries = _keyed(summaries_path)
    todo = [s.task.task_id for s in specs if s.task.task_id not in summaries]
    single, several = [], []
    for t in todo:
        parts = [critiques[i]["critique"] for i in retrieved[t]["retrieved"]]
        (single if len(parts) == 1 else several).append((t, parts))
    if single:
        rows = [
            {"task_id": t, "critiques": p, "messages": None, "output": None, "critique": p[0]}
            for t, p in single
        ]
        _append(summaries_path, rows)
        summaries.update({r["task_id"]: r for r in rows})
    for chunk in _chunks(several, config.batch_size):
        conversations = [summary_messages(parts) for _, parts in chunk]
        texts_out = agent(conversations)
        rows = [
            {
                "task_id": t,
                "critiques": p,
                "messages": m,
                "output": x,
                "critique": parse_critique(x),
            }
            for (t, p), m, x in zip(chunk, conversations, texts_out, strict=True)
        ]
        _append(summaries_path, rows)
        summaries.update({r["task_id"]: r for r in rows})
        print(f"[memory] merged critiques {len(summaries)}/{len(specs)}", flush=True)
    return summaries


def run_memory(
    *,
    specs: Sequence[runner.EpisodeSpec],
    first_records: Mapping[str, dict],
    train_specs: Sequence[runner.EpisodeSpec],
    train_references: Mapping,
    agent,
    embedder,
    embedder_name: str,
    executor,
    episode_config: episode.EpisodeConfig,
    config: MemoryConfig,
    run_dir: str | os.PathLike,
    call_timeout_s: float = 2.0,
    max_parallel_calls: int = 8,
) -> list[dict]:
    """Runs the memory baseline (see module docstring); returns the second episodes' records.

    Args:
      specs: the test tasks.
      first_records: task id -> the first interactive run's record of that task.
      train_specs, train_references: the train split (specs, references by task id).
      agent: the agent (a `Policy`: `complete(conversations)` replies with `.text`).
      embedder: an `Embedder` (`embed(texts) -> [N, D]` unit vectors).
      embedder_name: a description of the embedder (a run made with another is refused).
      executor: the sandbox executor.
      episode_config: the protocol of every episode.
      config: the baseline's settings.
      run_dir: the evaluation's run directory.
      call_timeout_s, max_parallel_calls: as in `runner.run_episodes`.
    """
    run_dir = pathlib.Path(run_dir)
    folder = run_dir / "memory"
    missing = [s.task.task_id for s in specs if s.task.task_id not in first_records]
    if missing:
        raise ValueError(
            f"memory needs the first interactive run of every task; missing {missing[:3]}"
        )
    train = [s for s in train_specs if train_references[s.task.task_id].description]
    if not train:
        raise ValueError("the train split has no item with a gold description to retrieve")
    train_ids = [s.task.task_id for s in train]
    texts = [train_references[t].description for t in train_ids]
    digest = hashlib.sha256(json.dumps([train_ids, texts]).encode()).hexdigest()
    _check_manifest(
        folder,
        {
            "embedder": embedder_name,
            "top_k": config.top_k,
            "max_held_out_shown": config.max_held_out_shown,
            "train_items": digest,
        },
    )

    # 1. Retrieval.
    retrieved = _retrieve(folder, specs, first_records, embedder, train_ids, texts, config)
    # 2. Critiques: one interactive episode and one critique per retrieved train item.
    critiques = _critique_train_items(
        folder,
        specs,
        retrieved,
        train,
        train_references,
        agent,
        executor,
        episode_config,
        config,
        call_timeout_s,
        max_parallel_calls,
    )
    # 3. One merged critique per test task.
    summaries = _merge_critiques(folder, specs, retrieved, critiques, agent, config)

    # 4. The second episode: critique, first prediction and first calls carried in.
    second = []
    for spec in specs:
        t, first = spec.task.task_id, first_records[spec.task.task_id]
        task = dataclasses.replace(
            spec.task,
            initial_hypothesis=first["prediction"],
            prior_observations=_observations(first),
            critique=summaries[t]["critique"],
        )
        second.append(dataclasses.replace(spec, task=task))
    path = run_dir / "memory_episodes.jsonl"
    runner.run_episodes(
        second,
        agent,
        executor,
        episode_config,
        out_path=path,
        call_timeout_s=call_timeout_s,
        max_parallel_calls=max_parallel_calls,
    )
    wanted = {s.episode_id for s in specs}
    return [r for r in runner.load_records(path) if r.get("episode_id", r["task_id"]) in wanted]
