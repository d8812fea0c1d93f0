"""The description verifier against a fake OpenAI-compatible annotator and coder."""

import http.server
import json
import threading

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


class _Handler(http.server.BaseHTTPRequestHandler):
    asked: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = body["messages"][-1]["content"]
        describing = "Describe what the following Python function does" in text
        type(self).asked.append("annotator" if describing else "coder")
        if describing:
            content = "It returns its argument plus one."
        else:
            content = "```python\ndef test_func(arg0):\n    return arg0 + 1\n```"
        payload = json.dumps(
            {
                "choices": [
                    {"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                ]
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoint(monkeypatch, tmp_path):
    _Handler.asked = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    monkeypatch.setenv("PAU_ANNOTATOR_BASE_URL", url)
    monkeypatch.setenv("PAU_ANNOTATOR_MODEL", "annotator-m")
    monkeypatch.setenv("PAU_ANNOTATOR_CACHE_DIR", str(tmp_path / "cache"))
    records = [_record(t, body) for t, body in FUNCTIONS.items()]
    monkeypatch.setattr(pau_dataset, "load_split", lambda *a, **k: records)
    yield url
    httpd.shutdown()
    httpd.server_close()


def test_keeps_what_execution_verifies_and_resumes(endpoint, tmp_path, capsys):
    out = tmp_path / "kept.jsonl"
    argv = ["--coder_base_url", endpoint, "--coder_model", "coder-m", "--out", str(out)]
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
    asked = len(_Handler.asked)
    assert verify_descriptions.main(argv) == 0  # Both items are done: nothing is asked again.
    assert capsys.readouterr().out.splitlines()[-1] == "kept=0 of 0"
    assert len(_Handler.asked) == asked


def test_the_coder_and_the_annotator_must_be_given(monkeypatch):
    with pytest.raises(SystemExit):
        verify_descriptions.parse_args([])
    monkeypatch.delenv("PAU_ANNOTATOR_BASE_URL", raising=False)
    with pytest.raises(SystemExit, match="PAU_ANNOTATOR_BASE_URL"):
        verify_descriptions.main(["--coder_base_url", "http://x/v1", "--coder_model", "m"])
