"""The description verifier against a fake OpenAI-compatible annotator and coder."""

import contextlib
import json
import threading

import chat_stub
import pytest

from pau_jax.data import verified_descriptions as verified
from pau_jax.data.pipeline import Example, Record
from pau_jax.sandbox import values
from pau_jax.tasks import pau_dataset
from pau_jax.tools import verify_descriptions

INPUTS = [(0,), (1,), (5,), (-3,)]
# The annotator describes both functions as adding one: right for the first only.
FUNCTIONS = {"CRUXEval/sample_0": "x + 1", "CRUXEval/sample_1": "x * 2"}


def _record(task_id, body):
    fn = eval(f"lambda x: {body}")  # noqa: S307 - the test's own two expressions.
    return Record(
        task_id=task_id,
        source="cruxeval",
        entry_point="f",
        header="def test_func(arg0):",
        code=f"def test_func(arg0):\n    x = arg0\n    return {body}\n",
        anonymized_code="",
        original_code=f"def f(x):\n    return {body}\n",
        description="",
        description_origin="none",
        arg_types=("int",),
        shown=(),
        heldout=tuple(Example(args=values.encode(a), output=values.encode(fn(*a))) for a in INPUTS),
        statement_coverage=1.0,
        branch_coverage=1.0,
        n_statements=1,
        n_branches=0,
        n_seeds=1,
        n_candidates=1,
    )


def _answer(body):
    """The annotator describes both functions as adding one; the coder writes that."""
    if "Describe what the following Python function does" in body["messages"][-1]["content"]:
        return "It returns its argument plus one."
    return "```python\ndef test_func(arg0):\n    return arg0 + 1\n```"


@contextlib.contextmanager
def _serving(monkeypatch, tmp_path, answer):
    """(base URL, requests seen) of an annotator and coder answering with `answer`; the split
    is two hand-made records."""
    monkeypatch.setenv("PAU_ANNOTATOR_MODEL", "annotator-m")
    monkeypatch.setenv("PAU_ANNOTATOR_CACHE_DIR", str(tmp_path / "cache"))
    records = [_record(t, body) for t, body in FUNCTIONS.items()]
    monkeypatch.setattr(pau_dataset, "load_split", lambda *a, **k: records)
    with chat_stub.serve(answer) as (url, seen):
        monkeypatch.setenv("PAU_ANNOTATOR_BASE_URL", url)
        yield url, seen


@pytest.fixture
def endpoint(monkeypatch, tmp_path):
    with _serving(monkeypatch, tmp_path, _answer) as served:
        yield served


def test_keeps_what_execution_verifies_and_resumes(endpoint, tmp_path, capsys):
    url, seen = endpoint
    out = tmp_path / "kept.jsonl"
    argv = ["--coder_base_url", url, "--coder_model", "coder-m", "--out", str(out)]
    assert verify_descriptions.main(argv) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "kept=1 of 2"
    kept = verified.read(out)
    assert list(kept) == ["CRUXEval/sample_0"]
    entry = kept["CRUXEval/sample_0"]
    assert (entry.matched, entry.held_out, entry.annotator) == (4, 4, "annotator-m")
    assert entry.code_sha256 == verified.code_sha256("def f(x):\n    return x + 1\n")
    rejected = [
        json.loads(x) for x in (tmp_path / "kept.jsonl.rejected.jsonl").read_text().splitlines()
    ]
    # x * 2 equals x + 1 only at x = 1: one of four.
    assert [(r["task_id"], r["matched"], r["held_out"]) for r in rejected] == [
        ("CRUXEval/sample_1", 1, 4)
    ]
    asked = len(seen)
    assert verify_descriptions.main(argv) == 0  # Both items are done: nothing is asked again.
    assert capsys.readouterr().out.splitlines()[-1] == "kept=0 of 0"
    assert len(seen) == asked


def test_the_coder_and_the_annotator_must_be_given(monkeypatch):
    with pytest.raises(SystemExit):
        verify_descriptions.parse_args([])
    monkeypatch.delenv("PAU_ANNOTATOR_BASE_URL", raising=False)
    with pytest.raises(SystemExit, match="PAU_ANNOTATOR_BASE_URL"):
        verify_descriptions.main(["--coder_base_url", "http://x/v1", "--coder_model", "m"])


def test_a_chunk_s_descriptions_are_asked_for_at_once(monkeypatch, tmp_path, capsys):
    # The annotator answers only once both of the chunk's requests are in flight, as a
    # batching server fills a batch: one at a time, the first would wait out the barrier.
    both = threading.Barrier(2, timeout=10)

    def answer(body):
        if "Describe what the following Python function does" in body["messages"][-1]["content"]:
            both.wait()
        return _answer(body)

    with _serving(monkeypatch, tmp_path, answer) as (url, _):
        argv = ["--coder_base_url", url, "--coder_model", "c", "--out", str(tmp_path / "k.jsonl")]
        assert verify_descriptions.main([*argv, "--batch", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "kept=1 of 2"
