"""Judge parsing and code match over the real sandbox."""

import pytest

from pau_jax.evaluation import code_match, judge
from pau_jax.sandbox import Executor
from pau_jax.tasks import TaskReference


class _Policy:
    """A policy (its `complete`) answering with ``fn(conversations)``."""

    def __init__(self, fn):
        self.fn = fn

    def complete(self, conversations, *, answers=None, stop=None):
        return self.fn(conversations)


TRUE_CODE = """\
def test_func(arg0):
    if not isinstance(arg0, list):
        raise TypeError('arg0 must be a list')
    return (min(arg0), max(arg0))
"""


@pytest.fixture(scope="module")
def executor():
    with Executor(workers=2) as ex:
        yield ex


INPUTS = [([3, 1, 2],), ([5],), ([-1, -7],), ("abc",)]


def test_equivalent_rewrite_scores_one(executor):
    predicted = (
        "def test_func(arg0):\n"
        "    if type(arg0) is not list:\n"
        "        raise TypeError('no')\n"
        "    s = sorted(arg0)\n"
        "    return (s[0], s[-1])\n"
    )
    got = code_match.score_code(executor, TRUE_CODE, predicted, INPUTS)
    assert got.score == 1.0 and got.runnable and all(got.matches)


def test_list_instead_of_tuple_never_matches(executor):
    predicted = (
        "def test_func(arg0):\n"
        "    if not isinstance(arg0, list):\n"
        "        raise TypeError('x')\n"
        "    return [min(arg0), max(arg0)]\n"
    )
    got = code_match.score_code(executor, TRUE_CODE, predicted, INPUTS)
    # Only the error case matches (same exception type).
    assert got.matches == (False, False, False, True)
    assert got.score == pytest.approx(0.25)


def test_partial_and_wrong_exception(executor):
    predicted = "def test_func(arg0):\n    return (min(arg0), min(arg0))\n"
    got = code_match.score_code(executor, TRUE_CODE, predicted, INPUTS)
    # [5] matches; 'abc' gives a tuple instead of a TypeError.
    assert got.matches == (False, True, False, False)


def test_unrunnable_code_is_flagged(executor):
    for bad in ("def test_func(arg0:\n    return 1\n", "def helper(x):\n    return x\n"):
        got = code_match.score_code(executor, TRUE_CODE, bad, INPUTS)
        assert got.score == 0.0 and not got.runnable


def test_extract_code():
    text = "<think>use sorted</think>Here:\n```python\ndef test_func(a):\n    return a\n```\nDone."
    assert code_match.extract_code(text) == "def test_func(a):\n    return a\n"
    assert code_match.extract_code("def test_func(a): return a") == "def test_func(a): return a\n"
    messages = code_match.coder_messages("def test_func(arg0):", "doubles", ["test_func(2) -> 4"])
    assert "test_func(2) -> 4" in messages[0]["content"]


@pytest.mark.parametrize(
    "text,score",
    [
        ("The hypothesis is right.\nRating: 5", 5),
        ("Explanation: partly.\n**Rating:** 3", 3),
        ("<think>Rating: 1?</think>Rating: 4", 4),
        ("rating: 2 (maybe 3)", 2),
        ("Rating: 7", None),
        ("I cannot decide.", None),
    ],
)
def test_parse_rating(text, score):
    assert judge.parse_rating(text) == score


def test_judge_batches_and_keeps_unparsed_as_none():
    seen = []

    class Policy:
        def complete(self, conversations, *, answers=None, stop=None):
            seen.append((len(conversations), answers))
            return ["Fine.\nRating: 4", "no idea"]

    out = judge.judge(Policy(), [("adds", "sums"), ("sorts", "")])
    assert seen == [(2, [judge.RATING, judge.RATING])]
    assert [r.score for r in out] == [4, None]
    assert "(no description given)" in judge.judge_messages("x", "")[0]["content"]


def test_score_episodes_batches_judge_and_coder(executor):
    from pau_jax.evaluation import score
    from pau_jax.tasks import demo as demo_tasks

    tasks = {t.task_id: t for t in demo_tasks.DEMO_TASKS}
    references = {
        tid: TaskReference(
            code=t.code,
            header=t.header,
            description=t.description,
            held_out=t.held_out,
            description_origin="annotator:m verified 4/4",
        )
        for tid, t in tasks.items()
    }
    references["demo/runs"] = TaskReference(
        code=tasks["demo/runs"].code,
        header="def test_func(arg0):",
        description="",
        held_out=tasks["demo/runs"].held_out,
    )
    records = [
        {
            "task_id": tid,
            "prediction": f"guess for {tid}",
            "observations": [{"call": "test_func(1)", "result": "2"}],
        }
        for tid in tasks
    ]
    calls = []

    class JudgePolicy:
        def complete(self, conversations, *, answers=None, stop=None):
            calls.append(("judge", len(conversations)))
            return ["Rating: 4"] * len(conversations)

    judge_policy = JudgePolicy()

    class CoderPolicy:
        def complete(self, conversations, *, answers=None, stop=None):
            calls.append(("coder", len(conversations)))
            assert answers == [code_match.CODE] * len(conversations)
            assert all("test_func(1) -> 2" in c[0]["content"] for c in conversations)
            out = []
            for c in conversations:
                text = c[0]["content"]
                tid = next(t for t in tasks if f"guess for {t}" in text)
                out.append(
                    f"```python\n{tasks[tid].code}```" if tid != "demo/sorted" else "no code"
                )
            return out

    coder_policy = CoderPolicy()

    scored = score.score_episodes(
        records, references, judge_policy=judge_policy, coder_policy=coder_policy,
        executor=executor, with_observations=True,
    )  # fmt: skip
    by_id = {r["task_id"]: r for r in scored}
    assert calls == [("judge", 3), ("coder", 4)]
    assert by_id["demo/affine"]["code_match"] == 1.0 and by_id["demo/affine"]["judge_score"] == 4
    assert by_id["demo/runs"]["judge_skipped"] and by_id["demo/runs"]["judge_score"] is None
    assert by_id["demo/sorted"]["code_match"] == 0.0 and not by_id["demo/sorted"]["code_runnable"]
    assert by_id["demo/affine"]["description_origin"] == "annotator:m verified 4/4"
    assert "description_origin" not in by_id["demo/runs"]  # None recorded: none copied.
    with pytest.raises(ValueError, match="no reference"):
        score.score_episodes(
            [{"task_id": "x", "prediction": "", "observations": []}], references,
            judge_policy=judge_policy, coder_policy=coder_policy, executor=executor,
        )  # fmt: skip


def test_with_observations_shows_examples_first_and_copies_source(executor):
    from pau_jax.evaluation import score

    reference = TaskReference(
        code="def test_func(arg0):\n    return arg0 * 2\n",
        header="def test_func(arg0):",
        description="Doubles.",
        held_out=((1,), (5,)),
        examples=("test_func(2) -> 4", "test_func(0) -> 0"),
        source="mbpp",
    )
    record = {"task_id": "t", "prediction": "doubles", "observations": [
        {"call": "test_func(3)", "result": "6"}]}  # fmt: skip
    seen = []

    def coder(conversations):
        seen.append(conversations[0][0]["content"])
        return ["```python\ndef test_func(arg0):\n    return arg0 + arg0\n```"]

    for with_observations in (True, False):
        (scored,) = score.score_episodes(
            [record], {"t": reference}, coder_policy=_Policy(coder), executor=executor,
            with_observations=with_observations,
        )  # fmt: skip
        assert scored["code_match"] == 1.0 and scored["source"] == "mbpp"
        # No judge given: nothing judged, nothing invented.
        assert scored["judge_skipped"] and scored["judge_score"] is None
    calls = "test_func(2) -> 4\ntest_func(0) -> 0\ntest_func(3) -> 6"
    assert calls in seen[0] and "test_func(2) -> 4" not in seen[1]


HANGS_ON_FIVE = """\
def test_func(arg0):
    while arg0 == [5]:
        pass
    return (min(arg0), max(arg0))
"""
CORRECT = "def test_func(arg0):\n    return (min(arg0), max(arg0))\n"
LIST_INPUTS = [([3, 1, 2],), ([5],), ([-1, -7],)]


def test_stored_outputs_are_the_reference(executor):
    # The true function would hang on [5] now, but the stored answers are used: it never runs.
    stored = [(1, 3), (5, 5), (-7, -1)]
    got = code_match.score_code(
        executor, HANGS_ON_FIVE, CORRECT, LIST_INPUTS, timeout_s=0.5, expected_outputs=stored
    )
    assert got.score == 1.0 and got.incomparable == 0
    # A wrong stored answer is a mismatch for a correct function: the key decides, typed.
    got = code_match.score_code(
        executor, CORRECT, CORRECT, LIST_INPUTS, expected_outputs=[(1, 3), [5, 5], (-7, -1)]
    )
    assert got.matches == (True, False, True) and got.score == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="one output per input"):
        code_match.score_code(executor, CORRECT, CORRECT, LIST_INPUTS, expected_outputs=[(1, 3)])


def test_a_reference_that_cannot_be_run_is_not_a_mismatch(executor):
    # Without stored outputs the true function runs; its timeout on [5] leaves that input out.
    got = code_match.score_code(executor, HANGS_ON_FIVE, CORRECT, LIST_INPUTS, timeout_s=0.5)
    assert got.incomparable == 1 and got.score == 1.0
    assert got.matches == (True, False, True)
    # Nothing comparable: no score at all rather than 0.
    got = code_match.score_code(executor, HANGS_ON_FIVE, CORRECT, [([5],)], timeout_s=0.5)
    assert got.score is None and got.incomparable == 1


def test_scored_records_and_metrics_report_incomparable_items(executor):
    from pau_jax.evaluation import metrics, score

    refs = {
        "hangs": TaskReference(
            code=HANGS_ON_FIVE, header="def test_func(arg0):", description="", held_out=(([5],),)
        ),
        "fine": TaskReference(
            code=CORRECT,
            header="def test_func(arg0):",
            description="",
            held_out=(([1, 2],),),
            held_out_outputs=((1, 2),),
        ),
    }
    records = [
        {
            "task_id": t,
            "prediction": "p",
            "observations": [],
            "n_calls": 0,
            "stopped_by_agent": True,
        }
        for t in refs
    ]

    def coder(conversations):
        return [f"```python\n{CORRECT}```"] * len(conversations)

    scored = score.score_episodes(
        records, refs, coder_policy=_Policy(coder), executor=executor, timeout_s=0.5
    )
    by_id = {r["task_id"]: r for r in scored}
    assert by_id["hangs"]["code_match"] is None and by_id["hangs"]["code_match_incomparable"] == 1
    assert by_id["fine"]["code_match"] == 1.0 and by_id["fine"]["code_match_incomparable"] == 0
    summary = metrics.summarize(scored)["code_match"]
    assert summary["incomparable_items"] == 1 and summary["missing"] == 1
    assert summary["mean"] == 1.0 and summary["n"] == 1


def test_predicted_code_cannot_copy_the_reference_it_is_scored_against(executor):
    # The reference hides its answer in a constant; a predicted function that finds a live
    # code object holding that constant (as it could in a worker that had run the reference)
    # returns the right answers, else a wrong one.
    reference = "def test_func(x):\n    key = 'cafe-1207'\n    return x * 7 + 3\n"
    thief = (
        "import gc, types\n"
        "def test_func(x):\n"
        "    for obj in gc.get_objects():\n"
        "        if isinstance(obj, types.FunctionType) and obj.__name__ == 'test_func':\n"
        "            if 'cafe-' + '1207' in obj.__code__.co_consts:\n"
        "                return obj(x)\n"
        "    return None\n"
    )
    inputs = [(n,) for n in range(6)]
    got = code_match.score_code(executor, reference, thief, inputs)
    assert got.runnable and got.score == 0.0, got
