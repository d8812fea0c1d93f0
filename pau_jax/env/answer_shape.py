"""What the current phase's reply must hold (`AnswerShape`), for a policy's structured decoding.

`answer_shape(state, config)` reads it off an episode: the input phase asks for an
argument tuple of the task's arity (each argument shaped like the shown examples', and
the tuples already seen, so a policy can tell a repeat), the revision phase for a
decision. The graders ask for a rating (`evaluation.judge`) or a code block
(`evaluation.code_match`).
"""

import dataclasses

from pau_jax.env import input_example, parse
from pau_jax.env.episode import EpisodeConfig, EpisodeState, Phase
from pau_jax.sandbox import parse_call_args


@dataclasses.dataclass(frozen=True)
class AnswerShape:
    """What the current phase's reply must hold, for a policy's structured decoding.

    kind: 'input' (a fenced literal tuple of `arity` values, as `prompts.generate_messages`
    asks), 'decision' (a revision: hypothesis, then a `Decision:` label), 'rating' (a
    grader's reply ending with `Rating: 1..5`, `evaluation.judge`) or 'code' (a coder's
    reply, one closed ```python block, `evaluation.code_match`). shapes: for an
    input, each argument's shape over the shown examples (`input_example.argument_shapes`;
    () when none has the arity).
    """

    kind: str
    arity: int = 0
    shapes: tuple = ()
    seen: frozenset = frozenset()  # input: repr of each argument tuple already seen
    input_format: str = "lenient"

    def repeats(self, text: str) -> bool:
        """Whether an input reply reads as arguments already seen (a shown example or a call)."""
        if self.kind != "input" or not self.seen:
            return False
        _, args, _ = parse.read_input(text, self.arity, self.input_format)
        return args is not None and repr(tuple(args)) in self.seen


def _seen_arguments(state: EpisodeState, n: int) -> frozenset:
    """repr of the argument tuples of the shown examples and of every input read so far."""
    seen = {repr(tuple(args)) for args in state.task.shown_args if len(args) == n}
    for step in state.steps:
        if step.phase is Phase.GENERATE and step.parse_ok:
            try:
                seen.add(repr(tuple(parse_call_args(step.input_text, n))))
            except ValueError:
                continue
    return frozenset(seen)


def answer_shape(state: EpisodeState, config: EpisodeConfig | None = None) -> AnswerShape | None:
    """The shape of the current phase's answer; None where nothing is asked of its form.

    An input phase of a function whose arity is unknown (`n_params` None) has none. An
    input's shape also holds the arguments already seen, so a policy can tell a repeat
    (`AnswerShape.repeats`), read as `config.input_format` reads inputs.
    """
    if state.phase is Phase.GENERATE and state.task.n_params is not None:
        n = int(state.task.n_params)
        return AnswerShape(
            "input",
            n,
            input_example.argument_shapes(n, state.task.shown_args),
            seen=_seen_arguments(state, n),
            input_format=(config or EpisodeConfig()).input_format,
        )
    if state.phase is Phase.REVISE:
        return AnswerShape("decision")
    return None
