"""A handful of PAU tasks embedded in the package, for runs that must not read any dataset."""

import dataclasses

from pau_jax.env import display, episode, prompts
from pau_jax.env.runner import EpisodeSpec
from pau_jax.tasks.reference import TaskReference


@dataclasses.dataclass(frozen=True, kw_only=True)
class DemoTask:
    task_id: str
    code: str
    header: str
    shown: tuple[tuple, ...]  # argument tuples of the two shown examples
    held_out: tuple[tuple, ...]  # E_test argument tuples
    description: str


DEMO_TASKS = (
    DemoTask(
        task_id="demo/affine",
        code="def test_func(arg0, arg1):\n    return arg0 * arg1 + 1\n",
        header="def test_func(arg0, arg1):",
        shown=((2, 3), (0, 5)),
        held_out=((1, 1), (-2, 4), (10, 0), (3, 3), (7, -1)),
        description="Returns the product of the two arguments plus one.",
    ),
    DemoTask(
        task_id="demo/vowels",
        code="def test_func(arg0):\n    return sum(1 for c in arg0.lower() if c in 'aeiou')\n",
        header="def test_func(arg0):",
        shown=(("hello",), ("SKY",)),
        held_out=(("",), ("AEIOU",), ("queue",), ("rhythm",), ("Banana",)),
        description="Counts the vowels (a, e, i, o, u, either case) in a string.",
    ),
    DemoTask(
        task_id="demo/runs",
        code=(
            "def test_func(arg0):\n"
            "    out = []\n"
            "    for c in arg0:\n"
            "        if out and out[-1][0] == c:\n"
            "            out[-1] = (c, out[-1][1] + 1)\n"
            "        else:\n"
            "            out.append((c, 1))\n"
            "    return out\n"
        ),
        header="def test_func(arg0):",
        shown=(("aab",), ("xyz",)),
        held_out=(("",), ("aaaa",), ("abba",), ("zzzy",), ("q",)),
        description="Run-length encodes a string into a list of (character, count) tuples.",
    ),
    DemoTask(
        task_id="demo/sorted",
        code="def test_func(arg0):\n    return all(a <= b for a, b in zip(arg0, arg0[1:]))\n",
        header="def test_func(arg0):",
        shown=(([1, 2, 2],), ([3, 1],)),
        held_out=(([],), ([5],), ([1, 3, 2],), ([-1, 0, 0, 9],), ([2, 2, 1],)),
        description="Returns True when the list is sorted in non-decreasing order.",
    ),
)


def demo_specs(executor, config: episode.EpisodeConfig) -> list[EpisodeSpec]:
    """Builds the demo episodes; shown examples are computed by running the code in the sandbox."""
    specs = []
    for t in DEMO_TASKS:
        shown = []
        for args in t.shown:
            result = executor.call(t.code, args, timeout_s=2.0)
            if not result.ok:
                raise RuntimeError(
                    f"demo task {t.task_id} failed on {args}: {result.error_message}"
                )
            shown.append(
                prompts.Observation(
                    call=display.render_call(args, config.display_mode),
                    result=display.display_value(result.value, config.display_mode),
                )
            )
        task = episode.Task(
            task_id=t.task_id,
            header=t.header,
            n_params=len(t.shown[0]),
            examples=tuple(shown),
            shown_args=t.shown,
        )
        specs.append(EpisodeSpec(task=task, code=t.code))
    return specs


def load(
    executor, config: episode.EpisodeConfig
) -> tuple[list[EpisodeSpec], dict[str, TaskReference]]:
    """Specs and references of the embedded tasks (source 'demo').

    The shown and held-out outputs are computed once by running each task's code
    in `executor` (the references then hold them as stored outputs).
    """
    specs = demo_specs(executor, config)
    by_id = {t.task_id: t for t in DEMO_TASKS}
    references = {}
    for s in specs:
        task = by_id[s.task.task_id]
        results = executor.call_many(s.code, list(task.held_out), timeout_s=10.0)
        failed = [r for r in results if not r.ok]
        if failed:
            raise RuntimeError(
                f"demo task {task.task_id}: a held-out call failed ({failed[0].error_type}: "
                f"{failed[0].error_message})"
            )
        references[s.task.task_id] = TaskReference(
            code=s.code,
            header=s.task.header,
            description=task.description,
            held_out=task.held_out,
            held_out_outputs=tuple(r.value for r in results),
            examples=tuple(f"{o.call} -> {o.result}" for o in s.task.examples),
            source="demo",
        )
    return specs, references
