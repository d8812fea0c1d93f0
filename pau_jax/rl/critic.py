"""The AAC critic: prompts that rate each reasoning step and each hypothesis 0–9, and their parsing.

The critic is any policy (``conversations -> texts``): in the paper it is the
actor's own base model without LoRA (``training.step.reference_model`` builds it
over the very same base arrays), prompted with privileged information the actor never sees
(the gold description, optionally the source code). It scores two kinds of
steps of a finished episode:

* a reasoning step (``Phase.CONCEPTUALIZE``): how well the planned next input
  would reveal what the function really does;
* a reflection step (``Phase.REVISE``): how correct the new hypothesis is.

Input steps get no critic score. Each answer ends with ``Rating: X``; the last
such rating is parsed, divided by 9 and clamped to [0, 1]. An answer without a
rating gives None, which the rewards treat as "no critic term" and which is
counted, never replaced by a default. All steps of all episodes are scored in
one policy call (or in chunks of ``max_batch_size``).
"""

import dataclasses
import re
from collections.abc import Mapping, Sequence

from pau_jax.env import parse
from pau_jax.env.episode import EpisodeState, Phase
from pau_jax.policy.config import DEFAULT_PREFIX_CACHE_GIB, SamplingConfig, check_prefix_cache_gib
from pau_jax.tasks.reference import TaskReference

CRITIC_PROMPT_VERSION = "critic-v1"
PRIVILEGED = ("description", "description+source", "none")
MAX_RATING = 9

# "Rating: 7", "**Rating:** 7/9", "rating = 7.5", "Rating: -1"; the last one in an answer counts.
_RATING = re.compile(r"rating[^\w\-]{0,6}(-?\d+(?:\.\d+)?)", re.I)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CriticConfig:
    """How the critic is prompted and run.

    Attributes:
      privileged: what the critic sees beyond the actor's view: 'description'
        (the gold description; the paper), 'description+source' (and the code),
        or 'none' (SYM-INFO ablation: exactly what the actor sees).
      show_source: with privileged='description', show the source code too (the
        released critic saw both); ignored with privileged='none', so an overlay that
        sets it keeps the SYM-INFO ablation intact.
      sampling: the critic's sampling: 128 tokens, greedy (the paper); the
        released code used the serving provider's sampling. A served critic (an
        HTTP seat) is sent its temperature and max_new_tokens. Its seed is set per
        training step.
      max_batch_size: conversations per critic call; None = all steps of a rollout at once.
      clamp: clamp ratings to [0, 1] after dividing by 9 (the paper); False keeps
        out-of-range ratings as written (the released code).
      prefix_cache_gib: GiB of a local critic's prefix cache (`pau_jax.sampling.prefix_cache`;
        the steps of one episode share their context); 0 prefills every prompt whole. A
        fresh cache every training step; a critic seat of `policy.backends` sizes its own.
    """

    privileged: str = "description"
    show_source: bool = False
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=128, temperature=0.0)
    max_batch_size: int | None = None
    clamp: bool = True
    prefix_cache_gib: float = DEFAULT_PREFIX_CACHE_GIB

    def __post_init__(self):
        check_prefix_cache_gib("CriticConfig", self.prefix_cache_gib)
        if self.privileged not in PRIVILEGED:
            raise ValueError(f"privileged must be one of {PRIVILEGED}, got {self.privileged!r}")
        if self.sampling.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.sampling.max_new_tokens}")
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 or None, got {self.max_batch_size}")
        if self.sampling.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.sampling.temperature}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CriticScores:
    """The critic's verdict on a rollout.

    Attributes:
      scores: per episode, per step, a score in [0, 1] or None (input steps and
        unparseable answers).
      requested: number of steps sent to the critic.
      unparsed: number of answers without a parseable rating.
      raw: per episode, per step, the critic's answer ('' for input steps).
    """

    scores: list[list[float | None]]
    requested: int
    unparsed: int
    raw: list[list[str]]


_SYSTEM = (
    "You are a strict expert reviewer of an agent that probes an unknown Python function by "
    "calling it, to work out what the function does. You rate single steps of the agent."
)

_REASONING_TASK = (
    "Rate the agent's plan for its next input on a scale from 0 to 9: 0 = useless (the input "
    "would reveal nothing new, repeats earlier calls, or ignores the observations); 5 = "
    "reasonable but not the most informative choice; 9 = excellent (the input would test "
    "exactly the behaviour the agent has not yet understood or could get wrong)."
)

_HYPOTHESIS_TASK = (
    "Rate how correctly the agent's hypothesis describes what the function does, on a scale "
    "from 0 to 9: 0 = wrong or missing; 3 = partly right, main behaviour wrong; 6 = main "
    "behaviour right, details or edge cases wrong or missing; 9 = fully right, edge cases "
    "included."
)

_SYM_HYPOTHESIS_TASK = (
    "Rate how well the agent's hypothesis explains every observation and how precisely it "
    "describes the function, on a scale from 0 to 9: 0 = contradicts the observations or is "
    "missing; 5 = fits the observations but is vague; 9 = fits every observation and is "
    "precise, edge cases included."
)

_ANSWER = 'Explain in at most two sentences, then give the rating as "Rating: X" (X from 0 to 9).'


def _format(items) -> str:
    return "\n".join(f"{call} -> {result}" for call, result in items) or "(none)"


def _privileged(reference, privileged: str, show_source: bool = False) -> str:
    if privileged == "none":
        return ""
    if reference is None:
        raise ValueError(f"privileged={privileged!r} needs a TaskReference for every task")
    text = f"True description of the function (hidden from the agent):\n{reference.description}\n\n"
    if privileged == "description+source" or show_source:
        text += f"Source code of the function (hidden from the agent):\n{reference.code}\n\n"
    return text


def step_messages(
    state: EpisodeState, index: int, reference, config: CriticConfig
) -> list[dict] | None:
    """The critic's conversation for step ``index`` of a finished episode; None for input steps.

    The critic sees the header, the shown examples and every observation the
    agent had at that step (a reflection sees the result of its own call), the
    hypothesis before the step and the step itself, plus the privileged text
    from ``reference`` (an object with ``.description`` and ``.code``, or None
    with privileged='none').
    """
    step = state.steps[index]
    if step.phase is Phase.GENERATE:
        return None
    observations, hypothesis = [], ""
    for earlier in state.steps[:index]:
        if earlier.phase is Phase.GENERATE and earlier.call:
            observations.append((earlier.call, earlier.result))
        elif earlier.phase is Phase.REVISE:
            hypothesis = parse.parse_revision(earlier.output).hypothesis or hypothesis
    context = (
        f"Function header:\n{state.task.header}\n\n"
        f"Examples shown to the agent:\n{_format((o.call, o.result) for o in state.task.examples)}"
        f"\n\nThe agent's calls so far:\n{_format(observations)}\n\n"
    )
    privileged = _privileged(reference, config.privileged, config.show_source)
    if step.phase is Phase.CONCEPTUALIZE:
        body = (
            f"{context}The agent's current hypothesis:\n{hypothesis or '(none yet)'}\n\n"
            f"{privileged}The agent's plan for its next input:\n"
            f"{parse.strip_think(step.output) or '(empty)'}\n\n{_REASONING_TASK}"
        )
    else:
        revised = parse.parse_revision(step.output)
        new = revised.hypothesis or parse.strip_think(step.output)
        task = _SYM_HYPOTHESIS_TASK if config.privileged == "none" else _HYPOTHESIS_TASK
        body = f"{context}{privileged}The agent's hypothesis:\n{new or '(empty)'}\n\n{task}"
    return [
        {"role": "system", "content": _SYSTEM},
        {"role": "user", "content": f"{body}\n{_ANSWER}"},
    ]


def parse_score(text: str, *, clamp: bool = True) -> float | None:
    """The last ``Rating: X`` of an answer as X / 9 (clamped to [0, 1]); None when there is none."""
    matches = _RATING.findall(parse.strip_think(text))
    if not matches:
        return None
    score = float(matches[-1]) / MAX_RATING
    return min(1.0, max(0.0, score)) if clamp else score


def score_episodes(
    policy,
    states: Sequence[EpisodeState],
    references: Mapping[str, TaskReference] | None,
    config: CriticConfig,
) -> CriticScores:
    """Scores every reasoning and reflection step of the episodes in one (or a few) policy calls.

    Args:
      policy: ``policy(conversations) -> texts`` (replies with ``.text`` also work).
      states: finished episodes.
      references: task id -> privileged information: any object with ``.description``
        and ``.code`` (a ``TaskReference``); may be None
        with privileged='none'.
      config: the critic's settings.

    Returns:
      ``CriticScores`` aligned with ``states`` and their steps.
    """
    where, conversations = [], []
    for e, state in enumerate(states):
        reference = references.get(state.task.task_id) if references is not None else None
        for i in range(len(state.steps)):
            messages = step_messages(state, i, reference, config)
            if messages is not None:
                where.append((e, i))
                conversations.append(messages)
    size = config.max_batch_size or max(len(conversations), 1)
    texts = []
    for start in range(0, len(conversations), size):
        replies = policy(conversations[start : start + size])
        texts += [r if isinstance(r, str) else r.text for r in replies]
    scores = [[None] * len(s.steps) for s in states]
    raw = [[""] * len(s.steps) for s in states]
    unparsed = 0
    for (e, i), text in zip(where, texts, strict=True):
        score = parse_score(text, clamp=config.clamp)
        unparsed += score is None
        scores[e][i] = score
        raw[e][i] = text
    return CriticScores(scores=scores, requested=len(where), unparsed=unparsed, raw=raw)
