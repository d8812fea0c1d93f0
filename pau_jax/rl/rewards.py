"""The AAC per-step reward schedule: critic scores, format and execution terms, length and timeout penalties.

Every step of an episode is one phase and gets one scalar reward:

* reasoning (``Phase.CONCEPTUALIZE``): ``s + r_len(n; reasoning_tau, reasoning_alpha)``;
* input (``Phase.GENERATE``): ``failure_reward`` (-0.5) if the input did not parse
  or the call raised, else ``lambda_h / (2 * max_steps)`` (0.025), plus
  ``r_len(n; input_tau, input_alpha)``;
* reflection (``Phase.REVISE``): ``failure_reward * [parse failed]
  + lambda_h * (s + b_term(done, s)) + r_len(n; reflection_tau, reflection_alpha)``;

and an episode cut off at ``max_steps`` gets ``timeout_reward`` (-1.0), the
paper's "final timeout penalty" (where it lands: below). ``s`` is the critic's
score in [0, 1] for that step; ``n`` is a number of whitespace-separated words:
for an input step, the words of the parsed input (the argument text the
environment extracted, as the paper's ``r_len(input; 30, 0.5)`` and the released
environment count it; 0 when no input could be extracted, which the failure term
already punishes); for a reasoning or reflection step, the words of the reply
with its ``<think>`` blocks removed. Thinking is not counted because the paper's
rewards are functions of the response the environment receives, which the
released environment takes after ``</think>``; counting it would make the
penalty punish thinking itself (its length is bounded by the token budget
instead). ``b_term(done, s)`` is ``+1`` if done and s > 0.7, ``-1`` if done and
s <= 0.7, ``+1`` if not done and s < 0.3, else 0; ``done`` is True on the
reflection step whose STOP ended the episode (and on a futile CONTINUE, below).

A CONTINUE after which no call can be made (the last reflection before T_max,
or one said when the call budget is spent) explores nothing: the episode can
only end. Read literally, ``b_term`` pays +1 for a CONTINUE with s < 0.3 even
there, 4 more than a STOP, and nothing charges for the step the limit still
allows. ``RewardConfig.futile_continue`` chooses:

* ``"end"`` (default; pau_jax's reading where the paper is silent): such a
  CONTINUE is scored as the end of the episode it is, ``b_term(True, s)``, and
  the steps after it (plans no call can follow) get no critic term, only their
  length penalty and, on the last, the timeout. It earns what a STOP at the same
  point earns, and the step it buys costs at least the timeout.
* ``"literal"`` (the released code): ``b_term(False, s)`` as written.

``RewardConfig.timeout_rule``: ``"add"`` (paper) adds the timeout to the last
step's own terms; ``"replace"`` (the released code) makes it the last step's
whole reward: the released environment stops at the step limit without scoring
the step.

A critic score of None (the critic's reply could not be parsed) drops every
term that needs it: a reasoning step then gets ``r_len`` only, a reflection
step ``failure_reward * [parse failed] + r_len`` (no ``lambda_h`` term at all,
so neither ``s`` nor ``b_term``). The step stays in the episode and is trained
on that reward.

Two length penalties (``RewardConfig.length_penalty``):

* ``"paper"``: ``r_len(n; tau, alpha) = -min(cap, alpha * max(0, n - tau))`` with
  ``cap = 1`` for reasoning and input steps (the paper's formula) and
  ``cap = reflection_length_cap`` (0.5) for reflection steps. The paper gives
  the reflection's r_len no constants; with a cap of 1 a long correct STOP
  (2 * (0.7 + 1) - 1 = 2.4) ranked below a short CONTINUE on a bad hypothesis
  (2 * (0.3 + 1) = 2.6), so pau_jax caps it below the gap
  ``lambda_h * (stop_threshold - continue_threshold)`` (0.8);
* ``"released"``: ``-max(1, (n - tau) / (2 * tau))`` for ``n > tau``, else 0, as
  the released code writes it (``max``, not ``min``: any output over ``tau``
  words costs at least 1, and the cost grows without bound; ``alpha`` is unused).
"""

import dataclasses
from collections.abc import Sequence

from pau_jax.env import parse
from pau_jax.env.episode import EpisodeState, Phase

LENGTH_PENALTIES = ("paper", "released")
TIMEOUT_RULES = ("add", "replace")
FUTILE_CONTINUE = ("end", "literal")
TERMS = ("critic", "termination", "execution", "length", "timeout")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardConfig:
    """Constants of the reward schedule (paper values by default).

    Attributes:
      lambda_h: weight of the reflection step's critic terms (lambda_H).
      max_steps: T_max, the step limit of an RL episode; sets the clean-input reward.
      failure_reward: added on an input that fails to parse or raises, and on a
        reflection that fails to parse.
      reasoning_tau, reasoning_alpha: r_len of reasoning steps.
      input_tau, input_alpha: r_len of input steps.
      reflection_tau, reflection_alpha: r_len of reflection steps. The paper
        adds an r_len to the reflection reward without giving its constants;
        these default to the reasoning step's (100 words, 0.05 per word).
      reflection_length_cap: the largest reflection r_len ("paper" mode; pau_jax's
        reading): below ``lambda_h * (stop_threshold - continue_threshold)`` so
        that length never ranks a correct STOP below a CONTINUE on a bad hypothesis.
      stop_threshold: a STOP with a score above this is correct.
      continue_threshold: a CONTINUE with a score below this is correct.
      correct_stop_bonus: b_term of a correct STOP.
      premature_stop_bonus: b_term of a STOP at or below ``stop_threshold``.
      correct_continue_bonus: b_term of a CONTINUE below ``continue_threshold``.
      timeout_reward: the timeout penalty of an episode cut off at ``max_steps``.
      timeout_rule: ``"add"`` (paper: added to the last step's own reward) or
        ``"replace"`` (released code: the last step's whole reward).
      futile_continue: ``"end"`` (a CONTINUE with no call left is scored as the
        end it is; the plans after it get no critic term) or ``"literal"``
        (released code: ``b_term`` as written).
      length_penalty: ``"paper"`` or ``"released"`` (see the module docstring).
    """

    lambda_h: float = 2.0
    max_steps: int = 40
    failure_reward: float = -0.5
    reasoning_tau: int = 100
    reasoning_alpha: float = 0.05
    input_tau: int = 30
    input_alpha: float = 0.5
    reflection_tau: int = 100
    reflection_alpha: float = 0.05
    reflection_length_cap: float = 0.5
    stop_threshold: float = 0.7
    continue_threshold: float = 0.3
    correct_stop_bonus: float = 1.0
    premature_stop_bonus: float = -1.0
    correct_continue_bonus: float = 1.0
    timeout_reward: float = -1.0
    timeout_rule: str = "add"
    futile_continue: str = "end"
    length_penalty: str = "paper"

    def __post_init__(self):
        if self.length_penalty not in LENGTH_PENALTIES:
            raise ValueError(
                f"length_penalty must be one of {LENGTH_PENALTIES}, got {self.length_penalty!r}"
            )
        if self.timeout_rule not in TIMEOUT_RULES:
            raise ValueError(
                f"timeout_rule must be one of {TIMEOUT_RULES}, got {self.timeout_rule!r}"
            )
        if self.futile_continue not in FUTILE_CONTINUE:
            raise ValueError(
                f"futile_continue must be one of {FUTILE_CONTINUE}, got {self.futile_continue!r}"
            )
        if self.reflection_length_cap < 0:
            raise ValueError(
                f"reflection_length_cap must be >= 0, got {self.reflection_length_cap}"
            )
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        for name in ("reasoning_tau", "input_tau", "reflection_tau"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def clean_input_reward(self) -> float:
        """Reward of an input that parsed and ran cleanly: lambda_H / (2 T_max)."""
        return self.lambda_h / (2 * self.max_steps)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepRecord:
    """What the reward of one step depends on.

    Attributes:
      phase: CONCEPTUALIZE (reasoning), GENERATE (input) or REVISE (reflection).
      output: the policy's whole reply text.
      parse_ok: whether the environment could parse the reply.
      input_text: input steps only: the argument text the environment extracted
        from the reply ('' when none could be extracted); its words are what the
        input step's length penalty counts.
      call_ok: input steps only: whether the call returned without an exception
        (False when the input did not parse).
      score: the critic's score in [0, 1] for reasoning and reflection steps,
        None when the critic's reply was unparseable; always None for input steps.
    """

    phase: Phase
    output: str
    parse_ok: bool
    input_text: str = ""
    call_ok: bool | None = None
    score: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpisodeRecord:
    """A finished episode as the rewards see it.

    Attributes:
      steps: the steps in order.
      done: the agent ended the episode with STOP (on its last step, a reflection).
      timed_out: the episode was cut off at the step limit T_max.
      budget_spent: the episode ended after a reflection because the call budget
        was spent.
    """

    steps: tuple[StepRecord, ...]
    done: bool
    timed_out: bool
    budget_spent: bool = False


def record_from_state(state: EpisodeState, scores: Sequence[float | None]) -> EpisodeRecord:
    """The record of a finished episode, with one critic score (or None) per step.

    Args:
      state: the final state (``finish_reason`` set).
      scores: per step, the critic's score; None for input steps and unparseable
        critic replies.
    """
    if state.finish_reason is None:
        raise ValueError(f"episode {state.task.task_id} is not finished; finish it first")
    if len(scores) != len(state.steps):
        raise ValueError(
            f"episode {state.task.task_id} has {len(state.steps)} steps but "
            f"{len(scores)} critic scores; pass one score (or None) per step"
        )
    steps = tuple(
        StepRecord(
            phase=step.phase,
            output=step.output,
            parse_ok=step.parse_ok,
            input_text=step.input_text,
            call_ok=step.call_ok,
            score=score,
        )
        for step, score in zip(state.steps, scores)
    )
    return EpisodeRecord(
        steps=steps,
        done=state.finish_reason == "stop",
        timed_out=state.finish_reason == "max_steps",
        budget_spent=state.finish_reason == "budget",
    )


def count_words(text: str) -> int:
    """Number of whitespace-separated words."""
    return len(text.split())


def counted_words(step: StepRecord) -> int:
    """The words a step's length penalty counts (see the module docstring)."""
    if step.phase is Phase.GENERATE:
        return count_words(step.input_text)
    return count_words(parse.strip_think(step.output))


def length_penalty(
    n_words: int, *, tau: int, alpha: float, mode: str = "paper", cap: float = 1.0
) -> float:
    """r_len: 0 up to ``tau`` words, negative beyond (formulas in the module docstring).

    ``cap`` bounds the "paper" penalty (the paper's formula has 1); "released" ignores it.
    """
    if mode == "paper":
        return -min(cap, alpha * max(0, n_words - tau))
    if mode == "released":
        return -max(1.0, (n_words - tau) / (2 * tau)) if n_words > tau else 0.0
    raise ValueError(f"length penalty mode must be one of {LENGTH_PENALTIES}, got {mode!r}")


def termination_bonus(done: bool, score: float, config: RewardConfig) -> float:
    """b_term(done, s): rewards a STOP only when the hypothesis is good, a CONTINUE when it is bad."""
    if done:
        if score > config.stop_threshold:
            return config.correct_stop_bonus
        return config.premature_stop_bonus
    if score < config.continue_threshold:
        return config.correct_continue_bonus
    return 0.0


def step_terms(step: StepRecord, *, done: bool, config: RewardConfig) -> dict[str, float]:
    """The reward terms of one step (keys ``TERMS`` except ``timeout``; they sum to its reward).

    Args:
      step: the step.
      done: for a reflection step, whether its STOP ended the episode.
      config: the constants.
    """
    terms = dict.fromkeys(TERMS, 0.0)
    mode = config.length_penalty
    n = counted_words(step)
    if step.phase is Phase.CONCEPTUALIZE:
        if step.score is not None:
            terms["critic"] = float(step.score)
        terms["length"] = length_penalty(
            n, tau=config.reasoning_tau, alpha=config.reasoning_alpha, mode=mode
        )
    elif step.phase is Phase.GENERATE:
        if step.score is not None:
            raise ValueError("input steps take no critic score; pass score=None")
        if step.parse_ok and step.call_ok is None:
            raise ValueError("an input step that parsed needs call_ok (did the call raise?)")
        clean = step.parse_ok and bool(step.call_ok)
        terms["execution"] = config.clean_input_reward if clean else config.failure_reward
        terms["length"] = length_penalty(
            n, tau=config.input_tau, alpha=config.input_alpha, mode=mode
        )
    elif step.phase is Phase.REVISE:
        if not step.parse_ok:
            terms["execution"] = config.failure_reward
        if step.score is not None:
            terms["critic"] = config.lambda_h * float(step.score)
            terms["termination"] = config.lambda_h * termination_bonus(done, step.score, config)
        terms["length"] = length_penalty(
            n,
            tau=config.reflection_tau,
            alpha=config.reflection_alpha,
            mode=mode,
            cap=config.reflection_length_cap,
        )
    else:
        raise ValueError(f"a step cannot be in phase {step.phase.value}")
    return terms


def futile_continue_index(record: EpisodeRecord) -> int | None:
    """Index of the reflection whose CONTINUE left no call to make, or None.

    That is the last reflection of an episode that ended without STOP because
    no call was left (timed out, or the budget spent) when no input step follows
    it: nothing the agent did after it could call the function again.
    """
    if record.done or not (record.timed_out or record.budget_spent):
        return None
    for i in range(len(record.steps) - 1, -1, -1):
        phase = record.steps[i].phase
        if phase is Phase.GENERATE:
            return None
        if phase is Phase.REVISE:
            return i
    return None


def episode_terms(record: EpisodeRecord, config: RewardConfig) -> list[dict[str, float]]:
    """Per step, its reward terms (keys ``TERMS``); the timeout lands on the last step.

    Under ``timeout_rule="replace"`` the last step of a timed-out episode keeps
    only its ``timeout`` term.
    """
    steps = record.steps
    if record.done + record.timed_out + record.budget_spent > 1:
        raise ValueError(
            "an episode ends one way: by STOP (done), at the step limit (timed_out) or with the "
            "budget spent (budget_spent); set one of them"
        )
    if record.done and (not steps or steps[-1].phase is not Phase.REVISE):
        raise ValueError("done=True needs a reflection (REVISE) step last: STOP is said there")
    if record.budget_spent and (not steps or steps[-1].phase is not Phase.REVISE):
        raise ValueError("budget_spent=True needs a reflection (REVISE) step last")
    if record.timed_out and not steps:
        raise ValueError("a timed-out episode needs at least one step")
    last = len(steps) - 1
    futile = futile_continue_index(record) if config.futile_continue == "end" else None
    # The step whose decision ended the episode: the STOP, or (under "end") the futile CONTINUE.
    end = last if record.done else futile
    terms = [step_terms(step, done=i == end, config=config) for i, step in enumerate(steps)]
    if futile is not None:
        for t in terms[futile + 1 :]:
            t["critic"] = t["termination"] = 0.0
    if record.timed_out:
        if config.timeout_rule == "replace":
            terms[-1] = dict.fromkeys(TERMS, 0.0)
        terms[-1]["timeout"] = config.timeout_reward
    return terms


def episode_rewards(record: EpisodeRecord, config: RewardConfig) -> list[float]:
    """Per step, its scalar reward (the sum of its terms)."""
    return [sum(t[key] for key in TERMS) for t in episode_terms(record, config)]
