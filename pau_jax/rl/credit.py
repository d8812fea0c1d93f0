"""Credit assignment: turns per-step rewards of grouped episodes into per-step GRPO advantages.

Each function has the signature ``fn(rewards, group_ids, **constants)`` and is
chosen by reference (``advantage_fn = @return_to_go``); its constants are bound
in gin (``pau_jax.rl.credit.return_to_go.gamma = 0.0``).

* ``return_to_go`` (paper default): step t gets ``G_t = sum_{k >= t} gamma^(k-t) r_k``,
  normalised within its GRPO group. With ``normalize="position"`` (default) step t
  of an episode is compared only with step t of the group's other episodes:
  ``(G_t - mean_t) / (std_t + eps)`` over the episodes that have a step t (an
  episode that ended earlier has none). Every episode walks the phases in the
  same order, so position t compares like with like (a reasoning step with
  reasoning steps), and a group of identical episodes gets exactly zero
  advantage everywhere. ``normalize="pooled"`` pools the returns of all
  positions of the group before normalising (kept for comparison: it turns the
  step index into a signal, since early positions have larger returns).
  ``gamma`` defaults to 0, so each step is credited with its own reward. The
  paper's rewards are dense, per-step judgements (the critic rates each plan and
  each hypothesis; ``b_term`` rewards a CONTINUE on a bad hypothesis with +1 at
  that step), so summing later rewards (gamma = 1) lets an episode that keeps
  CONTINUE-ing on wrong hypotheses until the timeout collect a larger return at
  step 0 than one that STOPs early and correctly; gamma = 0 ranks the early
  correct STOP above it (worked example in ``docs/reproducing.md``).
* ``final_only`` (FINAL ablation): ``return_to_go`` on rewards whose
  intermediate entries are zeroed, so only the last step's reward reaches the
  advantages; ``gamma`` defaults to 1 so the outcome reaches every step.
* ``last_step_broadcast`` (released code): one number per episode, its last
  step's reward, normalised over the group's episodes (GRPO outcome
  advantages), broadcast to every step.

The standard deviation uses ``ddof`` (default 1, as ``torch.std``); a position
(or group) with fewer than ``ddof + 1`` values, or none to compare, gets
advantage 0.
"""

from collections.abc import Hashable, Sequence
from typing import Protocol

import numpy as np

NORMALIZE = ("position", "pooled")


class AdvantageFn(Protocol):
    def __call__(
        self, rewards: Sequence[Sequence[float]], group_ids: Sequence[Hashable]
    ) -> list[np.ndarray]: ...


def _check(rewards: Sequence[Sequence[float]], group_ids: Sequence[Hashable]) -> None:
    if len(rewards) != len(group_ids):
        raise ValueError(
            f"got {len(rewards)} episodes but {len(group_ids)} group ids; pass one id per episode"
        )
    for i, episode in enumerate(rewards):
        if len(episode) == 0:
            raise ValueError(f"episode {i} has no steps; drop empty episodes before credit")


def _groups(group_ids: Sequence[Hashable]) -> list[list[int]]:
    """Episode indices per group, groups in order of first appearance."""
    groups: dict[Hashable, list[int]] = {}
    for i, gid in enumerate(group_ids):
        groups.setdefault(gid, []).append(i)
    return list(groups.values())


def _standardise(values: np.ndarray, *, eps: float, ddof: int) -> np.ndarray:
    """(values - mean) / (std + eps); zeros when all are equal or too few for a std."""
    if values.size < max(2, ddof + 1):
        return np.zeros_like(values)
    std = values.std(ddof=ddof)
    if std == 0.0:
        return np.zeros_like(values)
    return (values - values.mean()) / (std + eps)


def _normalise(
    values: Sequence[np.ndarray], group_ids, *, eps: float, ddof: int, normalize: str
) -> list[np.ndarray]:
    """Per episode, its values standardised within the group (per position, or pooled)."""
    if normalize not in NORMALIZE:
        raise ValueError(f"normalize must be one of {NORMALIZE}, got {normalize!r}")
    out = [np.zeros(len(v), np.float64) for v in values]
    for members in _groups(group_ids):
        if normalize == "pooled":
            pooled = np.concatenate([values[i] for i in members])
            standard = _standardise(pooled, eps=eps, ddof=ddof)
            start = 0
            for i in members:
                out[i] = standard[start : start + len(values[i])]
                start += len(values[i])
            continue
        for t in range(max(len(values[i]) for i in members)):
            present = [i for i in members if len(values[i]) > t]
            column = _standardise(
                np.array([values[i][t] for i in present], np.float64), eps=eps, ddof=ddof
            )
            for i, value in zip(present, column):
                out[i][t] = value
    return [o.astype(np.float32) for o in out]


def discounted_returns(rewards: Sequence[float], gamma: float = 1.0) -> np.ndarray:
    """[n] returns ``G_t = r_t + gamma * G_{t+1}`` of one episode (float64)."""
    returns = np.zeros(len(rewards), np.float64)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        returns[t] = running
    return returns


def return_to_go(
    rewards: Sequence[Sequence[float]],
    group_ids: Sequence[Hashable],
    *,
    gamma: float = 0.0,
    normalize: str = "position",
    eps: float = 1e-6,
    ddof: int = 1,
) -> list[np.ndarray]:
    """Per-step advantages from each step's own (and, with gamma > 0, later) rewards.

    Args:
      rewards: per episode, its step rewards [n_e].
      group_ids: per episode, the id of its GRPO group (episodes of one prompt).
      gamma: discount of later rewards; 0 credits each step with its own reward.
      normalize: "position" (step t against step t of the group's other
        episodes) or "pooled" (all steps of the group together).
      eps: added to the standard deviation.
      ddof: delta degrees of freedom of the standard deviation.

    Returns:
      Per episode, [n_e] float32 advantages.
    """
    _check(rewards, group_ids)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    returns = [discounted_returns(episode, gamma) for episode in rewards]
    return _normalise(returns, group_ids, eps=eps, ddof=ddof, normalize=normalize)


def final_only(
    rewards: Sequence[Sequence[float]],
    group_ids: Sequence[Hashable],
    *,
    gamma: float = 1.0,
    normalize: str = "position",
    eps: float = 1e-6,
    ddof: int = 1,
) -> list[np.ndarray]:
    """``return_to_go`` on the final step's reward alone (intermediate rewards set to 0)."""
    _check(rewards, group_ids)
    sparse = [[0.0] * (len(episode) - 1) + [float(episode[-1])] for episode in rewards]
    return return_to_go(sparse, group_ids, gamma=gamma, normalize=normalize, eps=eps, ddof=ddof)


def last_step_broadcast(
    rewards: Sequence[Sequence[float]],
    group_ids: Sequence[Hashable],
    *,
    eps: float = 1e-6,
    ddof: int = 1,
) -> list[np.ndarray]:
    """Each episode's last-step reward, normalised over its group's episodes, on every step."""
    _check(rewards, group_ids)
    finals = [np.array([float(episode[-1])]) for episode in rewards]
    per_episode = _normalise(finals, group_ids, eps=eps, ddof=ddof, normalize="pooled")
    return [np.full(len(episode), adv[0], np.float32) for episode, adv in zip(rewards, per_episode)]
