"""Scripted policies (no language model) for tests and baselines: an oracle, a random prober, a coder, a judge.

Each is a `Policy` (`complete` and `policy(conversations) -> texts`, through
`_Scripted`) and reads only the text of the last user message, so it can stand in
for a model in any seat: the agent of an episode, the coder of code match, the
judge. `complete` ignores answer shapes (a script writes what it writes) and cuts
each reply before the first of its stop strings.

- `OraclePolicy` knows each task's source. It probes with inputs derived from
  the shown examples and the source's literals, then states the source in a
  fenced block as its hypothesis and stops.
- `RandomProber` draws seeded random arguments of the types seen in the
  examples; its hypothesis is the table of calls it observed; it never stops
  before the budget.
- `ScriptedCoder` answers the coder prompt with the fenced code of the
  description if there is one, else a lookup-table `test_func` built from the
  `call -> result` lines it is shown.
- `OverlapJudge` rates a hypothesis by its word overlap with the gold
  description, and classifies failure modes with a fixed rule.
"""

import random
import re
import zlib
from collections.abc import Mapping, Sequence

from pau_jax.data import argtypes, mutations
from pau_jax.policy import check_per_row
from pau_jax.sandbox import equality, parse_call_args, values

_GENERATE = "Now write the arguments"
_REVISE = "Revise your hypothesis"
_IN_CONTEXT = "Answer in this format:\nDescription:"
_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.I)
_CALL_LINE = re.compile(r"^test_func\((.*)\) -> (.*)$")
_PARAMS = re.compile(r"def\s+test_func\s*\((.*)\)\s*:")
_ERROR = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*): (.*)$", re.DOTALL)


def _last_user(conversation: Sequence[dict]) -> str:
    return next(m["content"] for m in reversed(conversation) if m["role"] == "user")


def _cut(text: str, stop: Sequence[str]) -> str:
    """`text` up to the first occurrence of any of `stop` (all of it when none occurs)."""
    found = [i for i in (text.find(s) for s in stop) if i >= 0]
    return text[: min(found)] if found else text


class _Scripted:
    """A `Policy` from a script: `_answer(last user message) -> reply text`."""

    def _answer(self, content: str) -> str:
        raise NotImplementedError

    def complete(
        self,
        conversations: Sequence[Sequence[dict]],
        *,
        answers: Sequence | None = None,
        stop: Sequence[Sequence[str]] | None = None,
    ) -> list[str]:
        """One reply text per conversation; `answers` are ignored, `stop` strings cut the reply."""
        check_per_row(conversations, answers=answers, stop=stop)
        texts = [self._answer(_last_user(c)) for c in conversations]
        if stop is None:
            return texts
        return [_cut(text, strings) for text, strings in zip(texts, stop, strict=True)]

    def __call__(self, conversations: Sequence[Sequence[dict]]) -> list[str]:
        """The reply texts of `complete(conversations)`."""
        return self.complete(conversations)


def _between(text: str, start: str, end: str) -> str:
    """The text after the first `start` up to the next `end` ('' when `start` is absent)."""
    i = text.find(start)
    if i < 0:
        return ""
    i += len(start)
    j = text.find(end, i)
    return text[i:] if j < 0 else text[i:j]


def _lines(block: str) -> list[str]:
    return [line for line in block.strip().splitlines() if line.strip() and line != "(none yet)"]


def task_key(header: str, examples: Sequence) -> tuple[str, str]:
    """What identifies a task in a prompt: the header and the examples' `call -> result` lines."""
    return header.strip(), "\n".join(f"{o.call} -> {o.result}" for o in examples)


def _prompt_key(content: str) -> tuple[str, str]:
    header = _between(content, "Function header:\n", "\n\n")
    if "Examples given to you:\n" in content:
        examples = _between(content, "Examples given to you:\n", "\n\nYour calls so far:")
    else:
        examples = _between(content, "Examples:\n", "\n\nDescribe what")
    return header.strip(), examples.strip()


def _n_params(header: str) -> int:
    match = _PARAMS.search(header)
    if match is None:
        raise ValueError(f"not a test_func header: {header!r}")
    return len([p for p in match.group(1).split(",") if p.strip()])


def _parse_call(call: str, n_params: int) -> tuple | None:
    """The argument tuple of a displayed call `test_func(...)`, or None when not literal."""
    if not (call.startswith("test_func(") and call.endswith(")")):
        return None
    try:
        return parse_call_args(call[len("test_func(") : -1], n_params)
    except ValueError:
        return None


def args_text(args: tuple) -> str | None:
    """Argument text that `parse_call_args` reads back to exactly `args`, or None."""
    text = ", ".join(values.display(a) for a in args)
    try:
        back = parse_call_args(text, len(args))
    except ValueError:
        return None
    return text if equality.typed_equal(back, args) else None


def _rng(*parts) -> random.Random:
    return random.Random(zlib.crc32(":".join(str(p) for p in parts).encode()))


def _example_args(examples: Sequence, n_params: int) -> list[tuple]:
    found = [_parse_call(o.call, n_params) for o in examples]
    return [a for a in found if a is not None]


def _arg_specs(seeds: Sequence[tuple], n_params: int) -> list[argtypes.TypeSpec]:
    specs = []
    for i in range(n_params):
        try:
            specs.append(argtypes.join_all(argtypes.infer(s[i]) for s in seeds))
        except argtypes.UnsupportedTypeError:
            specs.append(argtypes.ANY)
    return specs if seeds else [argtypes.ANY] * n_params


def _calls_so_far(content: str) -> list[str]:
    return _lines(_between(content, "Your calls so far:\n", "\n\nCurrent hypothesis:"))


class OraclePolicy(_Scripted):
    """Knows every task's source: probes informative inputs, then states the source and stops.

    Args:
      specs: the episodes it may meet (`runner.EpisodeSpec`s: task + code).
      probes: task id -> argument tuples to try first (e.g. E_test-style inputs).
      n_probes: calls it makes before stopping (fewer when the budget is smaller).
      seed: seed of the derived probes.
    """

    def __init__(
        self,
        specs: Sequence,
        *,
        probes: Mapping[str, Sequence[tuple]] | None = None,
        n_probes: int = 3,
        seed: int = 0,
    ):
        if n_probes < 1:
            raise ValueError(f"n_probes must be >= 1, got {n_probes}")
        self.n_probes = n_probes
        self._by_key = {}
        self._probes = {}
        for spec in specs:
            task = spec.task
            self._by_key.setdefault(task_key(task.header, task.examples), spec)
            given = list((probes or {}).get(task.task_id, ()))
            self._probes[task.task_id] = self._derive(spec, given, seed)

    def _derive(self, spec, given: list[tuple], seed: int) -> list[str]:
        """Argument texts: the given probes, then mutations of the examples within the source's literals."""
        n = spec.task.n_params
        seeds = _example_args(spec.task.examples, n)
        out = [t for t in (args_text(tuple(a)) for a in given) if t is not None]
        if seeds:
            specs = _arg_specs(seeds, n)
            gen = mutations.Generator(
                mutations.pools_for(spec.code, seeds), _rng(seed, spec.task.task_id)
            )
            for attempt in range(20 * self.n_probes):
                if len(out) >= self.n_probes:
                    break
                base = seeds[attempt % len(seeds)]
                text = args_text(gen.mutate_args(base, specs))
                if text is not None and text not in out:
                    out.append(text)
            out += [t for t in (args_text(s) for s in seeds) if t is not None]
        if not out:
            out = ["()" if n == 0 else ", ".join(["0"] * n)]
        return out

    def spec_for(self, content: str):
        key = _prompt_key(content)
        if key not in self._by_key:
            raise KeyError(f"the oracle does not know the task with header {key[0]!r}")
        return self._by_key[key]

    def _answer(self, content: str) -> str:
        spec = self.spec_for(content)
        source = f"```python\n{spec.code.rstrip()}\n```"
        if _IN_CONTEXT in content:
            return f"Description: the function is exactly this code:\n{source}"
        done = len(_calls_so_far(content))
        if _GENERATE in content:
            probes = self._probes[spec.task.task_id]
            return f"```\n{probes[done % len(probes)]}\n```"
        if _REVISE in content:
            left = int(re.findall(r"Calls left: (-?\d+)", content)[-1])
            decision = "STOP" if done >= self.n_probes or left <= 0 else "CONTINUE"
            return f"Hypothesis: the function is exactly this code:\n{source}\nDecision: {decision}"
        return "I know the source; I will check it on an informative input."


class RandomProber(_Scripted):
    """Seeded random arguments of the example types; the hypothesis is the table of observed calls.

    A call's arguments depend only on (seed, header, examples, call index), so
    batched and one-at-a-time runs give the same episodes.
    """

    def __init__(self, *, seed: int = 0):
        self.seed = seed

    def _args(self, content: str) -> str:
        header, examples = _prompt_key(content)
        n = _n_params(header)
        shown = [_CALL_LINE.match(line) for line in _lines(examples)]
        seeds = [a for a in (_parse_args_text(m.group(1), n) for m in shown if m) if a]
        specs = _arg_specs(seeds, n)
        pools = mutations.Pools()
        for s in seeds:
            pools.add(s)
        pools.finalize()
        index = len(_calls_so_far(content))
        gen = mutations.Generator(pools, _rng(self.seed, header, examples, index))
        for _ in range(50):
            text = args_text(gen.fresh_args(specs))
            if text is not None:
                return text
        return ", ".join(["0"] * n) or "()"

    def _answer(self, content: str) -> str:
        if _GENERATE in content:
            return f"```\n{self._args(content)}\n```"
        if _REVISE in content or _IN_CONTEXT in content:
            _, examples = _prompt_key(content)
            previous = _between(content, "Current hypothesis:\n", "\n\nCalls left:")
            table = list(
                dict.fromkeys(
                    line
                    for line in _lines(examples) + _lines(previous) + _calls_so_far(content)
                    if _CALL_LINE.match(line)
                )
            )
            body = "\n".join(table)
            if _IN_CONTEXT in content:
                return f"Description: it maps inputs to outputs as in this table:\n{body}"
            return f"Hypothesis: observed calls:\n{body}\nDecision: CONTINUE"
        return "I will try a random input of the types seen so far."


def _parse_args_text(text: str, n_params: int) -> tuple | None:
    try:
        return parse_call_args(text, n_params)
    except ValueError:
        return None


def _literal(text: str):
    """(ok, value) of a displayed value read back as a literal."""
    args = _parse_args_text(text, 1)
    return (True, args[0]) if args is not None else (False, None)


def lookup_table_code(header: str, lines: Sequence[str]) -> str:
    """A `test_func` that answers the observed `test_func(args) -> result` lines and None elsewhere.

    Results shown as `SomeError: message` (a builtin exception type) are raised
    again; lines whose arguments or result are not literals are skipped.
    """
    import builtins

    n = _n_params(header)
    rows = []
    for line in lines:
        match = _CALL_LINE.match(line.strip())
        if match is None:
            continue
        args = _parse_args_text(match.group(1), n)
        if args is None:
            continue
        ok, value = _literal(match.group(2))
        if ok:
            rows.append(f"    ({values.display(args)}, 'return', {values.display(value)}),")
            continue
        error = _ERROR.match(match.group(2))
        kind = getattr(builtins, error.group(1), None) if error else None
        if isinstance(kind, type) and issubclass(kind, BaseException):
            rows.append(f"    ({values.display(args)}, 'raise', {error.group(1)}),")
    params = ", ".join(f"arg{i}" for i in range(n))
    key = f"({params},)" if n else "()"
    return (
        "_TABLE = [\n" + "\n".join(rows) + "\n]\n\n\n"
        "def _same(a, b):\n"
        "    if type(a) is not type(b):\n"
        "        return False\n"
        "    if type(a) in (list, tuple):\n"
        "        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))\n"
        "    if type(a) is dict:\n"
        "        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)\n"
        "    return a == b\n\n\n"
        f"def test_func({params}):\n"
        f"    key = {key}\n"
        "    for args, kind, value in _TABLE:\n"
        "        if _same(args, key):\n"
        "            if kind == 'raise':\n"
        "                raise value('from the table')\n"
        "            return value\n"
        "    return None\n"
    )


class ScriptedCoder(_Scripted):
    """Writes code from the coder prompt: the description's fenced code, else a lookup table."""

    def _answer(self, content: str) -> str:
        header = _between(content, "Header: ", "\n").strip()
        description = _between(content, "Description: ", "\nAnswer with the complete function")
        blocks = _FENCE.findall(description)
        if blocks:
            return f"```python\n{blocks[-1].rstrip()}\n```"
        lines = description.splitlines() + _lines(_between(content, "Observed calls:\n", "\n\n"))
        return f"```python\n{lookup_table_code(header, lines)}```"


_WORD = re.compile(r"[a-z0-9]+")


class OverlapJudge(_Scripted):
    """A lexical stand-in for a judge model (tests and offline runs only).

    Rating prompts ("True description:" ... "Hypothesis:") get
    `Rating: 1 + round(4 * overlap)`, overlap being the Jaccard similarity of the
    word sets. Failure-mode prompts ("Category:") get a rule: no calls ->
    insufficient exploration; stopped by the agent -> overconfident conclusion;
    otherwise hallucination.
    """

    def _answer(self, content: str) -> str:
        if "Category:" in content:
            calls = re.findall(r"Calls made: (\d+)", content)
            stopped = re.findall(r"Stopped by the agent: (yes|no)", content)
            if calls and int(calls[-1]) == 0:
                category = "insufficient exploration"
            elif stopped and stopped[-1] == "yes":
                category = "overconfident conclusion"
            else:
                category = "hallucination"
            return f"Rule-based verdict.\nCategory: {category}"
        gold_text = content.rsplit("True description: ", 1)[-1].split("\n", 1)[0]
        gold = set(_WORD.findall(gold_text.lower()))
        hypothesis = content.rsplit("Hypothesis: ", 1)[-1].rsplit("\nExplanation:", 1)[0]
        words = set(_WORD.findall(hypothesis.lower()))
        overlap = len(gold & words) / max(len(gold | words), 1)
        return f"Word overlap {overlap:.2f}.\nRating: {1 + round(4 * overlap)}"
