"""A handful of PAU tasks embedded in the package, for runs that must not read any dataset."""

from pau_jax.env import episode, prompts
from pau_jax.evaluation.runner import EpisodeSpec

# (task id, source of test_func, header, arguments of the two shown examples, gold description)
DEMO_TASKS = (
    (
        "demo/affine",
        "def test_func(arg0, arg1):\n    return arg0 * arg1 + 1\n",
        "def test_func(arg0, arg1):",
        ((2, 3), (0, 5)),
        "Returns the product of the two arguments plus one.",
    ),
    (
        "demo/vowels",
        "def test_func(arg0):\n    return sum(1 for c in arg0.lower() if c in 'aeiou')\n",
        "def test_func(arg0):",
        (("hello",), ("SKY",)),
        "Counts the vowels (a, e, i, o, u, either case) in a string.",
    ),
    (
        "demo/runs",
        "def test_func(arg0):\n"
        "    out = []\n"
        "    for c in arg0:\n"
        "        if out and out[-1][0] == c:\n"
        "            out[-1] = (c, out[-1][1] + 1)\n"
        "        else:\n"
        "            out.append((c, 1))\n"
        "    return out\n",
        "def test_func(arg0):",
        (("aab",), ("xyz",)),
        "Run-length encodes a string into a list of (character, count) tuples.",
    ),
    (
        "demo/sorted",
        "def test_func(arg0):\n    return all(a <= b for a, b in zip(arg0, arg0[1:]))\n",
        "def test_func(arg0):",
        (([1, 2, 2],), ([3, 1],)),
        "Returns True when the list is sorted in non-decreasing order.",
    ),
)


def demo_specs(executor, config: episode.EpisodeConfig) -> list[EpisodeSpec]:
    """Builds the demo episodes; shown examples are computed by running the code in the sandbox."""
    specs = []
    for task_id, code, header, example_args, _ in DEMO_TASKS:
        shown = []
        for args in example_args:
            result = executor.call(code, args, timeout_s=2.0)
            if not result.ok:
                raise RuntimeError(f"demo task {task_id} failed on {args}: {result.error_message}")
            shown.append(
                prompts.Observation(
                    call=episode.render_call(args, config.display_mode),
                    result=episode.display_value(result.value, config.display_mode),
                )
            )
        task = episode.Task(
            task_id=task_id, header=header, n_params=len(example_args[0]), examples=tuple(shown)
        )
        specs.append(EpisodeSpec(task=task, code=code))
    return specs


def gold_descriptions() -> dict[str, str]:
    return {task_id: gold for task_id, _, _, _, gold in DEMO_TASKS}
