"""Prompts of the PAU protocol, shared by evaluation and training (one versioned source).

Each phase of the three-phase loop has one builder returning chat messages
(`[{"role": ..., "content": ...}]`). Builders are pure functions of an
`EpisodeView`: what the agent may see at that moment.

Two conversation shapes (`EpisodeConfig.conversation`): 'fresh' (prompts
`PROMPT_VERSION`) builds every phase's prompt anew as [system, user] with the
whole context; 'multi_turn' (prompts `MULTI_TURN_PROMPT_VERSION`) opens with the
fresh first prompt and then appends, per phase, the agent's reply and one user
turn (`*_turn`) holding only what is new and that phase's instruction.
"""

import dataclasses

PROMPT_VERSION = "pau-v2"
MULTI_TURN_PROMPT_VERSION = "pau-mt-v1"

SYSTEM = (
    "You are probing an unknown Python function to work out exactly what it does. "
    "You cannot see its source code. You can only call it with inputs of your choice "
    "and observe what it returns (or which exception it raises). Explore like a "
    "scientist: form a hypothesis, choose inputs that could prove it wrong "
    "(edge cases, boundaries, empty values, unusual types), and revise it."
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Observation:
    """One call the agent made: the call as shown, and its displayed result."""

    call: str
    result: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpisodeView:
    """Everything a prompt may show.

    Attributes:
      header: the anonymised signature, e.g. `def test_func(arg0, arg1):`.
      examples: the shown examples as observations.
      observations: the agent's own calls so far (already windowed).
      hypothesis: the current hypothesis ('' before the first revision).
      reasoning: the conceptualisation text of the current step ('' if none).
      calls_left: calls the agent can still make.
      newest_call: the newest call shown without its result ('' when the newest
        result is shown with the other observations).
      prior_observations: calls of an earlier episode on the same function (the
        memory baseline's second attempt); () shows no such section.
      critique: advice from critiques of earlier episodes, shown in the
        conceptualisation prompt only ('' shows none).
      n_params: the function's number of arguments (None: not stated).
      input_example: the generation prompt's example argument tuple, of the
        function's arity ('' shows a generic one).
      example_is_form: `input_example` is a form with a ``<...>`` placeholder for each
        value (`input_example.placeholder_example`), shown as the form to fill in.
    """

    header: str
    examples: tuple[Observation, ...]
    observations: tuple[Observation, ...] = ()
    hypothesis: str = ""
    reasoning: str = ""
    calls_left: int = 0
    newest_call: str = ""
    prior_observations: tuple[Observation, ...] = ()
    critique: str = ""
    n_params: int | None = None
    input_example: str = ""
    example_is_form: bool = False


def _format_observations(items: tuple[Observation, ...], empty: str = "(none yet)") -> str:
    return "\n".join(f"{o.call} -> {o.result}" for o in items) or empty


def _context(view: EpisodeView) -> str:
    parts = [f"Function header:\n{view.header}"]
    if view.prior_observations:
        parts.append(
            "Calls you made in an earlier attempt on this function:\n"
            + _format_observations(view.prior_observations)
        )
    parts += [
        f"Examples given to you:\n{_format_observations(view.examples, '(no longer shown)')}",
        f"Your calls so far:\n{_format_observations(view.observations)}",
    ]
    if view.newest_call:
        parts.append(f"You just called:\n{view.newest_call}")
    parts += [
        f"Current hypothesis:\n{view.hypothesis or '(none yet)'}",
        f"Calls left: {view.calls_left}",
    ]
    return "\n\n".join(parts)


_CONCEPTUALIZE_INSTRUCTION = (
    "Think about which input would be most informative next: one whose output "
    "could confirm or refute the current hypothesis, or reveal behaviour you have "
    "not seen. Explain your reasoning briefly and end by describing the input you "
    "will try. Do not write the call itself yet."
)

_REVISE_INSTRUCTION = (
    "Revise your hypothesis so that it explains every observation above. Describe "
    "what the function computes, precisely and completely, including edge cases and "
    "errors. Then decide whether you are confident enough to stop.\n"
    "Answer in exactly this format:\n"
    "Hypothesis: <your description of the function>\n"
    "Decision: CONTINUE or STOP"
)


def _generate_instruction(view: EpisodeView) -> str:
    """The generation phase's request: the argument tuple of the arity, with an example."""
    n = view.n_params
    if n is None:
        arity = "as a Python tuple of literals"
    else:
        arity = f"as a Python tuple of exactly {n} literal{'s' if n != 1 else ''}"
    example = view.input_example or "(3, 'abc', [1, 2])"
    request = (
        f"Now write the arguments for the next call {arity}, one per parameter of the "
        "header, in a fenced block, and nothing else: no function definition, no code, "
        "no explanation."
    )
    if view.example_is_form:
        return (
            f"{request} The form to fill in:\n```\n{example}\n```\n"
            "Write a literal value of your own in place of every <...>: the input your plan "
            "describes. The examples given to you already show their results, so calling "
            "the function with one of them teaches you nothing: choose other values, and do "
            "not repeat a call you have already made."
        )
    return (
        f"{request} For example:\n```\n{example}\n```\n"
        "The example shows only the form: choose the values your plan needs, and do not "
        "repeat a call you have already made."
    )


def conceptualize_messages(view: EpisodeView) -> list[dict]:
    """Phase 1: reason about the most informative next input (after the critique, if any)."""
    advice = ""
    if view.critique:
        advice = (
            f"Lessons from your earlier explorations of similar functions:\n{view.critique}\n\n"
        )
    user = f"{_context(view)}\n\n{advice}{_CONCEPTUALIZE_INSTRUCTION}"
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def generate_messages(view: EpisodeView) -> list[dict]:
    """Phase 2: write the argument tuple as Python literals."""
    user = (
        f"{_context(view)}\n\n"
        f"Your plan for the next input:\n{view.reasoning or '(none)'}\n\n"
        f"{_generate_instruction(view)}"
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def revise_messages(view: EpisodeView) -> list[dict]:
    """Phase 3: revise the hypothesis and decide whether to continue."""
    user = f"{_context(view)}\n\n{_REVISE_INSTRUCTION}"
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def conceptualize_turn(
    view: EpisodeView, *, late_result: str = "", revision_error: str = ""
) -> dict:
    """Multi-turn, after a revision: calls left and the conceptualisation request.

    Args:
      view: the episode as the fresh prompt would show it.
      late_result: the newest call with its result, when the revision turn showed the
        call alone (``reflection_sees_newest=False``); '' shows none.
      revision_error: why the revision just made could not be read ('' when it was);
        the turn then also shows the hypothesis the episode holds.
    """
    parts = []
    if late_result:
        parts.append(f"Result of your last call:\n{late_result}")
    if revision_error:
        parts.append(
            f"Your revision could not be read ({revision_error}). Current hypothesis:\n"
            f"{view.hypothesis or '(none yet)'}"
        )
    parts += [f"Calls left: {view.calls_left}", _CONCEPTUALIZE_INSTRUCTION]
    return {"role": "user", "content": "\n\n".join(parts)}


def generate_turn(view: EpisodeView) -> dict:
    """Multi-turn, after the plan (the reply above): the request for the argument tuple."""
    return {"role": "user", "content": _generate_instruction(view)}


def revise_turn(view: EpisodeView) -> dict:
    """Multi-turn, after an input: the newest call's result, calls left, the revision request.

    With ``view.newest_call`` set (``reflection_sees_newest=False``) the call is shown
    without its result, which the next conceptualisation turn then shows.
    """
    if view.newest_call:
        newest = f"You just called:\n{view.newest_call}"
    else:
        last = view.observations[-1]
        newest = f"Result of your call:\n{last.call} -> {last.result}"
    content = f"{newest}\n\nCalls left: {view.calls_left}\n\n{_REVISE_INSTRUCTION}"
    return {"role": "user", "content": content}


def in_context_messages(view: EpisodeView) -> list[dict]:
    """In-context mode: describe the function from the header and the examples alone."""
    user = (
        f"Function header:\n{view.header}\n\n"
        f"Examples:\n{_format_observations(view.examples)}\n\n"
        "Describe what the function computes, precisely and completely.\n"
        "Answer in this format:\nDescription: <your description of the function>"
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
