"""The PAU episode as an explicit state machine with pure transition functions.

One query of the three-phase loop is: CONCEPTUALIZE (reason about the next
input) -> GENERATE (write the argument tuple; it is parsed and executed) ->
REVISE (new hypothesis + CONTINUE/STOP). The episode ends on STOP, when the
call budget is spent, when the step limit (one step = one phase) is hit, or
when the policy could not be given the prompt because it is too long
(``on_prompt_too_long``).

The runner drives it:

    state = start(task, config)
    while state.phase is not Phase.DONE:
        text = policy(messages(state, config))
        if state.phase is Phase.CONCEPTUALIZE:
            state = on_conceptualize(state, text, config)
        elif state.phase is Phase.GENERATE:
            state, args = on_generate(state, text, config)
            if args is not None:
                state = on_result(state, executor.call(code, args), config)
        else:
            state = on_revise(state, text, config)

No function here performs I/O; states are immutable records. How calls and results
are shown is in `display`; what each phase's reply must hold, in `answer_shape`.
"""

import dataclasses
import enum
from typing import Any

from pau_jax.env import display, input_example, parse, prompts, text_blocks


class Phase(enum.Enum):
    CONCEPTUALIZE = "conceptualize"
    GENERATE = "generate"
    REVISE = "revise"
    DONE = "done"


DISPLAY_MODES = ("repr", "str")
FAILED_INPUT_DISPLAYS = ("error", "literal")
CONVERSATIONS = ("fresh", "multi_turn")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpisodeConfig:
    """Protocol constants (paper defaults; see gin/variants/as_released.gin).

    Attributes:
      call_budget: calls allowed per episode (paper 25).
      max_steps: limit on phases per episode (RL T_max = 40); None = no limit.
      history_window: show only the last N observations; None = all.
      window_includes_examples: the window runs over the two shown examples
        followed by the agent's calls, so the examples scroll out once more than
        N - 2 calls were made (the released code); False keeps the examples
        always in view and windows the calls alone.
      reflection_sees_newest: whether the revision prompt shows the newest result;
        False (the released evaluation harness) shows the newest call without its
        result (a parse failure with its error), after the older observations.
      display_mode: 'repr' (typed, `'5'` differs from `5`; errors `Type: msg`;
        arguments rendered from the parsed values) or 'str' (the released code:
        results with `str`, errors as the message only, and each call as the
        agent's own argument text, examples as Python literals).
      input_format: how the generation-phase output is read: 'lenient' (pau_jax's
        default: also a call ``test_func(...)`` in a fence or in prose, ``argN=``
        keywords, ``arg0 = ...`` lines; the first reading with the function's
        arity wins, see ``parse.input_candidates``) or 'strict' (one argument
        text: the last fence, the last ``Input:`` line or a single line).
      failed_input_display: what later prompts show for an input that did not
        parse: 'error' (``test_func(?) -> InputParseError: <why>``) or 'literal'
        (the released code: the agent's text pasted in as the call).
      conversation: 'fresh' (each phase a new prompt with the whole history) or
        'multi_turn' (one conversation, each phase's prompt the previous one plus its
        reply and a user turn).
      example_style: how the generation prompt shows the form of an input: 'values'
        (an argument tuple shaped like the shown examples, every value changed) or
        'placeholders' (the same shape with a ``<type>`` placeholder for each value,
        which a copy cannot turn into a call).
    """

    call_budget: int = 25
    max_steps: int | None = None
    history_window: int | None = None
    window_includes_examples: bool = False
    reflection_sees_newest: bool = True
    display_mode: str = "repr"
    input_format: str = "lenient"
    failed_input_display: str = "error"
    conversation: str = "fresh"
    example_style: str = "values"

    def __post_init__(self):
        if self.call_budget < 1:
            raise ValueError(f"call_budget must be >= 1, got {self.call_budget}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or None, got {self.max_steps}")
        if self.history_window is not None and self.history_window < 1:
            raise ValueError(f"history_window must be >= 1 or None, got {self.history_window}")
        for name, allowed in (
            ("input_format", parse.INPUT_FORMATS),
            ("failed_input_display", FAILED_INPUT_DISPLAYS),
            ("display_mode", DISPLAY_MODES),
            ("example_style", input_example.EXAMPLE_STYLES),
            ("conversation", CONVERSATIONS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.conversation == "multi_turn" and self.history_window is not None:
            raise ValueError(
                f"history_window={self.history_window} needs conversation='fresh': a "
                "multi_turn conversation keeps every observation in context; set one of them"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task:
    """What the agent is told about a function (the code stays with the executor).

    The last three fields start an episode from an earlier one (the memory
    baseline); left empty, the prompts are exactly those of a fresh episode.

    Attributes:
      task_id: the dataset's id of the function.
      header: the anonymised signature.
      n_params: number of arguments.
      examples: the shown examples.
      shown_args: the argument tuples of the shown examples, from which the
        generation prompt's example input takes its shape (``input_example``);
        () gives a generic example of the right arity.
      initial_hypothesis: the hypothesis the episode starts from.
      prior_observations: calls of an earlier episode, shown in every prompt
        (they use none of this episode's budget).
      critique: advice shown in every conceptualisation prompt.
    """

    task_id: str
    header: str
    n_params: int
    examples: tuple[prompts.Observation, ...]
    shown_args: tuple[tuple, ...] = dataclasses.field(default=(), hash=False)
    initial_hypothesis: str = ""
    prior_observations: tuple[prompts.Observation, ...] = ()
    critique: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Step:
    """One generation of the policy and what the environment made of it."""

    phase: Phase
    messages: tuple[dict, ...]
    output: str
    parse_ok: bool
    parse_error: str = ""
    input_text: str = ""
    call: str = ""
    result: str = ""
    call_ok: bool | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpisodeState:
    task: Task
    phase: Phase = Phase.CONCEPTUALIZE
    hypothesis: str = ""
    reasoning: str = ""
    observations: tuple[prompts.Observation, ...] = ()
    steps: tuple[Step, ...] = ()
    n_calls: int = 0
    finish_reason: str | None = None  # 'stop' | 'budget' | 'max_steps' | 'prompt_length'
    pending_call: str = ""

    @property
    def stopped_by_agent(self) -> bool:
        return self.finish_reason == "stop"

    @property
    def prediction(self) -> str:
        """The final description: the latest hypothesis."""
        return self.hypothesis


def start(task: Task, config: EpisodeConfig) -> EpisodeState:
    del config  # The initial state does not depend on the protocol constants.
    return EpisodeState(task=task, hypothesis=task.initial_hypothesis)


# Offset of the first GENERATE phase from each phase of the CONCEPTUALIZE -> GENERATE -> REVISE cycle.
_TO_GENERATE = {Phase.CONCEPTUALIZE: 1, Phase.GENERATE: 0, Phase.REVISE: 2}


def calls_left(state: EpisodeState, config: EpisodeConfig) -> int:
    """Calls the agent can still make: min(budget left, calls the step limit still reaches).

    A call is made in a GENERATE step (the current one counts while in that
    phase); with ``max_steps`` set, only the GENERATE steps among the steps
    still allowed can happen: from phase P with r steps left, the GENERATE
    phases at offsets o, o + 3, ... below r (o = 1, 0, 2 for CONCEPTUALIZE,
    GENERATE, REVISE). With T_max = 40 an episode reaches 13 calls, not 25.
    """
    budget = config.call_budget - state.n_calls
    if state.phase is Phase.DONE:
        return 0
    if config.max_steps is None:
        return max(budget, 0)
    steps_left = config.max_steps - len(state.steps)
    offset = _TO_GENERATE[state.phase]
    reachable = 0 if steps_left <= offset else (steps_left - offset + 2) // 3
    return max(min(budget, reachable), 0)


def view(state: EpisodeState, config: EpisodeConfig) -> prompts.EpisodeView:
    """What the prompt of the current phase may show.

    A window that includes the examples runs over the examples, then the prior
    observations of an earlier episode, then this episode's calls (the order in
    which they were made).
    """
    examples, observations = state.task.examples, state.observations
    prior = state.task.prior_observations
    newest = ""
    if state.phase is Phase.REVISE and not config.reflection_sees_newest and observations:
        last = observations[-1]
        failed = state.steps and not state.steps[-1].parse_ok
        newest = f"{last.call} -> {last.result}" if failed else last.call
        observations = observations[:-1]
    window = config.history_window
    if window is not None and config.window_includes_examples:
        shown = (examples + prior + observations)[-window:]
        n_calls = min(len(observations), len(shown))
        n_prior = min(len(prior), len(shown) - n_calls)
        n_examples = len(shown) - n_calls - n_prior
        examples = examples[len(examples) - n_examples :]
        prior = prior[len(prior) - n_prior :]
        observations = observations[len(observations) - n_calls :]
    elif window is not None:
        observations = observations[-window:]
    return prompts.EpisodeView(
        header=state.task.header,
        examples=examples,
        observations=observations,
        hypothesis=state.hypothesis,
        reasoning=state.reasoning if state.phase is Phase.GENERATE else "",
        n_params=state.task.n_params,
        input_example=_example(state, config) if state.phase is Phase.GENERATE else "",
        example_is_form=config.example_style == "placeholders",
        calls_left=calls_left(state, config),
        newest_call=newest,
        prior_observations=prior,
        critique=state.task.critique if state.phase is Phase.CONCEPTUALIZE else "",
    )


def _example(state: EpisodeState, config: EpisodeConfig) -> str:
    """The generation prompt's example input, in the configured style."""
    if config.example_style == "placeholders":
        return input_example.placeholder_example(state.task.n_params, state.task.shown_args)
    return input_example.example_input(state.task.n_params, state.task.shown_args)


_BUILDERS = {
    Phase.CONCEPTUALIZE: prompts.conceptualize_messages,
    Phase.GENERATE: prompts.generate_messages,
    Phase.REVISE: prompts.revise_messages,
}


def messages(state: EpisodeState, config: EpisodeConfig) -> list[dict]:
    """Chat messages for the current phase.

    'fresh': the phase's own [system, user] prompt. 'multi_turn': the first phase's prompt,
    then the previous step's conversation + its reply + one user turn (`_turn`).
    """
    if state.phase is Phase.DONE:
        raise ValueError(f"episode {state.task.task_id} is finished; it has no next prompt")
    current = view(state, config)
    if config.conversation == "fresh" or not state.steps:
        return _BUILDERS[state.phase](current)
    last = state.steps[-1]
    reply = {"role": "assistant", "content": last.output}
    return [*last.messages, reply, _turn(state, config, current)]


def _turn(state: EpisodeState, config: EpisodeConfig, current: prompts.EpisodeView) -> dict:
    """The user turn a multi-turn conversation appends for the current phase: only what is new."""
    if state.phase is Phase.GENERATE:
        return prompts.generate_turn(current)
    if state.phase is Phase.REVISE:
        return prompts.revise_turn(current)
    revision, late = state.steps[-1], ""
    newest = state.steps[-2] if len(state.steps) > 1 else None  # the input before the revision
    if not config.reflection_sees_newest and newest is not None and newest.parse_ok:
        late = f"{newest.call} -> {newest.result}"  # the revision turn showed the call alone
    error = "" if revision.parse_ok else revision.parse_error
    return prompts.conceptualize_turn(current, late_result=late, revision_error=error)


def _expect(state: EpisodeState, phase: Phase) -> None:
    if state.phase is not phase:
        raise ValueError(
            f"episode {state.task.task_id} is in phase {state.phase.value}, not {phase.value}"
        )


def _limit_steps(state: EpisodeState, config: EpisodeConfig) -> EpisodeState:
    if (
        state.phase is not Phase.DONE
        and config.max_steps is not None
        and len(state.steps) >= config.max_steps
    ):
        return dataclasses.replace(state, phase=Phase.DONE, finish_reason="max_steps")
    return state


def on_conceptualize(state: EpisodeState, text: str, config: EpisodeConfig) -> EpisodeState:
    _expect(state, Phase.CONCEPTUALIZE)
    reasoning = text_blocks.strip_think(text)
    step = Step(
        phase=Phase.CONCEPTUALIZE,
        messages=tuple(messages(state, config)),
        output=text,
        parse_ok=bool(reasoning),
        parse_error="" if reasoning else "empty reasoning",
    )
    new = dataclasses.replace(
        state, phase=Phase.GENERATE, reasoning=reasoning, steps=state.steps + (step,)
    )
    return _limit_steps(new, config)


def on_generate(
    state: EpisodeState, text: str, config: EpisodeConfig
) -> tuple[EpisodeState, tuple | None]:
    """Parses the argument tuple. Returns (state, args); args is None when parsing failed.

    A parse failure uses one call of the budget (so a model that never writes a
    valid input still ends) and shows the error as the observation.
    """
    _expect(state, Phase.GENERATE)
    msgs = tuple(messages(state, config))
    args_text, args, error = parse.read_input(text, state.task.n_params, config.input_format)
    if args is None:
        result = display.display_error("InputParseError", error, config.display_mode)
        call = "test_func(?)"
        if args_text and config.failed_input_display == "literal":
            call = display.literal_call(args_text)
        step = Step(
            phase=Phase.GENERATE,
            messages=msgs,
            output=text,
            parse_ok=False,
            parse_error=error,
            input_text=args_text,
            call=call,
            result=result,
            call_ok=False,
        )
        new = dataclasses.replace(
            state,
            phase=Phase.REVISE,
            observations=state.observations + (prompts.Observation(call=call, result=result),),
            n_calls=state.n_calls + 1,
            steps=state.steps + (step,),
        )
        return _limit_steps(new, config), None
    if config.display_mode == "str":
        call = display.literal_call(args_text)
    else:
        call = display.render_call(args, config.display_mode)
    step = Step(
        phase=Phase.GENERATE,
        messages=msgs,
        output=text,
        parse_ok=True,
        input_text=args_text,
        call=call,
    )
    new = dataclasses.replace(state, steps=state.steps + (step,), pending_call=call)
    return new, args


def on_result(state: EpisodeState, result: Any, config: EpisodeConfig) -> EpisodeState:
    """Records the executor's answer (an object with ok/value/error_type/error_message)."""
    _expect(state, Phase.GENERATE)
    if not state.pending_call:
        raise ValueError(f"episode {state.task.task_id} has no pending call to record")
    if result.ok:
        shown = display.display_value(result.value, config.display_mode)
    else:
        shown = display.display_error(result.error_type, result.error_message, config.display_mode)
    last = dataclasses.replace(state.steps[-1], result=shown, call_ok=bool(result.ok))
    new = dataclasses.replace(
        state,
        phase=Phase.REVISE,
        observations=state.observations
        + (prompts.Observation(call=state.pending_call, result=shown),),
        n_calls=state.n_calls + 1,
        steps=state.steps[:-1] + (last,),
        pending_call="",
    )
    return _limit_steps(new, config)


def on_prompt_too_long(state: EpisodeState, config: EpisodeConfig) -> EpisodeState:
    """Ends the episode because the current phase's prompt was too long for the policy.

    No step is recorded (nothing was generated); ``finish_reason`` is 'prompt_length'.
    """
    del config  # The ending does not depend on the protocol constants.
    if state.phase is Phase.DONE:
        raise ValueError(f"episode {state.task.task_id} is already finished")
    return dataclasses.replace(
        state, phase=Phase.DONE, finish_reason="prompt_length", pending_call=""
    )


def on_revise(state: EpisodeState, text: str, config: EpisodeConfig) -> EpisodeState:
    _expect(state, Phase.REVISE)
    parsed = parse.parse_revision(text)
    step = Step(
        phase=Phase.REVISE,
        messages=tuple(messages(state, config)),
        output=text,
        parse_ok=parsed.ok,
        parse_error=parsed.reason,
    )
    hypothesis = parsed.hypothesis or state.hypothesis
    if parsed.ok and parsed.stop:
        phase, reason = Phase.DONE, "stop"
    elif state.n_calls >= config.call_budget:
        phase, reason = Phase.DONE, "budget"
    else:
        phase, reason = Phase.CONCEPTUALIZE, None
    new = dataclasses.replace(
        state,
        phase=phase,
        finish_reason=reason,
        hypothesis=hypothesis,
        reasoning="",
        steps=state.steps + (step,),
    )
    return _limit_steps(new, config)
