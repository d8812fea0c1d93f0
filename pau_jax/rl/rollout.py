"""Rollout collection: GRPO groups of PAU episodes → critic scores → step rewards → advantages → samples.

One call of ``collect`` runs ``group_size`` episodes of each task (a GRPO
group) as one batch through the episode runner with the actor, has the critic
score every reasoning and reflection step of every episode in one batched
call, turns each episode into per-step rewards (``rewards.record_from_state``,
``rewards.episode_rewards``) and the rewards into advantages with the chosen
credit function (the group of an episode is its task), and returns the
training rows: one ``EpisodeSample`` per episode whose every phase's prompt is a
token prefix of the next (a multi-turn conversation of a local policy: the final
token sequence, each reply in the loss with its step's advantage), else one
``Sample`` per step (that phase's prompt ids, the generated ids, the sampler's
log-probs and the step's advantage). ``rollout/episode_rows`` and
``rollout/phase_rows`` count which.
"""

import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from pau_jax.env import input_example, runner
from pau_jax.env.episode import EpisodeConfig, Phase
from pau_jax.env.runner import EpisodeSpec, FinishedEpisode
from pau_jax.policy.config import DEFAULT_PREFIX_CACHE_GIB, SamplingConfig, check_prefix_cache_gib
from pau_jax.rl import critic as critic_lib
from pau_jax.rl import rewards as rewards_lib
from pau_jax.rl.samples import EpisodeSample, Sample, episode_sample, reply_masks
from pau_jax.tasks.reference import TaskReference


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """How rollouts are sampled (paper values by default).

    Attributes:
      tasks_per_batch: distinct tasks per training step (GRPO prompts per batch).
      group_size: G, episodes per task.
      sampling: the actor's sampling (token budget, temperature, filters, chat
        template switch, prompt limit); its seed is set per training step. The
        learner scores at its temperature; top-k and top-p must stay off (the learner
        assumes the full distribution). A prompt longer than ``max_prompt_tokens``
        ends its episode (finish reason 'prompt_length'), as the released trainer did.
      call_timeout_s: wall-clock limit of one sandbox call.
      max_parallel_calls: sandbox calls in flight at once.
      prefix_cache_gib: GiB of the actor's prefix cache (`pau_jax.sampling.prefix_cache`:
        each phase of an episode prefills only what its conversation appended; a fresh
        cache every training step, since the weights change); 0 prefills every prompt whole.
    """

    tasks_per_batch: int = 8
    group_size: int = 8
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=512, temperature=1.0)
    call_timeout_s: float = 2.0
    max_parallel_calls: int = 8
    prefix_cache_gib: float = DEFAULT_PREFIX_CACHE_GIB

    def __post_init__(self):
        check_prefix_cache_gib("RolloutConfig", self.prefix_cache_gib)
        if self.tasks_per_batch < 1 or self.group_size < 1:
            raise ValueError(
                f"tasks_per_batch and group_size must be >= 1, got {self.tasks_per_batch} "
                f"and {self.group_size}"
            )
        if self.group_size == 1:
            raise ValueError(
                "group_size=1 would train on the KL term alone: a group of one episode has "
                "nothing to compare, so every group-normalised advantage is 0; use >= 2"
            )
        if self.sampling.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.sampling.max_new_tokens}")
        if self.sampling.resample_repeats:
            raise ValueError(
                "RolloutConfig.sampling.resample_repeats is for evaluation only: a redrawn "
                "reply is not a sample of the policy the learner scores; set it to 0"
            )
        if self.sampling.temperature <= 0:
            raise ValueError(
                f"the actor must sample (temperature > 0), got {self.sampling.temperature}"
            )

    def sampling_for(self, seed: int) -> SamplingConfig:
        """The actor's sampling settings, with base seed ``seed``."""
        return dataclasses.replace(self.sampling, seed=seed)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rollout:
    """What one collection produced.

    Attributes:
      samples: the training rows, episodes in group order: one ``EpisodeSample`` per
        episode whose phases are token prefixes of each other, else one ``Sample`` per step.
      metrics: ``rollout/*`` and ``critic/*`` scalars.
      episodes: the finished episodes, ordered group by group.
      group_ids: per episode, its group (the task's position in the batch and its id).
      scores: per episode, per step, the critic's score or None.
      rewards: per episode, per step, the reward.
      advantages: per episode, [n_steps] float32 advantages.
    """

    samples: list[Sample | EpisodeSample]
    metrics: dict[str, float]
    episodes: list[FinishedEpisode]
    group_ids: list[tuple[int, str]]
    scores: list[list[float | None]]
    rewards: list[list[float]]
    advantages: list[np.ndarray]


def group_specs(tasks: Sequence[EpisodeSpec], group_size: int) -> list[EpisodeSpec]:
    """``group_size`` copies of each task with distinct episode ids ``<task id>#<b>.<g>``."""
    return [
        dataclasses.replace(spec, episode_id=f"{spec.task.task_id}#{b}.{g}")
        for b, spec in enumerate(tasks)
        for g in range(group_size)
    ]


def _sample(reply, advantage: float, where: str) -> Sample:
    for name in ("prompt_ids", "token_ids", "logprobs"):
        if not getattr(reply, name, None):
            raise ValueError(
                f"{where}: the actor's reply has no {name}; the actor must return token ids "
                "and log-probs (use a LocalPolicy)"
            )
    masks = reply_masks(reply)
    return Sample(
        prompt_ids=list(reply.prompt_ids),
        completion_ids=list(reply.token_ids),
        sampler_logprobs=list(reply.logprobs),
        advantage=float(advantage),
        masks=masks if any(m is not None for m in masks) else (),
    )


def _rows(episodes, advantages, multi_turn: bool) -> tuple[list, dict[str, float]]:
    """(training rows, row counts): one row per episode where its phases allow, else per step.

    A multi-turn episode that still needs a row per step (a phase's prompt is not a
    token prefix of the next, e.g. a policy without token ids) is reported on stderr.
    """
    rows, per_episode, per_phase = [], 0, 0
    for e, episode_adv in zip(episodes, advantages, strict=True):
        steps = [
            _sample(reply, adv, f"episode {e.spec.episode_id} step {i}")
            for i, (reply, adv) in enumerate(zip(e.replies, episode_adv, strict=True))
        ]
        whole = episode_sample(e.replies, episode_adv)
        if whole is None:
            rows += steps
            per_phase += len(steps)
        else:
            rows.append(whole)
            per_episode += 1
    if multi_turn and per_phase:
        print(
            f"[rollout] {per_phase} steps trained one row each: their multi-turn prompts are "
            "not token prefixes of the next (does the actor return token ids?)",
            file=sys.stderr,
            flush=True,
        )
    return rows, {
        "rollout/episode_rows": float(per_episode),
        "rollout/phase_rows": float(per_phase),
    }


def _mean(values) -> float:
    values = list(values)
    return float(np.mean(values)) if values else 0.0


def _metrics(episodes, scores, rewards, terms, advantages, group_ids, critic) -> dict:
    states = [e.state for e in episodes]
    steps = [s for state in states for s in state.steps]
    replies = [r for e in episodes for r in e.replies]
    out = {
        "rollout/episodes": float(len(states)),
        "rollout/steps": float(len(steps)),
        "rollout/reward_mean": _mean(sum(r) for r in rewards),
        "rollout/step_reward_mean": _mean(x for r in rewards for x in r),
        "rollout/final_reward_mean": _mean(r[-1] for r in rewards),
        "rollout/stop_rate": _mean(s.finish_reason == "stop" for s in states),
        "rollout/budget_rate": _mean(s.finish_reason == "budget" for s in states),
        "rollout/timeout_rate": _mean(s.finish_reason == "max_steps" for s in states),
        "rollout/prompt_length_rate": _mean(s.finish_reason == "prompt_length" for s in states),
        "rollout/steps_per_episode": _mean(len(s.steps) for s in states),
        "rollout/calls_per_episode": _mean(s.n_calls for s in states),
        "rollout/call_error_rate": _mean(
            not s.call_ok for s in steps if s.phase is Phase.GENERATE and s.parse_ok
        ),
        "rollout/truncated_rate": _mean(
            getattr(r, "finish_reason", "stop") == "length" for r in replies
        ),
        "rollout/completion_tokens_mean": _mean(len(getattr(r, "token_ids", ())) for r in replies),
        "rollout/advantage_abs_mean": _mean(np.abs(a).mean() for a in advantages),
        "critic/requested": float(critic.requested),
        "critic/unparsed": float(critic.unparsed),
        "critic/unparsed_rate": critic.unparsed / max(critic.requested, 1),
        "critic/score_mean": _mean(x for s in scores for x in s if x is not None),
        "rollout/episode_seconds": _mean(e.seconds for e in episodes),
    }
    inputs = [s for s in steps if s.phase is Phase.GENERATE and s.parse_ok]
    out["rollout/example_copy_rate"] = _mean(
        input_example.copies_example(s.messages, s.input_text) for s in inputs
    )
    out["rollout/distinct_calls_per_episode"] = _mean(
        len({s.call for s in state.steps if s.phase is Phase.GENERATE and s.parse_ok and s.call})
        for state in states
    )
    for phase in (Phase.CONCEPTUALIZE, Phase.GENERATE, Phase.REVISE):
        out[f"rollout/parse_failure_rate/{phase.value}"] = _mean(
            not s.parse_ok for s in steps if s.phase is phase
        )
    for key in rewards_lib.TERMS:
        out[f"rollout/term/{key}"] = _mean(sum(t[key] for t in ep) for ep in terms)
    groups: dict = {}
    for gid, r in zip(group_ids, rewards):
        groups.setdefault(gid, []).append(sum(r))
    out["rollout/flat_group_rate"] = _mean(np.ptp(v) == 0 for v in groups.values())
    return out


def collect(
    tasks: Sequence[EpisodeSpec],
    *,
    actor,
    critic,
    executor,
    references: Mapping[str, TaskReference] | None,
    config: RolloutConfig,
    episode_config: EpisodeConfig,
    reward_config: rewards_lib.RewardConfig,
    critic_config: critic_lib.CriticConfig,
    advantage_fn: Callable,
) -> Rollout:
    """Runs ``config.group_size`` episodes of each task and turns every step into a sample.

    Args:
      tasks: the batch's tasks (usually ``config.tasks_per_batch`` of them).
      actor: a ``Policy`` whose ``complete(conversations)`` replies have ``.text``,
        ``.prompt_ids``, ``.token_ids`` and ``.logprobs`` (e.g. a ``LocalPolicy``).
      critic: ``critic(conversations) -> texts`` (the frozen base model by default: ``training.step.reference_model``).
      executor: the sandbox ``Executor``.
      references: task id -> privileged information for the critic.
      config: group size and sandbox settings.
      episode_config: the protocol (``max_steps`` = T_max).
      reward_config: the reward schedule.
      critic_config: the critic's settings.
      advantage_fn: ``fn(rewards, group_ids) -> advantages`` from ``pau_jax.rl.credit``.

    Returns:
      A ``Rollout``.
    """
    if episode_config.max_steps != reward_config.max_steps:
        raise ValueError(
            f"EpisodeConfig.max_steps={episode_config.max_steps} differs from "
            f"RewardConfig.max_steps={reward_config.max_steps}; set both to T_max"
        )
    specs = group_specs(tasks, config.group_size)
    finished = runner.run_episode_states(
        specs,
        actor,
        executor,
        episode_config,
        call_timeout_s=config.call_timeout_s,
        max_parallel_calls=config.max_parallel_calls,
        progress=False,
    )
    by_id = {f.spec.episode_id: f for f in finished}
    # An episode whose first prompt was already too long has no step to train on.
    episodes = [by_id[spec.episode_id] for spec in specs if by_id[spec.episode_id].state.steps]
    if not episodes:
        raise ValueError(
            "every episode of the batch ended before its first step (prompt longer than "
            "SamplingConfig.max_prompt_tokens?); raise the limit or shorten the prompts"
        )
    position = {spec.episode_id: i for i, spec in enumerate(specs)}
    group_ids = [
        (position[e.spec.episode_id] // config.group_size, e.spec.task.task_id) for e in episodes
    ]
    verdict = critic_lib.score_episodes(
        critic, [e.state for e in episodes], references, critic_config
    )
    records = [rewards_lib.record_from_state(e.state, s) for e, s in zip(episodes, verdict.scores)]
    rewards = [rewards_lib.episode_rewards(r, reward_config) for r in records]
    terms = [rewards_lib.episode_terms(r, reward_config) for r in records]
    advantages = advantage_fn(rewards, group_ids)
    multi_turn = episode_config.conversation == "multi_turn"
    samples, row_counts = _rows(episodes, advantages, multi_turn)
    metrics = _metrics(episodes, verdict.scores, rewards, terms, advantages, group_ids, verdict)
    metrics["rollout/episodes_without_steps"] = float(len(specs) - len(episodes))
    metrics.update(row_counts)
    return Rollout(
        samples=samples,
        metrics=metrics,
        episodes=episodes,
        group_ids=group_ids,
        scores=verdict.scores,
        rewards=rewards,
        advantages=[np.asarray(a, np.float32) for a in advantages],
    )
