"""How often a credit rule ranks an early correct STOP below a long run of bad-hypothesis CONTINUEs.

    python benchmarks/credit_ranking.py                  # seed 0, 300 groups per setting
    python benchmarks/credit_ranking.py --seed 1 --groups 1000

Episodes are built as the rewards see them (`rewards.EpisodeRecord`) and scored
with the paper's schedule (`RewardConfig()`, T_max = 40). In each GRPO group:

* **correct**: k cycles (reasoning, input, reflection) that CONTINUE on
  mid-score hypotheses (s in [0.3, 0.7]), then a cycle whose reflection STOPs on
  a good one (s in (0.7, 1]); its reasoning steps score in [0.5, 1];
* **long**: 13 cycles that CONTINUE on bad hypotheses (s in [0, 0.3)), the 13th
  with no call left, then a 40th step (a plan) and the timeout; reasoning scores
  in [0, 1];
* **others**: 1 to 13 cycles with every score in [0, 1], ending with a STOP
  (or, after 13 cycles, at the timeout).

Word counts vary (reasoning and reflection 20 to 120 words, inputs 1 to 34), so
every length term acts, and one input in ten fails to parse, one in ten raises.

Two settings, each over `--groups` seeded groups:

* **stop**: k in {0, 1, 2}, 0 to 6 others; is the correct episode's advantage at
  its STOP position below the long run's advantage at that position?
* **step 0**: k in {1, 2, 3}, no others (two-episode groups); is it below at step 0?

Rules: every rule of `pau_jax.rl.credit` that credits steps differently, and
`mean_to_go` (not in credit.py: the mean of the normalised rewards from t on,
i.e. `process_grpo`'s sum divided by the number of steps it sums), which shows
why the default keeps the last reward at full weight. The last line is
`stop_<rule>=N step0_<rule>=N ...` (counts of groups ranked below).
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pau_jax.env.episode import Phase  # noqa: E402
from pau_jax.rl import credit, rewards  # noqa: E402
from pau_jax.rl.rewards import EpisodeRecord, RewardConfig, StepRecord  # noqa: E402

PAPER = RewardConfig()
C, G, R = Phase.CONCEPTUALIZE, Phase.GENERATE, Phase.REVISE
CYCLES = (PAPER.max_steps - 1) // 3  # 13: the cycles that fit in T_max = 40 steps


def mean_to_go(rewards_, group_ids, **kwargs) -> list[np.ndarray]:
    """The mean of the group-normalised rewards from each step on (not a rule of credit.py)."""
    sums = credit.process_grpo(rewards_, group_ids, **kwargs)
    return [(s / np.arange(len(s), 0, -1)).astype(np.float32) for s in sums]


RULES = {
    "final_plus_mean": credit.final_plus_mean,
    "process_grpo": credit.process_grpo,
    "mean_to_go": mean_to_go,
    "return_to_go": credit.return_to_go,
}


def _words(rng, lo: int, hi: int) -> str:
    return " ".join(["w"] * int(rng.integers(lo, hi + 1)))


def _cycle(rng, hypothesis: tuple[float, float], plan: tuple[float, float] = (0.0, 1.0)):
    """(reasoning, input, reflection) steps with scores drawn from the given ranges."""
    reasoning = StepRecord(
        phase=C, output=_words(rng, 20, 120), parse_ok=True, score=float(rng.uniform(*plan))
    )
    u, text = rng.uniform(), _words(rng, 1, 34)
    if u < 0.1:
        call = StepRecord(phase=G, output=text, parse_ok=False, input_text="", call_ok=False)
    else:
        call = StepRecord(
            phase=G, output=f"```\n{text}\n```", parse_ok=True, input_text=text, call_ok=u >= 0.2
        )
    reflection = StepRecord(
        phase=R, output=_words(rng, 20, 120), parse_ok=True, score=float(rng.uniform(*hypothesis))
    )
    return (reasoning, call, reflection)


def _plan(rng) -> tuple[StepRecord]:
    return (StepRecord(phase=C, output=_words(rng, 20, 120), parse_ok=True, score=rng.uniform()),)


def early_correct(rng, k: int) -> EpisodeRecord:
    """k CONTINUEs on mid-score hypotheses, then a correct STOP; reasoning scores in [0.5, 1]."""
    steps = sum((_cycle(rng, (0.3, 0.7), plan=(0.5, 1.0)) for _ in range(k)), ())
    steps += _cycle(rng, (np.nextafter(0.7, 1.0), 1.0), plan=(0.5, 1.0))
    return EpisodeRecord(steps=steps, done=True, timed_out=False)


def long_bad(rng) -> EpisodeRecord:
    """13 CONTINUEs on bad hypotheses, a 40th step and the timeout at T_max."""
    steps = sum((_cycle(rng, (0.0, np.nextafter(0.3, 0.0))) for _ in range(CYCLES)), ())
    return EpisodeRecord(steps=steps + _plan(rng), done=False, timed_out=True)


def other(rng) -> EpisodeRecord:
    """1 to 13 cycles, every score in [0, 1]; a STOP, or the timeout after 13 cycles."""
    n = int(rng.integers(1, CYCLES + 1))
    steps = sum((_cycle(rng, (0.0, 1.0)) for _ in range(n)), ())
    if n == CYCLES:
        return EpisodeRecord(steps=steps + _plan(rng), done=False, timed_out=True)
    return EpisodeRecord(steps=steps, done=True, timed_out=False)


def stop_groups(seed: int, n: int, config: RewardConfig = PAPER) -> list[list[list[float]]]:
    """n groups (step rewards): the correct episode first, the long run second, 0-6 others."""
    rng = np.random.default_rng((seed, 0))
    groups = []
    for _ in range(n):
        records = [early_correct(rng, int(rng.integers(0, 3))), long_bad(rng)]
        records += [other(rng) for _ in range(int(rng.integers(0, 7)))]
        groups.append([rewards.episode_rewards(r, config) for r in records])
    return groups


def step0_groups(seed: int, n: int, config: RewardConfig = PAPER) -> list[list[list[float]]]:
    """n two-episode groups (step rewards): the correct episode (k in 1..3) and the long run."""
    rng = np.random.default_rng((seed, 1))
    records = [(early_correct(rng, int(rng.integers(1, 4))), long_bad(rng)) for _ in range(n)]
    return [[rewards.episode_rewards(r, config) for r in pair] for pair in records]


def ranked_below(fn, groups, *, at: str) -> int:
    """Groups where ``fn`` gives the correct episode (first) less than the long run (second).

    Args:
      fn: a credit function.
      groups: per group, its episodes' step rewards, the correct episode first, the long second.
      at: 'stop' (the correct episode's last position) or 'step0'.
    """
    count = 0
    for group in groups:
        correct, long_run = fn(group, [0] * len(group))[:2]
        t = len(group[0]) - 1 if at == "stop" else 0
        count += bool(correct[t] < long_run[t])
    return count


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--groups", type=int, default=300)
    args = parser.parse_args(argv)
    stop, step0 = stop_groups(args.seed, args.groups), step0_groups(args.seed, args.groups)
    counts = {}
    print(f"| rule | stop position (of {args.groups}) | step 0, two episodes (of {args.groups}) |")
    print("|---|---|---|")
    for name, fn in RULES.items():
        counts[f"stop_{name}"] = ranked_below(fn, stop, at="stop")
        counts[f"step0_{name}"] = ranked_below(fn, step0, at="step0")
        print(f"| `{name}` | {counts[f'stop_{name}']} | {counts[f'step0_{name}']} |")
    print(" ".join(f"{key}={value}" for key, value in counts.items()))
    return counts


if __name__ == "__main__":
    main()
