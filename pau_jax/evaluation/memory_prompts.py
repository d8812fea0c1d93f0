"""The memory baseline's prompts: critiques of an exploration, their merge, and the replies read.

`critique_messages` shows the agent a train function's truth (gold description,
held-out calls as `held_out_observations` displays them) beside the calls it tried and
its prediction, and asks what its exploration missed; `summary_messages` asks it to merge
several critiques into one; `parse_critique` reads a reply. `memory_baseline` runs the
stages.
"""

import re
from collections.abc import Sequence

from pau_jax.env import display
from pau_jax.env.prompts import Observation
from pau_jax.env.text_blocks import strip_think

_CRITIQUE = re.compile(r"critique\s*:", re.I)


def _lines(observations: Sequence[Observation]) -> str:
    return "\n".join(f"{o.call} -> {o.result}" for o in observations) or "(none)"


def critique_messages(
    *,
    header: str,
    description: str,
    held_out: Sequence[Observation],
    tried: Sequence[Observation],
    prediction: str,
) -> list[dict]:
    """Asks the agent to critique its exploration of a train function whose truth it now sees.

    Args:
      header: the function's header.
      description: its gold description.
      held_out: its held-out calls (the behaviour the agent was meant to discover).
      tried: the calls the agent saw: the shown examples, then its own calls.
      prediction: the description the agent gave at the end of its episode.
    """
    user = (
        "Earlier you explored an unknown Python function by calling it and then described "
        "what it does. Here is what it really does; use the gap to improve how you explore.\n\n"
        f"Function header:\n{header}\n\n"
        f"What the function actually does:\n{description}\n\n"
        f"Held-out calls showing its true behaviour:\n{_lines(held_out)}\n\n"
        f"The calls you saw (the given examples first, then your own):\n{_lines(tried)}\n\n"
        f"Your final description:\n{prediction or '(none)'}\n\n"
        "Was your description right? If not, which behaviour did your calls never exercise, "
        "and which exploration strategy (kinds of inputs, edge cases, when to stop) would have "
        "revealed it? Write a short, specific critique that will help you explore the next "
        "unknown function better.\n"
        "Answer in this format:\nCritique: <your critique>"
    )
    return [{"role": "user", "content": user}]


def summary_messages(critiques: Sequence[str]) -> list[dict]:
    """Asks the agent to merge several critiques of its earlier explorations into one."""
    numbered = "\n".join(f"{i}. {c}" for i, c in enumerate(critiques, 1))
    user = (
        "Below are critiques of your earlier explorations of unknown Python functions, each "
        "written after you learned what the function really did:\n"
        f"{numbered}\n\n"
        "Merge them into one short critique: keep every concrete lesson about which inputs to "
        "try and when to stop exploring, and drop repetitions.\n"
        "Answer in this format:\nCritique: <the merged critique>"
    )
    return [{"role": "user", "content": user}]


def parse_critique(text: str) -> str:
    """The text after the last `Critique:` label (thinking removed), or the whole answer."""
    body = strip_think(text)
    labels = list(_CRITIQUE.finditer(body))
    if labels:
        body = body[labels[-1].end() :]
    return body.strip().strip("*").strip()


def held_out_observations(reference, display_mode: str, limit: int | None = None) -> tuple:
    """A reference's held-out calls and stored outputs as the agent would see them."""
    outputs = reference.held_out_outputs
    shown = []
    for i, args in enumerate(reference.held_out[:limit]):
        result = "?" if outputs is None else display.display_value(outputs[i], display_mode)
        shown.append(Observation(call=display.render_call(args, display_mode), result=result))
    return tuple(shown)
