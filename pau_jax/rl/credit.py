"""Credit assignment: turns per-step rewards of grouped episodes into per-step GRPO advantages.

The paper says only that the actor is trained with "GRPO on step rewards"; it
does not say how step rewards become advantages. Every rule here is therefore
pau_jax's reading (or the released code's), never the paper's own. Each
function has the signature ``fn(rewards, group_ids, **constants)`` and is chosen
by reference (``advantage_fn = @final_plus_mean``); its constants are bound in gin.
``describe(fn)`` gives the one-line label that run summaries record.

* ``final_plus_mean`` (default; pau_jax's reading): every step reward is
  normalised over all step rewards of its group, ``r~ = (r - mean(R)) / (std(R)
  + eps)``, as in process supervision; step t of an episode of n steps gets
  ``r~_{n-1} + mean_{t <= k < n-1} r~_k`` (the last step ``r~_{n-1}`` alone):
  how the episode ended (the STOP's b_term, the timeout) at full weight, plus the
  mean, not the sum, of what its steps from t up to the last earned. Every reward
  term reaches the gradient, but the number of steps that follow no longer
  multiplies what they earn. Two steps at one position (before their episodes'
  last) each hold two centred terms, so their order is that of
  ``mean(r_t..r_{n-2}) + r_{n-1}`` in raw rewards, whatever the rest of the
  group. Its costs: identical episodes get identical non-zero advantages where
  an episode's rewards vary (as under ``process_grpo``), and a step's own reward
  counts 1 / (n-1-t) in its advantage, shared with the steps before it.
* ``process_grpo`` (pau_jax's reading; the default before): GRPO with process
  supervision exactly as DeepSeekMath publishes it (Shao et al. 2024, section
  4.1.3), the published reference for GRPO on step rewards: the same
  normalisation, and step t gets ``sum_{k >= t} r~_k``. Every reward term
  reaches the gradient, but the sum lets the number of steps left outweigh what
  they earned: 12 CONTINUEs on bad hypotheses (each paid lambda_H (s + 1) >= 2)
  can outrank an early correct STOP (docs/reproducing.md).
* ``return_to_go`` (pau_jax's own rule): step t gets ``G_t = sum_{k >= t}
  gamma^(k-t) r_k``, normalised within its group. With ``normalize="position"``
  (default) step t of an episode is compared only with step t of the group's
  other episodes (those that have a step t); a group of identical episodes gets
  exactly zero. ``normalize="pooled"`` pools all positions (it turns the step
  index into a signal). ``gamma`` defaults to 0 (each step's own reward). Under
  gamma = 0 per position a term can act only where another episode of the group
  reaches the same position: the timeout, which only timed-out episodes reach,
  never acts, and an input step is credited with its own format terms only.
* ``final_only`` (FINAL ablation; pau_jax's reading): the default rule where only
  each episode's last step carries a reward. With one rewarded step per episode
  the default rule (and ``process_grpo`` alike) normalises the final rewards over
  the group's episodes and gives every step its episode's value (outcome
  supervision), so FINAL differs from the default only in sparsity. The
  intermediate steps carry no reward rather than a reward of 0, which would be
  normalised into a per-step penalty of its own. Numerically it equals ``last_step_broadcast``.
* ``last_step_broadcast`` (the released code): one number per episode, its last
  step's reward, normalised over the group's episodes, on every step.

The standard deviation uses ``ddof`` (default 1, as ``torch.std``). A set of
values that are all equal, or too few for a standard deviation, is standardised
to exactly 0 (tested by equality, not by a computed std of 0, which rounding
misses); a group of one episode gets 0 under every rule (nothing to compare).
"""

import functools
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
    """[n] (values - mean) / (std + eps); exactly 0 when all are equal or too few for a std."""
    if values.size < max(2, ddof + 1) or values.max() == values.min():
        return np.zeros_like(values)
    return (values - values.mean()) / (values.std(ddof=ddof) + eps)


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


def _group_normalised(
    rewards: Sequence[Sequence[float]], group_ids: Sequence[Hashable], *, eps: float, ddof: int
) -> list[np.ndarray | None]:
    """Per episode, [n_e] its step rewards standardised over all step rewards of its group.

    None for an episode alone in its group (nothing to compare with).
    """
    _check(rewards, group_ids)
    values = [np.asarray(episode, np.float64) for episode in rewards]
    out: list[np.ndarray | None] = [None] * len(values)
    for members in _groups(group_ids):
        if len(members) < 2:
            continue
        standard = _normalise(
            [values[i] for i in members], [0] * len(members), eps=eps, ddof=ddof, normalize="pooled"
        )
        for i, normalised in zip(members, standard):
            out[i] = normalised.astype(np.float64)
    return out


def final_plus_mean(
    rewards: Sequence[Sequence[float]],
    group_ids: Sequence[Hashable],
    *,
    eps: float = 1e-6,
    ddof: int = 1,
) -> list[np.ndarray]:
    """Group-normalised step rewards: the last one plus the mean of those from each step up to it.

    Args:
      rewards: per episode, its step rewards [n_e].
      group_ids: per episode, the id of its GRPO group (episodes of one prompt).
      eps: added to the standard deviation.
      ddof: delta degrees of freedom of the standard deviation.

    Returns:
      Per episode, [n_e] float32 advantages. With ``z`` the episode's step rewards
      normalised by the mean and std of all step rewards of the group, step t gets
      ``z[n_e - 1] + mean(z[t : n_e - 1])``, the last step ``z[n_e - 1]``. A group
      of one episode gets 0.
    """
    out = []
    for episode, z in zip(rewards, _group_normalised(rewards, group_ids, eps=eps, ddof=ddof)):
        if z is None:
            out.append(np.zeros(len(episode), np.float32))
            continue
        before_last = z[:-1]
        advantages = np.full(len(z), z[-1])
        advantages[:-1] += np.cumsum(before_last[::-1])[::-1] / np.arange(len(before_last), 0, -1)
        out.append(advantages.astype(np.float32))
    return out


def process_grpo(
    rewards: Sequence[Sequence[float]],
    group_ids: Sequence[Hashable],
    *,
    eps: float = 1e-6,
    ddof: int = 1,
) -> list[np.ndarray]:
    """GRPO with process supervision (DeepSeekMath): group-normalised step rewards, summed onwards.

    Args:
      rewards: per episode, its step rewards [n_e].
      group_ids: per episode, the id of its GRPO group (episodes of one prompt).
      eps: added to the standard deviation.
      ddof: delta degrees of freedom of the standard deviation.

    Returns:
      Per episode, [n_e] float32 advantages: step t gets the sum over k >= t of
      its episode's step rewards normalised by the mean and std of all step
      rewards of the group. A group of one episode gets 0.
    """
    out = []
    for episode, z in zip(rewards, _group_normalised(rewards, group_ids, eps=eps, ddof=ddof)):
        if z is None:
            out.append(np.zeros(len(episode), np.float32))
            continue
        out.append(np.cumsum(z[::-1])[::-1].astype(np.float32))
    return out


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
    eps: float = 1e-6,
    ddof: int = 1,
) -> list[np.ndarray]:
    """The default rule with only each episode's final step rewarded: its value on every step."""
    _check(rewards, group_ids)
    finals = final_plus_mean([[float(e[-1])] for e in rewards], group_ids, eps=eps, ddof=ddof)
    return [np.full(len(e), f[0], np.float32) for e, f in zip(rewards, finals)]


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


_LABELS = {
    final_plus_mean: (
        "every step reward normalised over all steps of its group; each step credited with its "
        "episode's last normalised reward plus the mean of its normalised rewards from that "
        "step up to the last; pau_jax's reading of the paper's 'GRPO on step rewards'"
    ),
    process_grpo: (
        "GRPO with process supervision (DeepSeekMath): every step reward normalised over all "
        "steps of its group, each step credited with the sum from it on; pau_jax's reading "
        "of the paper's 'GRPO on step rewards'"
    ),
    return_to_go: (
        "return-to-go normalised within the group (per step position by default); "
        "pau_jax's reading, not the paper's"
    ),
    final_only: (
        "FINAL: the default credit rule on the final step's reward alone (outcome GRPO, "
        "broadcast to every step); pau_jax's reading of the paper's FINAL ablation"
    ),
    last_step_broadcast: (
        "the last step's reward normalised over the group's episodes, broadcast to every "
        "step; the released code's credit"
    ),
}


def describe(fn) -> str:
    """One line naming the credit rule ``fn`` and where it comes from (for run summaries).

    Accepts the functions of this module (also as gin wraps them, or as a
    ``functools.partial``, whose keywords are listed) and any other callable,
    named by its module and name. Constants bound in gin are not visible here;
    the run's operative config records them.
    """
    keywords = {}
    while isinstance(fn, functools.partial):
        keywords = {**fn.keywords, **keywords}
        fn = fn.func
    fn = getattr(fn, "__wrapped__", fn)
    name = getattr(fn, "__name__", type(fn).__name__)
    label = _LABELS.get(fn)
    if label is None:
        module = getattr(fn, "__module__", None) or "?"
        label = f"a credit function outside pau_jax.rl.credit ({module}.{name})"
    constants = ", ".join(f"{k}={v!r}" for k, v in sorted(keywords.items()))
    return f"{name}: {label}" + (f" [{constants}]" if constants else "")
