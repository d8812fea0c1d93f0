"""The eval run mode: `evaluate` with every backend kind, resume, and the launcher end to end."""

import fcntl
import http.server
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading

import checkpoints
import launching
import pytest

from pau_jax import run_claim
from pau_jax.evaluation import pipeline
from pau_jax.evaluation.score import ScoringConfig
from pau_jax.policy import backends, scripted
from pau_jax.tasks import DatasetConfig, DemoTasksConfig
from pau_jax.tasks import demo as demo_tasks

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTED = dict(
    judge=backends.ScriptedJudgeBackendConfig(),
    coder=backends.ScriptedCoderBackendConfig(),
    scoring=ScoringConfig(bootstrap_resamples=500),
)


def _lines(path):
    return path.read_text().splitlines()


def test_demo_tasks_both_modes_and_resume(tmp_path, capsys):
    config = pipeline.EpisodeConfig(call_budget=3)
    kwargs = dict(
        policy=backends.OracleBackendConfig(n_probes=2),
        modes=("interactive", "in_context"),
        episode_config=config,
        **SCRIPTED
        | {"scoring": ScoringConfig(coder_observations=(False, True), bootstrap_resamples=500)},
    )
    result = pipeline.evaluate(run_dir=str(tmp_path), **kwargs)
    runs = result["runs"]
    assert set(runs) == {
        "interactive",
        "interactive+observations",
        "in_context",
        "in_context+observations",
    }
    assert all(s["code_match"]["mean"] == 1.0 and s["episodes"] == 4 for s in runs.values())
    assert runs["interactive"]["calls"]["mean"] == 2.0 and runs["interactive"]["stop_rate"] == 1.0
    assert runs["in_context"]["stop_rate"] is None
    assert runs["interactive"]["per_source"]["demo"]["episodes"] == 4
    assert result["intervals"]["interactive"]["code_match"]["low"] == 1.0
    pair = result["comparisons"]["interactive vs in_context"]["code_match"]
    assert pair["estimate"] == 0.0 and pair["p_value"] == 1.0 and pair["n"] == 4
    assert result["max_ensemble"]["max(interactive, in_context)"]["code_match_mean"] == 1.0
    assert json.loads((tmp_path / "metrics.json").read_text()) == json.loads(json.dumps(result))
    report = (tmp_path / "report.md").read_text()
    assert "| interactive | 4 |" in report and "| in_context+observations | 4 |" in report
    assert "## Paired comparisons" in report and "## Failure modes" in report
    for name in ("judge_scores.png", "code_match.png", "interactive_vs_in_context.png"):
        assert (tmp_path / name).stat().st_size > 1000
    out = capsys.readouterr().out
    assert "[eval] interactive: episodes=4 code_match=1.000" in out

    # A killed run: one episode and two scores lost. The rerun redoes only those.
    episodes = tmp_path / "interactive_episodes.jsonl"
    scored = tmp_path / "interactive_scored.jsonl"
    kept_episodes, kept_scores = _lines(episodes)[:3], _lines(scored)[:2]
    episodes.write_text("\n".join(kept_episodes) + "\n")
    scored.write_text("\n".join(kept_scores) + "\n" + '{"task_id": "demo/x", "tor')
    again = pipeline.evaluate(run_dir=str(tmp_path), **kwargs)
    assert _lines(episodes)[:3] == kept_episodes and len(_lines(episodes)) == 4
    assert _lines(scored)[:2] == kept_scores and len(_lines(scored)) == 4
    assert len(pipeline.runner.load_records(scored)) == 4  # the torn line swallowed no record
    assert again["runs"]["interactive"]["code_match"]["mean"] == 1.0


def test_debug_split_oracle_beats_random_prober(tmp_path):
    dataset = DatasetConfig(
        config="debug", data_dir=str(tmp_path / "tfds"), build_if_missing=True, limit=6
    )
    means = {}
    for backend in (backends.OracleBackendConfig(), backends.RandomProberBackendConfig(seed=1)):
        name = type(backend).__name__
        result = pipeline.evaluate(
            run_dir=str(tmp_path / name),
            policy=backend,
            dataset=dataset,
            episode_config=pipeline.EpisodeConfig(call_budget=4),
            **SCRIPTED,
        )
        means[name] = result["runs"]["interactive"]["code_match"]["mean"]
        assert result["tasks"] == 6
    assert means["OracleBackendConfig"] == 1.0
    assert means["RandomProberBackendConfig"] < 0.5
    # The random prober's low scores were classified (rule-based stand-in judge).
    metrics = json.loads((tmp_path / "RandomProberBackendConfig" / "metrics.json").read_text())
    assert metrics["runs"]["interactive"]["failure_modes"]["low_scoring"] >= 5


class _OracleHandler(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint answering with a scripted policy."""

    policy = None
    requests = 0

    def log_message(self, *args):
        del args

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests += 1
        text = type(self).policy([body["messages"]])[0]
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]})
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data.encode())


def test_http_backend(tmp_path):
    from pau_jax.env.episode import EpisodeConfig
    from pau_jax.policy.http import HTTPConfig
    from pau_jax.sandbox import Executor

    with Executor(workers=1) as ex:
        specs = demo_tasks.demo_specs(ex, EpisodeConfig())
    _OracleHandler.policy = scripted.OraclePolicy(specs, n_probes=1)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OracleHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        backend = backends.HTTPBackendConfig(http=HTTPConfig(base_url=url, model="oracle"))
        result = pipeline.evaluate(
            run_dir=str(tmp_path), policy=backend, modes=("in_context",), **SCRIPTED
        )
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert _OracleHandler.requests == 4
    assert result["runs"]["in_context"]["code_match"]["mean"] == 1.0
    assert result["backend_failures"] == {"policy": 0}


def test_local_backend_tiny_checkpoint(tmp_path):
    from pau_jax.policy.config import SamplingConfig

    checkpoint = checkpoints.save_tiny_chat_checkpoint(
        tmp_path / "ckpt", max_position_embeddings=2048
    )
    backend = backends.LocalBackendConfig(
        checkpoint_dir=str(checkpoint), sampling=SamplingConfig(max_new_tokens=4)
    )
    result = pipeline.evaluate(
        run_dir=str(tmp_path / "run"),
        policy=backend,
        dataset=DemoTasksConfig(limit=2),
        modes=("in_context",),
        **SCRIPTED,
    )
    assert result["runs"]["in_context"]["episodes"] == 2
    records = [json.loads(x) for x in _lines(tmp_path / "run" / "in_context_episodes.jsonl")]
    assert all(r["steps"][0]["output"] for r in records)
    assert result["structured_decoding"] == "off"
    assert "structured decoding" not in (tmp_path / "run" / "report.md").read_text()

    # The structured-decoding switch: every input parses, and the run says it was on.
    structured = backends.LocalBackendConfig(
        checkpoint_dir=str(checkpoint),
        sampling=SamplingConfig(max_new_tokens=40, structured="constrain_inputs"),
    )
    result = pipeline.evaluate(
        run_dir=str(tmp_path / "structured"),
        policy=structured,
        dataset=DemoTasksConfig(limit=2),
        episode_config=pipeline.EpisodeConfig(call_budget=2, max_steps=6),
        **SCRIPTED,
    )
    assert result["structured_decoding"] == "constrain_inputs"
    report = (tmp_path / "structured" / "report.md").read_text()
    assert "agent structured decoding: constrain_inputs" in report
    episodes = _lines(tmp_path / "structured" / "interactive_episodes.jsonl")
    inputs = [
        step
        for r in map(json.loads, episodes)
        for step in r["steps"]
        if step["phase"] == "generate"
    ]
    assert len(inputs) == 4 and all(step["parse_ok"] for step in inputs), inputs


def test_bad_arguments_are_clear(tmp_path):
    oracle = backends.OracleBackendConfig()
    with pytest.raises(ValueError, match="modes must be"):
        pipeline.evaluate(run_dir=str(tmp_path), policy=oracle, modes=("both",))
    with pytest.raises(ValueError, match="coder_observations"):
        pipeline.evaluate(
            run_dir=str(tmp_path), policy=oracle, scoring=ScoringConfig(coder_observations=())
        )
    with pytest.raises(ValueError, match="baselines are keyed by mode name"):
        pipeline.evaluate(run_dir=str(tmp_path), policy=oracle, baselines={"memry": None})
    with pytest.raises(TypeError, match="task source must be"):
        pipeline.evaluate(run_dir=str(tmp_path), policy=oracle, dataset="demo", **SCRIPTED)
    with pytest.raises(ValueError, match="checkpoint_dir is not set"):
        pipeline.evaluate(
            run_dir=str(tmp_path),
            policy=backends.LocalBackendConfig(checkpoint_dir=None),
            **SCRIPTED,
        )
    with pytest.raises(TypeError, match="unknown backend"):
        pipeline.evaluate(run_dir=str(tmp_path), policy="oracle", **SCRIPTED)
    with pytest.raises(FileNotFoundError, match="not built under"):
        pipeline.evaluate(
            run_dir=str(tmp_path),
            policy=oracle,
            dataset=DatasetConfig(config="debug", data_dir=str(tmp_path / "none")),
            **SCRIPTED,
        )


def test_the_judge_and_the_coder_must_be_chosen(tmp_path):
    oracle = backends.OracleBackendConfig()
    coder = backends.ScriptedCoderBackendConfig()
    judge = backends.ScriptedJudgeBackendConfig()
    # Nothing runs without a judge and a coder: the model under test never grades itself silently.
    with pytest.raises(ValueError, match="no judge is set.*JUDGE.*'self'"):
        pipeline.evaluate(run_dir=str(tmp_path), policy=oracle, coder=coder)
    with pytest.raises(ValueError, match="no coder is set"):
        pipeline.evaluate(run_dir=str(tmp_path), policy=oracle, judge=judge)
    with pytest.raises(ValueError, match="must be a \\*BackendConfig or 'self'"):
        pipeline.evaluate(run_dir=str(tmp_path), policy=oracle, judge="me", coder=coder)
    assert not list(tmp_path.iterdir())  # refused before anything was written
    # An independent judge and coder: not self-graded.
    graded = pipeline.evaluate(
        run_dir=str(tmp_path / "graded"), policy=oracle, modes=("in_context",), **SCRIPTED
    )
    assert graded["grading"] == {
        "judge": "ScriptedJudgeBackendConfig",
        "coder": "ScriptedCoderBackendConfig",
        "self_graded": False,
    }
    assert "Self-graded" not in (tmp_path / "graded" / "report.md").read_text()


class _DescribeAndCode:
    """An agent that describes every function the same way and, as a coder, returns 0."""

    def complete(self, conversations, *, answers=None, stop=None):
        return self(conversations)

    def __call__(self, conversations):
        return [
            "```python\ndef test_func(*args):\n    return 0\n```"
            if "Write a Python function" in c[-1]["content"]
            else "Description: returns zero"
            for c in conversations
        ]


def test_a_self_graded_run_says_so_at_the_top(tmp_path, monkeypatch):
    agent_config = backends.RandomProberBackendConfig(seed=7)
    build = backends.Backends.build
    monkeypatch.setattr(
        backends.Backends,
        "build",
        lambda self, b: _DescribeAndCode() if b == agent_config else build(self, b),
    )
    result = pipeline.evaluate(
        run_dir=str(tmp_path),
        policy=agent_config,
        judge=backends.ScriptedJudgeBackendConfig(),
        coder="self",
        modes=("in_context",),
        scoring=ScoringConfig(bootstrap_resamples=200),
    )
    assert result["grading"]["self_graded"] and result["grading"]["coder"].startswith("self")
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert next(iter(metrics)) == "grading" and metrics["grading"]["self_graded"] is True
    report = (tmp_path / "report.md").read_text().splitlines()
    assert report[0].startswith("# ") and report[2].startswith("**Self-graded**")


class _WrongCoderHandler(_OracleHandler):
    """A coder endpoint whose every function returns 0."""

    policy = staticmethod(
        lambda conversations: ["```python\ndef test_func(*args):\n    return 0\n```"]
    )


def test_a_wrong_coder_scores_below_one_against_the_stored_outputs(tmp_path):
    from pau_jax.env.episode import EpisodeConfig
    from pau_jax.policy.http import HTTPConfig
    from pau_jax.sandbox import Executor, equality

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _WrongCoderHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        coder = backends.HTTPBackendConfig(http=HTTPConfig(base_url=url, model="zero"))
        result = pipeline.evaluate(
            run_dir=str(tmp_path),
            policy=backends.OracleBackendConfig(n_probes=1),
            judge=backends.ScriptedJudgeBackendConfig(),
            coder=coder,
            episode_config=EpisodeConfig(call_budget=2),
            scoring=ScoringConfig(bootstrap_resamples=200),
        )
    finally:
        httpd.shutdown()
        httpd.server_close()
    with Executor(workers=1) as ex:
        _, references = demo_tasks.load(ex, EpisodeConfig())
    # Per task, the share of stored held-out outputs that are the int 0 (typed: not 0.0 or False).
    expected = {
        tid: sum(equality.typed_equal(o, 0) for o in ref.held_out_outputs) / len(ref.held_out)
        for tid, ref in references.items()
    }
    scored = [json.loads(x) for x in _lines(tmp_path / "interactive_scored.jsonl")]
    assert {r["task_id"]: r["code_match"] for r in scored} == pytest.approx(expected)
    assert all(r["code_match_incomparable"] == 0 for r in scored)
    mean = result["runs"]["interactive"]["code_match"]["mean"]
    assert mean == pytest.approx(sum(expected.values()) / 4) and mean < 1.0


def test_launch_eval_tiny_writes_every_artefact(tmp_path):
    run_dir = tmp_path / "run"
    proc = launching.launch(
        "--gin_file=eval/interactive.gin",
        "--gin_file=debug/eval_tiny.gin",
        f"--run_dir={run_dir}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "[eval] interactive: episodes=4 code_match=1.000" in proc.stdout
    for name in ("config.gin", "run_info.json", "operative_config.gin", "metrics.json",
                 "report.md", "judge_scores.png", "code_match.png",
                 "interactive_vs_in_context.png"):  # fmt: skip
        assert (run_dir / name).stat().st_size > 0, name
    assert "run_mode = 'eval'" in (run_dir / "config.gin").read_text()
    assert "OracleBackendConfig" in (run_dir / "operative_config.gin").read_text()
    for mode in ("interactive", "in_context"):
        episodes = [json.loads(x) for x in _lines(run_dir / f"{mode}_episodes.jsonl")]
        assert len(episodes) == 4
        for run in (mode, f"{mode}+observations"):
            scored = [json.loads(x) for x in _lines(run_dir / f"{run}_scored.jsonl")]
            assert [r["code_match"] for r in scored] == [1.0] * 4
            assert all(r["judge_score"] in range(1, 6) and r["source"] == "demo" for r in scored)
    interactive = [json.loads(x) for x in _lines(run_dir / "interactive_episodes.jsonl")]
    assert all(r["n_calls"] == 2 and r["stopped_by_agent"] for r in interactive)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["episode_config"]["call_budget"] == 3
    assert metrics["bootstrap"] == {"seed": 0, "resamples": 1000}


@pytest.mark.parametrize(
    "files",
    [
        ("eval/interactive.gin",),
        ("eval/in_context.gin",),
        ("eval/interactive.gin", "debug/eval_tiny.gin"),
        ("eval/in_context.gin", "debug/eval_tiny.gin"),
        ("eval/memory.gin",),
        ("eval/ft.gin",),
        ("eval/gold.gin",),
    ],
)
def test_eval_gin_files_parse(files, tmp_path):
    # A template alone leaves its required seats and inputs unset (the dry run refuses it): set
    # them, with a checkpoint and a built split the dry run finds.
    required = []
    if "debug/eval_tiny.gin" not in files:
        required = [*launching.dry_run_inputs(tmp_path), "--gin.CODER='self'"]
        if files[0] != "eval/gold.gin":
            required.append("--gin.JUDGE='self'")
        if files[0] == "eval/memory.gin":
            embedder = launching.checkpoint_folder(tmp_path / "embedder")
            required.append(f"--gin.EMBEDDING_CHECKPOINT='{embedder}'")
    proc = launching.launch(
        *[f"--gin_file={f}" for f in files], *required, "--dry_run", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "run_defaults.run_mode = 'eval'" in proc.stdout
    expected = {
        "eval/in_context.gin": ["evaluate.title = 'PAU evaluation (in-context)'"],
        "eval/memory.gin": [
            "evaluate.modes = ('interactive', 'memory')",
            "MemoryConfig.top_k = 5",
            "LocalEmbeddingConfig.max_length = 1024",
            "LocalEmbeddingConfig.batch_size = 32",
            "train/DatasetConfig.split = 'train'",
        ],
        "eval/ft.gin": [
            "evaluate.modes = ('in_context', 'ft')",
            "evaluate.baselines = {'ft': @pau_jax.sft.finetune.train_adapter}",
            "ft/SFTConfig.learning_rate = 2e-05",
            "ft/SFTConfig.epochs = 5",
            "ft/SFTConfig.batch_size = 8",
            "FineTuneConfig.patience = 3",
        ],
        "eval/gold.gin": ["evaluate.modes = ('gold',)"],
    }
    for line in expected.get(files[0], []):
        assert line in proc.stdout, line


def test_episode_calls_and_scoring_have_their_own_timeouts(tmp_path, monkeypatch):
    from pau_jax.env import runner
    from pau_jax.evaluation import score

    seen = {}
    run, scored = runner.run_episodes, score.score_episodes

    def run_spy(*args, call_timeout_s, **kwargs):
        seen["episode"] = call_timeout_s
        return run(*args, call_timeout_s=call_timeout_s, **kwargs)

    def score_spy(*args, timeout_s, **kwargs):
        seen["score"] = timeout_s
        return scored(*args, timeout_s=timeout_s, **kwargs)

    monkeypatch.setattr(pipeline.runner, "run_episodes", run_spy)
    monkeypatch.setattr(pipeline.score, "score_episodes", score_spy)
    pipeline.evaluate(
        run_dir=str(tmp_path),
        policy=backends.OracleBackendConfig(n_probes=1),
        dataset=DemoTasksConfig(limit=1),
        call_timeout_s=30.0,
        **SCRIPTED | {"scoring": ScoringConfig(timeout_s=0.5, attribute_failures=False)},
    )
    assert seen == {"episode": 30.0, "score": 0.5}


def _closed_port_url() -> str:
    """A base URL on 127.0.0.1 where nothing listens (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def _refused_seat(url: str, model: str) -> backends.HTTPBackendConfig:
    from pau_jax.policy.http import HTTPConfig

    http = HTTPConfig(base_url=url, model=model, max_retries=1, backoff_s=0.01, timeout_s=2)
    return backends.HTTPBackendConfig(http=http)


class _JudgeHandler(_OracleHandler):
    """A judge endpoint answering as the scripted overlap judge."""

    policy = scripted.OverlapJudge()


def test_a_refused_judge_stops_the_run_and_a_rerun_resumes(tmp_path):
    from pau_jax.policy.http import EndpointError

    url = _closed_port_url()
    kwargs = dict(
        policy=backends.OracleBackendConfig(n_probes=1),
        coder=backends.ScriptedCoderBackendConfig(),
        episode_config=pipeline.EpisodeConfig(call_budget=2),
        scoring=ScoringConfig(bootstrap_resamples=200),
    )
    with pytest.raises(EndpointError) as raised:
        pipeline.evaluate(run_dir=str(tmp_path), judge=_refused_seat(url, "j"), **kwargs)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(
        f"judge seat: endpoint {url}/chat/completions (model j) failed after 2 attempts: URLError"
    )
    # The finished episodes stay; nothing was scored (no empty verdict stands in for the judge).
    episodes = _lines(tmp_path / "interactive_episodes.jsonl")
    assert len(episodes) == 4
    scored = tmp_path / "interactive_scored.jsonl"
    assert not scored.exists() or not scored.read_text()
    assert not (tmp_path / "metrics.json").exists()
    # A rerun once the judge's endpoint is up scores the same episodes; none is run again.
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), _JudgeHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        result = pipeline.evaluate(run_dir=str(tmp_path), judge=_refused_seat(url, "j"), **kwargs)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert _lines(tmp_path / "interactive_episodes.jsonl") == episodes
    assert len(_lines(scored)) == 4
    run = result["runs"]["interactive"]
    assert run["judge"]["n"] == 4 and run["judge"]["unparsed"] == 0
    assert run["code_match"]["mean"] == 1.0


def test_a_refused_agent_records_nothing(tmp_path):
    from pau_jax.policy.http import EndpointError

    url = _closed_port_url()
    with pytest.raises(EndpointError, match=f"^agent seat: endpoint {url}/chat/completions"):
        pipeline.evaluate(
            run_dir=str(tmp_path), policy=_refused_seat(url, "a"), modes=("in_context",), **SCRIPTED
        )
    episodes = tmp_path / "in_context_episodes.jsonl"
    assert not episodes.exists() or not episodes.read_text()


def test_corrupt_lines_are_moved_aside_counted_and_their_items_redone(tmp_path, capsys):
    kwargs = dict(
        policy=backends.OracleBackendConfig(n_probes=1), modes=("in_context",), **SCRIPTED
    )
    pipeline.evaluate(run_dir=str(tmp_path), **kwargs)
    episodes, scored = tmp_path / "in_context_episodes.jsonl", tmp_path / "in_context_scored.jsonl"
    for path, bad in ((episodes, 2), (scored, 1)):
        lines = _lines(path)
        lines[bad] = lines[bad][: len(lines[bad]) // 2]  # cut in the middle, newline kept
        path.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    result = pipeline.evaluate(run_dir=str(tmp_path), **kwargs)
    err = capsys.readouterr().err
    assert f"{episodes}:3: corrupt record" in err and f"{scored}:2: corrupt record" in err
    assert result["corrupt_records"] == {
        "in_context_episodes.jsonl": 1,
        "in_context_scored.jsonl": 1,
    }
    assert len(_lines(tmp_path / "in_context_episodes.jsonl.corrupt")) == 1
    assert result["runs"]["in_context"]["episodes"] == 4
    assert result["runs"]["in_context"]["code_match"]["mean"] == 1.0
    for path in (episodes, scored):
        records = pipeline.runner.load_records(path)
        assert len({r["task_id"] for r in records}) == len(records) == 4
    report = (tmp_path / "report.md").read_text()
    assert (
        "in_context_scored.jsonl: 1 corrupt line moved to in_context_scored.jsonl.corrupt" in report
    )


def test_a_score_of_an_episode_since_redone_is_set_aside_and_scored_again(tmp_path, capsys):
    """A scored row must belong to the episode beside it, not to the one it replaced."""
    kwargs = dict(
        policy=backends.OracleBackendConfig(n_probes=1), modes=("in_context",), **SCRIPTED
    )
    pipeline.evaluate(run_dir=str(tmp_path), **kwargs)
    scored = tmp_path / "in_context_scored.jsonl"
    rows = [json.loads(x) for x in _lines(scored)]
    # The row of task 1 as an earlier, since redone, episode of that task left it.
    rows[1] = dict(rows[1], prediction="an older episode's description", code_match=0.0)
    scored.write_text("".join(json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    result = pipeline.evaluate(run_dir=str(tmp_path), **kwargs)
    assert "1 record moved to in_context_scored.jsonl.stale" in capsys.readouterr().err
    assert result["runs"]["in_context"]["code_match"]["mean"] == 1.0
    stale = [json.loads(x) for x in _lines(tmp_path / "in_context_scored.jsonl.stale")]
    assert [r["prediction"] for r in stale] == ["an older episode's description"]
    again = pipeline.runner.load_records(scored)
    assert len(again) == 4 and all(r["code_match"] == 1.0 for r in again)
    # A rerun with nothing redone moves nothing.
    before = scored.read_bytes()
    pipeline.evaluate(run_dir=str(tmp_path), **kwargs)
    assert scored.read_bytes() == before and ".stale" not in capsys.readouterr().err


def test_launch_stops_with_one_line_naming_a_refused_judge(tmp_path):
    url = _closed_port_url()
    run_dir = tmp_path / "run"
    judge = "judge/pau_jax.policy.http.HTTPConfig"
    proc = launching.launch(
        "--gin_file=eval/interactive.gin",
        "--gin_file=debug/eval_tiny.gin",
        f"--run_dir={run_dir}",
        "--gin.pau_jax.experiment.evaluate.modes=('interactive',)",
        "--gin.pau_jax.experiment.evaluate.judge=@judge/pau_jax.policy.backends.HTTPBackendConfig()",
        f"--gin.{judge}.base_url='{url}'",
        f"--gin.{judge}.model='j'",
        f"--gin.{judge}.max_retries=1",
        f"--gin.{judge}.backoff_s=0.01",
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    expected = f"judge seat: endpoint {url}/chat/completions (model j) failed after 2 attempts: "
    lines = [x for x in proc.stderr.splitlines() if expected in x]
    assert len(lines) == 1, proc.stderr[-4000:]
    assert "URLError" in lines[0] and "rerun to resume" in lines[0]
    assert len(_lines(run_dir / "interactive_episodes.jsonl")) == 4
    assert not (run_dir / "metrics.json").exists()


def _demo_run(run_dir, **changes):
    """The oracle agent on the demo tasks with the scripted judge and coder."""
    settings = dict(
        policy=backends.OracleBackendConfig(n_probes=2),
        episode_config=pipeline.EpisodeConfig(call_budget=3),
        **SCRIPTED,
    )
    return pipeline.evaluate(run_dir=str(run_dir), **(settings | changes))


def _contents(run_dir):
    """File name -> bytes of every file but the lock (which names its latest holder)."""
    return {
        p.name: p.read_bytes()
        for p in pathlib.Path(run_dir).iterdir()
        if p.is_file() and p.name != run_claim.LOCK_FILE
    }


def test_a_rerun_with_another_agent_or_settings_is_refused_naming_the_fields(tmp_path):
    _demo_run(tmp_path)
    before = _contents(tmp_path)
    with pytest.raises(run_claim.RunDirError) as raised:
        _demo_run(tmp_path, policy=backends.RandomProberBackendConfig(seed=1))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(
        f"{tmp_path} holds results of other settings (agent: OracleBackendConfig(...) -> "
        "RandomProberBackendConfig(...)); "
    )
    assert message.endswith(
        f"another directory (--run_dir), or delete {tmp_path} to start it again"
    )
    changed = r"\(agent\.n_probes: 2 -> 3; episode_config\.call_budget: 3 -> 4\)"
    with pytest.raises(run_claim.RunDirError, match=changed):
        _demo_run(
            tmp_path,
            policy=backends.OracleBackendConfig(n_probes=3),
            episode_config=pipeline.EpisodeConfig(call_budget=4),
        )
    with pytest.raises(
        run_claim.RunDirError, match=r"coder: ScriptedCoderBackendConfig\(\.\.\.\) -> 'self'"
    ):
        _demo_run(tmp_path, coder="self")
    with pytest.raises(run_claim.RunDirError, match=r"modes: \[\"interactive\"\] -> \["):
        _demo_run(tmp_path, modes=("interactive", "in_context"))
    assert _contents(tmp_path) == before  # Nothing was run, scored or reported again.


def test_a_rerun_with_the_same_settings_resumes_what_is_left(tmp_path):
    _demo_run(tmp_path)
    fingerprint = (tmp_path / run_claim.FINGERPRINT_FILE).read_text()
    episodes = tmp_path / "interactive_episodes.jsonl"
    kept = _lines(episodes)[:3]
    episodes.write_text("\n".join(kept) + "\n")
    # Limits, batching, workers and what is computed afresh from the records may change.
    result = _demo_run(
        tmp_path,
        sandbox_workers=1,
        call_timeout_s=5.0,
        max_parallel_calls=2,
        scoring=ScoringConfig(timeout_s=5.0, batch_size=2, bootstrap_resamples=200),
        title="resumed",
    )
    assert _lines(episodes)[:3] == kept and len(_lines(episodes)) == 4
    assert result["runs"]["interactive"]["episodes"] == 4
    assert (tmp_path / run_claim.FINGERPRINT_FILE).read_text() == fingerprint


def test_a_second_writer_is_refused_while_the_first_holds_the_run_directory(tmp_path):
    holder = {"pid": 4242, "host": "elsewhere", "started": "2026-01-01T00:00:00+0000"}
    with open(tmp_path / run_claim.LOCK_FILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write(json.dumps(holder))
        lock.flush()
        with pytest.raises(run_claim.RunDirError) as raised:
            _demo_run(tmp_path)
        assert str(raised.value) == (
            f"{tmp_path} is in use by another run (pid 4242 on elsewhere, since "
            "2026-01-01T00:00:00+0000); wait for it to end, or write this run to another "
            "directory (--run_dir)"
        )
        assert [p.name for p in tmp_path.iterdir()] == [run_claim.LOCK_FILE]  # Nothing written.
    # Once the first writer is done, the run goes ahead.
    assert _demo_run(tmp_path)["runs"]["interactive"]["episodes"] == 4


# Takes the lock of the run directory argv[1], says so, and waits to be killed.
_HOLD_THE_LOCK = (
    "import sys, time\n"
    "from pau_jax import run_claim\n"
    "held = run_claim.lock(sys.argv[1])\n"
    "held.__enter__()\n"
    "print('held', flush=True)\n"
    "time.sleep(600)\n"
)


def test_the_lock_of_a_run_killed_with_sigkill_is_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_THE_LOCK, str(run_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        start_new_session=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(
            run_claim.RunDirError, match=rf"in use by another run \(pid {holder.pid} on "
        ):
            _demo_run(run_dir)
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    # The lock ended with its process: no stale lock to clear by hand.
    assert _demo_run(run_dir)["runs"]["interactive"]["episodes"] == 4
    assert json.loads((run_dir / run_claim.LOCK_FILE).read_text())["pid"] == os.getpid()


def test_launch_refuses_a_run_directory_in_use_or_of_other_settings_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    args = (
        "--gin_file=eval/interactive.gin",
        "--gin_file=debug/eval_tiny.gin",
        f"--run_dir={run_dir}",
    )
    run_dir.mkdir()
    (run_dir / "config.gin").write_text("# the config of the run that holds the folder\n")

    def refused(proc, message):
        assert proc.returncode == 1, proc.stderr[-4000:]
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and message in errors[0], proc.stderr[-4000:]
        # The records of the run whose results the folder holds are left as they were.
        assert (run_dir / "config.gin").read_text().startswith("# the config of the run")
        assert not (run_dir / "run_info.json").exists()

    with run_claim.lock(run_dir):  # This process holds it; the launcher is another one.
        proc = launching.launch(*args, cwd=tmp_path)
    refused(proc, f"error: {run_dir} is in use by another run (pid {os.getpid()} on ")
    # The folder holds the results of another agent.
    settings = {"agent": backends.RandomProberBackendConfig()}
    with run_claim.claim(run_dir, kind="eval", settings=settings):
        (run_dir / "interactive_episodes.jsonl").write_text('{"task_id": "demo/affine"}\n')
    proc = launching.launch(*args, cwd=tmp_path)
    refused(proc, "(agent: RandomProberBackendConfig(...) -> OracleBackendConfig(...))")
