"""The PAU episode as an explicit state machine with pure transition functions.

One query of the three-phase loop is: CONCEPTUALIZE (reason about the next
input) -> GENERATE (write the argument tuple; it is parsed and executed) ->
REVISE (new hypothesis + CONTINUE/STOP). The episode ends on STOP, when the
call budget is spent, or when the step limit (one step = one phase) is hit.

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

No function here performs I/O; states are immutable records.
"""

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any

from pau_jax.env import parse, prompts
from pau_jax.sandbox import parse_call_args, values


class Phase(enum.Enum):
    CONCEPTUALIZE = "conceptualize"
    GENERATE = "generate"
    REVISE = "revise"
    DONE = "done"


DISPLAY_MODES = ("repr", "str")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpisodeConfig:
    """Protocol constants (paper defaults; see gin/variants/as_released.gin).

    Attributes:
      call_budget: calls allowed per episode (paper 25).
      max_steps: limit on phases per episode (RL T_max = 40); None = no limit.
      history_window: show only the last N observations; None = all.
      reflection_sees_newest: whether the revision prompt shows the newest result.
      display_mode: 'repr' (typed, `'5'` differs from `5`; errors `Type: msg`) or
        'str' (the released code's `str` display; errors as the message only).
    """

    call_budget: int = 25
    max_steps: int | None = None
    history_window: int | None = None
    reflection_sees_newest: bool = True
    display_mode: str = "repr"

    def __post_init__(self):
        if self.call_budget < 1:
            raise ValueError(f"call_budget must be >= 1, got {self.call_budget}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or None, got {self.max_steps}")
        if self.history_window is not None and self.history_window < 1:
            raise ValueError(f"history_window must be >= 1 or None, got {self.history_window}")
        if self.display_mode not in DISPLAY_MODES:
            raise ValueError(
                f"display_mode must be one of {DISPLAY_MODES}, got {self.display_mode!r}"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task:
    """What the agent is told about a function (the code stays with the executor)."""

    task_id: str
    header: str
    n_params: int
    examples: tuple[prompts.Observation, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Step:
    """One generation of the policy and what the environment made of it."""

    phase: Phase
    messages: tuple[dict, ...]
    output: str
    parse_ok: bool
    parse_error: str = ""
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
    finish_reason: str | None = None  # 'stop' | 'budget' | 'max_steps'
    pending_call: str = ""

    @property
    def stopped_by_agent(self) -> bool:
        return self.finish_reason == "stop"

    @property
    def prediction(self) -> str:
        """The final description: the latest hypothesis."""
        return self.hypothesis


def display_value(value: Any, mode: str) -> str:
    return values.display(value) if mode == "repr" else str(value)


def display_error(error_type: str, message: str, mode: str) -> str:
    return f"{error_type}: {message}" if mode == "repr" else message


def render_call(args: Sequence[Any], mode: str = "repr") -> str:
    """`test_func(<arg>, <arg>)` with each argument displayed as the agent sees values."""
    return "test_func(" + ", ".join(display_value(a, mode) for a in args) + ")"


def start(task: Task, config: EpisodeConfig) -> EpisodeState:
    del config  # The initial state does not depend on the protocol constants.
    return EpisodeState(task=task)


def view(state: EpisodeState, config: EpisodeConfig) -> prompts.EpisodeView:
    """What the prompt of the current phase may show."""
    observations = state.observations
    if state.phase is Phase.REVISE and not config.reflection_sees_newest:
        observations = observations[:-1]
    if config.history_window is not None:
        observations = observations[-config.history_window :]
    return prompts.EpisodeView(
        header=state.task.header,
        examples=state.task.examples,
        observations=observations,
        hypothesis=state.hypothesis,
        reasoning=state.reasoning if state.phase is Phase.GENERATE else "",
        calls_left=config.call_budget - state.n_calls,
    )


_BUILDERS = {
    Phase.CONCEPTUALIZE: prompts.conceptualize_messages,
    Phase.GENERATE: prompts.generate_messages,
    Phase.REVISE: prompts.revise_messages,
}


def messages(state: EpisodeState, config: EpisodeConfig) -> list[dict]:
    """Chat messages for the current phase."""
    if state.phase is Phase.DONE:
        raise ValueError(f"episode {state.task.task_id} is finished; it has no next prompt")
    return _BUILDERS[state.phase](view(state, config))


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
    reasoning = parse.strip_think(text)
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
    extracted = parse.extract_input(text)
    error = extracted.reason
    args = None
    if extracted.ok:
        try:
            args = parse_call_args(extracted.args_text, state.task.n_params)
        except ValueError as e:
            error = str(e)
    if args is None:
        result = display_error("InputParseError", error, config.display_mode)
        call = f"test_func({extracted.args_text})" if extracted.args_text else "test_func(?)"
        step = Step(
            phase=Phase.GENERATE,
            messages=msgs,
            output=text,
            parse_ok=False,
            parse_error=error,
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
    call = render_call(args, config.display_mode)
    step = Step(phase=Phase.GENERATE, messages=msgs, output=text, parse_ok=True, call=call)
    new = dataclasses.replace(state, steps=state.steps + (step,), pending_call=call)
    return new, args


def on_result(state: EpisodeState, result: Any, config: EpisodeConfig) -> EpisodeState:
    """Records the executor's answer (an object with ok/value/error_type/error_message)."""
    _expect(state, Phase.GENERATE)
    if not state.pending_call:
        raise ValueError(f"episode {state.task.task_id} has no pending call to record")
    if result.ok:
        shown = display_value(result.value, config.display_mode)
    else:
        shown = display_error(result.error_type, result.error_message, config.display_mode)
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
