"""The batched episode runner over the real sandbox, driven by scripted policies."""

import dataclasses
import http.server
import json
import threading

import pytest

from pau_jax.env import answer_shape, display, episode, jsonl, runner
from pau_jax.env.episode import EpisodeConfig
from pau_jax.policy.http import EndpointError, HTTPConfig, HTTPPolicy
from pau_jax.policy.local import Completion
from pau_jax.sandbox import Executor
from pau_jax.tasks import demo as demo_tasks

# Inputs a scripted prober tries, per task, in order.
PROBES = {
    "demo/affine": ["(4, 5)", "(-1, 3)", "(10, 0)"],
    "demo/vowels": ["'queue'", "''", "'AEIOU'"],
    "demo/runs": ["'aaa'", "''", "'abba'"],
    "demo/sorted": ["[]", "[5, 5, 1]", "[1, 2, 3]"],
}


class ScriptedPolicy:
    """Answers each phase from a fixed script keyed by the task's header and call count."""

    def __init__(self, stop_after=2):
        self.stop_after = stop_after
        self.batch_sizes = []

    def complete(self, conversations, *, answers=None, stop=None):
        del answers, stop  # a script writes what it writes
        self.batch_sizes.append(len(conversations))
        return [self._reply(c[-1]["content"]) for c in conversations]

    def __call__(self, conversations):
        return self.complete(conversations)

    def _reply(self, content):
        task_id = next(
            t.task_id for t in demo_tasks.DEMO_TASKS if _examples_key(t.task_id) in content
        )
        done = content.count(" -> ") - 2  # observations shown beyond the two examples
        if "Now write the arguments" in content:
            return "```\n" + PROBES[task_id][done] + "\n```"
        if "Revise your hypothesis" in content:
            decision = "STOP" if done >= self.stop_after else "CONTINUE"
            return f"Hypothesis: {task_id} after {done} calls\nDecision: {decision}"
        return f"I will probe {task_id} further."


def _examples_key(task_id):
    return {
        "demo/affine": "test_func(2, 3) -> 7",
        "demo/vowels": "test_func('hello') -> 2",
        "demo/runs": "test_func('aab') -> [('a', 2), ('b', 1)]",
        "demo/sorted": "test_func([1, 2, 2]) -> True",
    }[task_id]


@pytest.fixture(scope="module")
def executor():
    with Executor(workers=2) as ex:
        yield ex


@pytest.fixture(scope="module")
def specs(executor):
    return demo_tasks.demo_specs(executor, EpisodeConfig())


def _strip_timing(records):
    return sorted(
        ({k: v for k, v in r.items() if k != "seconds"} for r in records),
        key=lambda r: r["task_id"],
    )


def test_episodes_run_and_observations_are_typed(specs, executor):
    policy = ScriptedPolicy(stop_after=2)
    records = runner.run_episodes(specs, policy, executor, EpisodeConfig(), progress=False)
    by_id = {r["task_id"]: r for r in records}
    assert set(by_id) == set(PROBES)
    assert all(r["finish_reason"] == "stop" and r["n_calls"] == 2 for r in records)
    assert by_id["demo/affine"]["observations"][0] == {"call": "test_func(4, 5)", "result": "21"}
    assert by_id["demo/runs"]["observations"][0]["result"] == "[('a', 3)]"
    assert by_id["demo/vowels"]["observations"][1] == {"call": "test_func('')", "result": "0"}
    # All four episodes shared every policy call (3 phases x 2 queries).
    assert policy.batch_sizes == [4] * 6


def test_batched_equals_one_at_a_time(specs, executor):
    config = EpisodeConfig(call_budget=3)
    batched = runner.run_episodes(
        specs, ScriptedPolicy(stop_after=9), executor, config, progress=False
    )
    single = []
    for spec in specs:
        single += runner.run_episodes(
            [spec], ScriptedPolicy(stop_after=9), executor, config, progress=False
        )
    assert _strip_timing(batched) == _strip_timing(single)
    assert all(r["finish_reason"] == "budget" for r in batched)


def test_at_most_max_active_episodes_share_a_call_and_the_rest_follow(specs, executor):
    """Two episodes in flight: a new one starts as one ends, the records are those of a
    run of all at once, and no call holds more than two conversations."""
    config = EpisodeConfig(call_budget=3)
    together = runner.run_episodes(
        specs, ScriptedPolicy(stop_after=2), executor, config, progress=False
    )
    policy = ScriptedPolicy(stop_after=2)
    records = runner.run_episodes(specs, policy, executor, config, progress=False, max_active=2)
    assert _strip_timing(records) == _strip_timing(together)
    assert max(policy.batch_sizes) == 2 and len(policy.batch_sizes) > 6
    with pytest.raises(ValueError, match="max_active must be >= 1"):
        runner.run_episodes(specs, policy, executor, config, progress=False, max_active=0)


def test_resume_skips_finished_and_survives_a_torn_line(specs, executor, tmp_path):
    out = tmp_path / "episodes.jsonl"
    config = EpisodeConfig()
    first = runner.run_episodes(
        specs[:2], ScriptedPolicy(), executor, config, out_path=out, progress=False
    )
    assert len(first) == 2
    with out.open("a") as f:
        f.write('{"task_id": "demo/runs", "trunc')  # a crash in the middle of a write
    policy = ScriptedPolicy()
    second = runner.run_episodes(specs, policy, executor, config, out_path=out, progress=False)
    assert sorted(r["task_id"] for r in second) == ["demo/runs", "demo/sorted"]
    assert policy.batch_sizes[0] == 2
    ids = [r["task_id"] for r in runner.load_records(out)]
    assert sorted(ids) == sorted(PROBES)
    assert runner.finished_ids(out) == set(PROBES)
    # A third run has nothing left to do.
    assert (
        runner.run_episodes(specs, ScriptedPolicy(), executor, config, out_path=out, progress=False)
        == []
    )


def test_records_are_json_and_hold_the_prompts(specs, executor, tmp_path):
    out = tmp_path / "e.jsonl"
    runner.run_episodes(
        specs[:1], ScriptedPolicy(), executor, EpisodeConfig(), out_path=out, progress=False
    )
    record = json.loads(out.read_text().splitlines()[0])
    assert [s["phase"] for s in record["steps"]][:3] == ["conceptualize", "generate", "revise"]
    assert record["steps"][1]["messages"][0]["role"] == "system"
    assert record["steps"][1]["call"] == "test_func(4, 5)" and record["steps"][1]["call_ok"]


def test_duplicate_ids_rejected(specs, executor):
    with pytest.raises(ValueError, match="unique"):
        runner.run_episodes(
            [specs[0], specs[0]], ScriptedPolicy(), executor, EpisodeConfig(), progress=False
        )


class RecordingPolicy(ScriptedPolicy):
    """The scripted replies; records the answer shapes each call was given."""

    def __init__(self):
        super().__init__(stop_after=1)
        self.answers = []

    def complete(self, conversations, *, answers=None, stop=None):
        self.answers.append(answers)
        return super().complete(conversations, answers=answers, stop=stop)


def test_every_policy_is_given_each_episodes_answer_shape(specs, executor):
    policy = RecordingPolicy()  # not a LocalPolicy: the runner gives any policy the shapes
    config = EpisodeConfig(call_budget=1)
    finished = runner.run_episode_states(specs, policy, executor, config, progress=False)
    assert len(policy.answers) == 3  # conceptualise, generate, revise: one call per round
    assert all(len(a) == len(specs) for a in policy.answers)
    assert policy.answers[0] == [None] * len(specs)  # nothing is asked of a plan's form
    by_id = {f.spec.episode_id: f for f in finished}
    for spec, shape in zip(specs, policy.answers[1], strict=True):  # the input phase
        assert shape.kind == "input" and shape.arity == spec.task.n_params
        state = episode.start(spec.task, config)
        plan = by_id[spec.episode_id].state.steps[0].output
        assert shape == answer_shape.answer_shape(
            episode.on_conceptualize(state, plan, config), config
        )
    assert [a.kind for a in policy.answers[2]] == ["decision"] * len(specs)


def test_render_call_single_tuple_argument():
    assert display.render_call(((1, 2),)) == "test_func((1, 2))"


class CompletionPolicy:
    """The scripted replies wrapped as reply objects with token ids, like LocalPolicy.complete."""

    def __init__(self):
        self.inner = ScriptedPolicy(stop_after=1)

    def complete(self, conversations, *, answers=None, stop=None):
        return [
            Completion(
                text=text,
                finish_reason="stop",
                prompt_tokens=3,
                completion_tokens=len(text),
                prompt_ids=(1, 2, 3),
                token_ids=tuple(range(len(text))),
                logprobs=(-0.5,) * len(text),
            )
            for text in self.inner.complete(conversations, answers=answers, stop=stop)
        ]


def test_one_task_many_times_keeps_states_and_replies(specs, executor, tmp_path):
    group = [dataclasses.replace(specs[0], episode_id=f"affine#{g}") for g in range(3)]
    assert specs[0].episode_id == "demo/affine"  # defaults to the task id
    out = tmp_path / "group.jsonl"
    finished = runner.run_episode_states(
        group, CompletionPolicy(), executor, EpisodeConfig(), out_path=out, progress=False
    )
    assert sorted(f.spec.episode_id for f in finished) == ["affine#0", "affine#1", "affine#2"]
    for f in finished:
        assert f.state.finish_reason == "stop" and len(f.replies) == len(f.state.steps) == 3
        assert [r.text for r in f.replies] == [s.output for s in f.state.steps]
        assert f.record["episode_id"] == f.spec.episode_id
        assert f.record["task_id"] == "demo/affine"
        assert f.record["steps"][0]["finish_reason"] == "stop"
        assert f.record["steps"][0]["completion_tokens"] == len(f.replies[0].text)
    assert runner.finished_ids(out) == {"affine#0", "affine#1", "affine#2"}
    # The same records through run_episodes (which returns the JSON records only).
    again = runner.run_episodes(
        group, CompletionPolicy(), executor, EpisodeConfig(), progress=False
    )
    assert _strip_timing(again) == _strip_timing([f.record for f in finished])


def test_records_without_episode_ids_resume_by_task_id(specs, tmp_path):
    out = tmp_path / "old.jsonl"
    out.write_text(json.dumps({"task_id": "demo/affine"}) + "\n")
    assert runner.finished_ids(out) == {"demo/affine"}


def test_an_episode_recorded_twice_is_read_once(tmp_path, capsys):
    # Two runs that appended to one file at once (before run directories were locked): the
    # first complete record of each episode id is kept, one warning counts those dropped.
    path = tmp_path / "episodes.jsonl"
    rows = [
        {"task_id": "demo/affine", "episode_id": "demo/affine", "prediction": "first"},
        {"task_id": "demo/runs", "prediction": "no episode id"},
        {"task_id": "demo/affine", "episode_id": "demo/affine", "prediction": "second"},
        {"task_id": "demo/affine", "episode_id": "demo/affine#1", "prediction": "another id"},
        {"task_id": "demo/runs", "prediction": "again"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"task_id": "demo/sor')
    records = runner.load_records(path)
    assert [r["prediction"] for r in records] == ["first", "no episode id", "another id"]
    assert runner.finished_ids(path) == {"demo/affine", "demo/runs", "demo/affine#1"}
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and f"{path}: 2 records of episodes recorded earlier" in warnings[0]
    assert path.read_text().count("\n") == len(rows)  # Reading changes nothing in the file.


def test_duplicate_episode_ids_rejected(specs, executor):
    twins = [dataclasses.replace(specs[0], episode_id="x")] * 2
    with pytest.raises(ValueError, match="unique"):
        runner.run_episodes(twins, ScriptedPolicy(), executor, EpisodeConfig(), progress=False)


def test_a_prompt_the_policy_refuses_as_too_long_ends_that_episode(specs, executor):
    class Refusing(ScriptedPolicy):
        """Refuses the affine task's prompts once they show a call (too long)."""

        def complete(self, conversations, *, answers=None, stop=None):
            texts = super().complete(conversations, answers=answers, stop=stop)
            out = []
            for c, text in zip(conversations, texts):
                content = c[-1]["content"]
                refuse = _examples_key("demo/affine") in content and "test_func(4, 5) ->" in content
                out.append(
                    Completion(
                        text="" if refuse else text,
                        finish_reason="prompt_length" if refuse else "stop",
                        prompt_tokens=1,
                        completion_tokens=0 if refuse else 1,
                    )
                )
            return out

    finished = runner.run_episode_states(
        specs, Refusing(stop_after=2), executor, EpisodeConfig(), progress=False
    )
    by_id = {f.spec.episode_id: f for f in finished}
    affine = by_id["demo/affine"]
    # C, G (the call), then the reflection prompt is refused: no step, no reply for it.
    assert affine.state.finish_reason == "prompt_length" and affine.state.n_calls == 1
    assert len(affine.state.steps) == len(affine.replies) == 2
    assert affine.record["finish_reason"] == "prompt_length"
    assert all(by_id[t].state.finish_reason == "stop" for t in PROBES if t != "demo/affine")


def test_a_corrupt_line_is_moved_aside_and_its_episode_redone(specs, executor, tmp_path, capsys):
    out = tmp_path / "episodes.jsonl"
    config = EpisodeConfig()
    runner.run_episodes(specs[:3], ScriptedPolicy(), executor, config, out_path=out, progress=False)
    lines = out.read_text().splitlines(keepends=True)
    lost = json.loads(lines[1])["task_id"]
    garbage = '{"task_id": "' + lost + '", "steps": [oops\n'
    out.write_text(lines[0] + garbage + lines[2])
    with pytest.raises(jsonl.CorruptRecordError, match=f"^{out}:2: corrupt record"):
        runner.load_records(out)  # a plain read stops at it, naming the file and the line
    again = runner.run_episodes(
        specs, ScriptedPolicy(), executor, config, out_path=out, progress=False
    )
    assert sorted(r["task_id"] for r in again) == sorted([lost, specs[3].task.task_id])
    assert f"{out}:2: corrupt record (not JSON" in capsys.readouterr().err
    assert jsonl.sidecar(out).read_text() == garbage  # kept, out of the way
    assert out.read_text().splitlines(keepends=True)[:2] == [lines[0], lines[2]]
    assert sorted(r["task_id"] for r in runner.load_records(out)) == sorted(PROBES)
    assert jsonl.corrupt_counts(tmp_path) == {"episodes.jsonl": 1}


@pytest.mark.parametrize(
    "line, reason",
    [
        ('{"task_id": "demo/affine", "tr', "not JSON: "),
        ("[1, 2]", "a JSON list, not an object"),
        ('{"episode_id": "x"}', "no 'task_id'"),
        ('{"task_id": "\xff"}', "not UTF-8 text"),
    ],
)
def test_reading_stops_at_a_corrupt_line_but_not_at_a_torn_tail(tmp_path, line, reason):
    path = tmp_path / "e.jsonl"
    good = json.dumps({"task_id": "demo/runs"}) + "\n"
    encoding = "latin-1" if "\xff" in line else "utf-8"
    path.write_bytes(good.encode() + line.encode(encoding) + b"\n\n" + good.encode())
    for read in (runner.load_records, runner.finished_ids):
        with pytest.raises(jsonl.CorruptRecordError) as raised:
            read(path)
        assert str(raised.value).startswith(f"{path}:2: corrupt record ({reason}")
        assert "\n" not in str(raised.value)
    # The same line last and without its newline is a torn tail (a kill): dropped, no error.
    path.write_bytes(good.encode() + line.encode(encoding))
    assert runner.load_records(path) == [{"task_id": "demo/runs"}]
    assert runner.finished_ids(path) == {"demo/runs"}
    assert jsonl.prepare(path, required=runner.RECORD_KEYS) == 0
    assert path.read_bytes() == good.encode()


class _ScriptedEndpoint(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint answering as ScriptedPolicy (affine stops after one call),
    that answers 500 to every request after the first `healthy`."""

    healthy = None
    seen = 0
    policy = ScriptedPolicy(stop_after=2)

    def log_message(self, *args):
        del args

    def do_POST(self):  # noqa: N802
        messages = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["messages"]
        cls = type(self)
        cls.seen += 1
        content = messages[-1]["content"]
        if cls.healthy is not None and cls.seen > cls.healthy:
            status, text = 500, "overloaded"
        elif "test_func(2, 3) -> 7" in content and "Revise your hypothesis" in content:
            status, text = 200, "Hypothesis: affine\nDecision: STOP"
        else:
            status, text = 200, cls.policy([messages])[0]
        body = json.dumps({"choices": [{"message": {"content": text}}]}).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_a_failing_endpoint_stops_the_run_and_a_rerun_resumes(specs, executor, tmp_path):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ScriptedEndpoint)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    policy = HTTPPolicy(HTTPConfig(base_url=url, model="m", max_retries=1, backoff_s=0.01))
    out, config = tmp_path / "episodes.jsonl", EpisodeConfig()
    try:
        # Three rounds of four requests answered: affine stops; the others' next round fails.
        _ScriptedEndpoint.healthy, _ScriptedEndpoint.seen = 12, 0
        with pytest.raises(EndpointError, match="failed after 2 attempts: HTTP 500"):
            runner.run_episodes(specs, policy, executor, config, out_path=out, progress=False)
        assert [r["task_id"] for r in runner.load_records(out)] == ["demo/affine"]
        _ScriptedEndpoint.healthy = None
        again = runner.run_episodes(specs, policy, executor, config, out_path=out, progress=False)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert sorted(r["task_id"] for r in again) == ["demo/runs", "demo/sorted", "demo/vowels"]
    records = runner.load_records(out)
    assert sorted(r["task_id"] for r in records) == sorted(PROBES)
    assert all(r["prediction"] and r["finish_reason"] == "stop" for r in records)
