"""Per-phase parse rates and failure classes of recorded episodes."""

import json

import pytest

from pau_jax.evaluation import parse_rates


def _step(phase, output, ok, **extra):
    return {"phase": phase, "output": output, "parse_ok": ok, **extra}


EPISODE = {
    "task_id": "t",
    "header": "def test_func(arg0, arg1):",
    "steps": [
        _step("conceptualize", "try small numbers", True),
        _step(
            "generate",
            "```python\ndef test_func(arg0, arg1):\n    return 1\n```",
            False,
            parse_error="arguments are not valid Python: invalid syntax",
            input_text="def test_func(arg0, arg1):\n    return 1",
        ),
        _step("revise", "It adds.", False, parse_error="no decision found", finish_reason="stop"),
        _step("conceptualize", "now bigger", True),
        _step(
            "generate",
            "```python\ntest_func(1, 2)\n```",
            False,
            parse_error="arguments must be Python literals",
            input_text="test_func(1, 2)",
        ),
        _step("revise", "adds adds adds " * 20, False, finish_reason="length"),
        _step("conceptualize", "", False),
        _step(
            "generate",
            "```\n(1, 2, 3)\n```",
            False,
            parse_error="got 3 arguments; the function takes 2",
            input_text="(1, 2, 3)",
        ),
        _step("revise", "Hypothesis: adds\nDecision: STOP", True),
    ],
}
SCORED = [
    {"task_id": "t", "judge_score": 3, "judge_skipped": False, "code_runnable": True},
    {"task_id": "u", "judge_score": None, "judge_skipped": False, "code_runnable": False},
    {"task_id": "v", "judge_score": None, "judge_skipped": True, "code_runnable": True},
]


def test_rates_and_classes():
    r = parse_rates.rates([EPISODE], SCORED, replay=True)
    assert r["phases"]["conceptualize"] == {"accepted": 2, "total": 3, "rate": 2 / 3}
    assert r["phases"]["generate"]["rate"] == 0.0
    assert r["phases"]["revise"] == {"accepted": 1, "total": 3, "rate": 1 / 3}
    assert r["phases"]["judge"] == {"accepted": 1, "total": 2, "rate": 0.5}  # skipped: not judged
    assert r["phases"]["coder"]["accepted"] == 2
    assert r["input_classes"] == {"function definition": 1, "call as code": 1, "wrong arity": 1}
    assert r["revision_classes"] == {"accepted": 1, "no decision": 1, "repetition": 1}
    # Re-read, the fenced call parses under the lenient parser and not under the strict one.
    assert r["replay"]["strict"]["accepted"] == 0
    assert r["replay"]["lenient"]["accepted"] == 1


def test_cli_prints_a_table_and_fails_in_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "interactive_episodes.jsonl").write_text(json.dumps(EPISODE) + "\n")
    assert parse_rates.main([str(run), "--replay"]) == 0
    out = capsys.readouterr().out
    assert "| generate |" in out.splitlines()[0] + "| generate |"
    assert "0% (0/3)" in out and "33% (1/3)" in out
    assert parse_rates.main([str(tmp_path / "missing")]) == 1
    assert "no interactive_episodes.jsonl" in capsys.readouterr().err


@pytest.mark.parametrize(
    "header,n",
    [("def test_func():", 0), ("def test_func(arg0):", 1), ("def test_func(a, b, c):", 3)],
)
def test_n_params_of(header, n):
    assert parse_rates.n_params_of(header) == n


def test_calls_that_ran_and_copies_of_the_prompt_example():
    prompt = "...\nFor example:\n```\n(3, 'abc')\n```"
    steps = [
        _step(
            "generate",
            "```\n(3, 'abc')\n```",
            True,
            input_text="(3, 'abc')",
            call="test_func(3, 'abc')",
            call_ok=False,
            messages=[{"role": "user", "content": prompt}],
        ),
        _step(
            "generate",
            "```\n(4, 'x')\n```",
            True,
            input_text="(4,'x')",
            call="test_func(4, 'x')",
            call_ok=True,
            messages=[{"role": "user", "content": prompt}],
        ),
        _step(
            "generate",
            "(3,'abc')",
            True,
            input_text="3,'abc'",
            call="test_func(3, 'abc')",
            call_ok=False,
            messages=[{"role": "user", "content": prompt}],
        ),
    ]
    r = parse_rates.rates([dict(EPISODE, steps=steps)])
    assert r["calls"]["returned"] == {"accepted": 1, "total": 3, "rate": 1 / 3}
    assert r["calls"]["copied_example"] == 2
    assert r["calls"]["distinct"] == 2


def test_calls_that_repeat_a_shown_example_are_counted():
    first = (
        "Function header:\ndef test_func(arg0, arg1):\n\nExamples given to you:\n"
        "test_func([1.0, 2.5], 0.3) -> True\ntest_func([], 1) -> False\n\nYour calls so far:\n"
    )
    form = "Now write ... The form to fill in:\n```\n([<float>, ...], <float>)\n```\n"
    messages = [{"role": "user", "content": first}, {"role": "user", "content": form}]

    def generate(call):
        args = call.removeprefix("test_func")
        return _step("generate", args, True, input_text=args, call=call, messages=messages)

    calls = ["test_func([1.0,2.5], 0.3)", "test_func([1.0, 2.5], 0.4)", "test_func([], 1)"]
    r = parse_rates.rates([dict(EPISODE, steps=[generate(c) for c in calls])])
    assert r["calls"]["repeated_shown_example"] == 2 and r["calls"]["copied_example"] == 0
    assert "| repeats of a shown example |" in parse_rates.markdown({"run": r})
