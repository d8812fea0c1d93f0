"""Does AAC raise the training reward of a real model? Credit rules against a frozen control.

Runs of `pau_jax.rl.loop.train` from one seed (same LoRA init, task order and sampling seeds):
one per credit rule in `--credits` (default: `final_plus_mean`, loop.train's default) and a
control at learning rate 0 (the initial policy: the loop runs no update for it, so it cannot
change). The runs advance in rounds of one step each, every step checkpointed, until `--steps`
or until the next round would pass `--wall_minutes`, so all have the same number of steps.
Step 1 is identical in all runs (no update has acted yet) and step t draws the same tasks and
sampling seed in each, so the runs' step-t rewards are paired.

    python benchmarks/aac_learning.py --out runs/aac_learning                  # SmolLM2-135M
    python benchmarks/aac_learning.py --out runs/aac_coder05 \
        --checkpoint ~/.cache/pau_jax/qwen2.5-coder-0.5b-instruct --tasks_per_batch 2 \
        --group_size 4 --t_max 7 --max_new_tokens 64 --critic_tokens 48 --taus 16 4 16 \
        --conversation multi_turn --decode_weights q8 --remat --micro_batch_size 4 \
        --steps 12 --last_k 6 --wall_minutes 118          # the code model, ~2 hours here
    python benchmarks/aac_learning.py --out /tmp/aac_tiny --checkpoint tiny --dataset demo \
        --steps 2 --group_size 2 --max_new_tokens 8 --critic_tokens 4   # smoke test, random model

A rerun with the same `--out` continues: the loop resumes each run from its latest
checkpoint, finished steps and runs are kept, and settings other than those recorded in
`settings.json` are refused, except how the learner computes the same gradient
(`SAME_GRADIENT`: micro-batch size, remat), recorded as `changed_on_resume`. `--wall_minutes` counts this invocation only.

Settings that differ from the paper to fit 2 CPU cores are printed at the start and written
into the report (tasks x G per step, T_MAX, reply lengths, length thresholds scaled to those
replies, learning rate 1e-3 instead of 1e-6, which moves nothing measurable in a few steps,
float32 with micro-batches, the small `pau/debug` train split). Kept from the paper: the call
budget (25), LoRA rank 16 / alpha 16, temperature 1, the critic (frozen base, greedy, gold
description), the reward constants, GRPO clip 0.2, KL beta 0.001, AdamW (weight decay 0.01,
clip norm 1). `--conversation multi_turn` scores each episode as one learner row,
`--decode_weights q8` samples with 8-bit decode weights (the learner corrects for the
mismatch with truncated importance weights), `--remat` recomputes each layer's activations
in the backward pass (CPU memory).

Read from each run's metrics.jsonl (`KEYS`; a missing one fails with its name, except the
update's own keys in the control): the curves (`CURVES`: reward, input parse rate, critic
score, calls, distinct calls, copies of the prompt's example, stop and timeout rates), every
reward term (`TERM_CURVES`) and the diagnostics (`DIAGNOSTICS`). The credit rule is wrapped
(`AdvantageProbe`) to log per step what the loop does not: the share of groups whose
advantages are all zero, the advantage variance and the within-group spread of returns
(`advantages.jsonl`).

Tests: for each trained run, a one-sided paired sign-flip permutation test
(`pau_jax.evaluation.stats.paired_permutation_test`, exact) that its per-step mean episode
reward over the last k steps exceeds the control's (the smallest possible p is 2^-k), and the
same test on the reward without its length term (`NON_LENGTH`). With more than one trained
run the p-values are also given Holm-corrected. A run with p >= alpha or no gain gets a
diagnosis with numbers.

Writes to `--out`: learning_curves.png, reward_terms.png, diagnostics.png, aac_learning.md
(tables for docs/benchmarks.md, one per-step table of the reward and each term), results.json,
runs/<run>/. The last line is `p_<run>=... reward_gain_<run>=... p_non_length_<run>=...
last_k=... steps=...` (gain: mean over the last k steps of trained minus control reward).
"""

import argparse
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from pau_jax import metrics_writer, run_claim  # noqa: E402
from pau_jax.env.episode import EpisodeConfig  # noqa: E402
from pau_jax.evaluation import stats  # noqa: E402
from pau_jax.models import qwen3  # noqa: E402
from pau_jax.policy.config import SamplingConfig  # noqa: E402
from pau_jax.rl import credit, loop  # noqa: E402
from pau_jax.rl.critic import CriticConfig  # noqa: E402
from pau_jax.rl.grpo import GRPOConfig  # noqa: E402
from pau_jax.rl.learner import LearnerConfig  # noqa: E402
from pau_jax.rl.rewards import TERMS, RewardConfig  # noqa: E402
from pau_jax.rl.rollout import RolloutConfig  # noqa: E402
from pau_jax.tasks import DatasetConfig, DemoTasksConfig  # noqa: E402
from pau_jax.training import artefacts  # noqa: E402
from pau_jax.training import checkpoint as checkpoint_lib  # noqa: E402
from pau_jax.training.run import ActorConfig  # noqa: E402

SMOLLM2 = "~/.cache/pau_jax/smollm2-135m-instruct"
TINY = dict(  # `--checkpoint tiny`: a 1-layer random Qwen3 over the real vocabulary
    vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-6,
    rope_theta=1e6, tie_word_embeddings=True, max_position_embeddings=4096,
)  # fmt: skip
CREDIT = {
    "final_plus_mean": credit.final_plus_mean,  # loop.train's default
    "process_grpo": credit.process_grpo,
    "return_to_go": credit.return_to_go,
}
CONTROL = "control"
CREDIT[CONTROL] = credit.final_plus_mean  # Unused at learning rate 0 (no update runs).

REWARD = "rollout/reward_mean"
PARSE_FAILURE = "rollout/parse_failure_rate/generate"
# Panel label -> metrics.jsonl key; "input parse rate" is 1 minus its key.
CURVES = {
    "episode reward": REWARD,
    "input parse rate": PARSE_FAILURE,
    "critic score": "critic/score_mean",
    "calls per episode": "rollout/calls_per_episode",
    "stop rate": "rollout/stop_rate",
    "timeout rate": "rollout/timeout_rate",
    "distinct calls per episode": "rollout/distinct_calls_per_episode",
    "copies of the prompt's example": "rollout/example_copy_rate",
}
# What exploring looks like, tested both ways (trained − control), Holm over the three.
EXPLORATION = ("input parse rate", "distinct calls per episode", "copies of the prompt's example")
TERM_CURVES = {f"term: {t}": f"rollout/term/{t}" for t in TERMS}
DIAGNOSTICS = {
    "flat groups (tied returns)": "rollout/flat_group_rate",
    "mean |advantage|": "rollout/advantage_abs_mean",
    "grad norm (before clip)": "train/grad_norm",
    "update norm": "train/update_norm",
    "KL to base (k3, per token)": "grpo/kl",
    "clip fraction": "grpo/clip_fraction",
    "entropy": "grpo/entropy",
    "critic replies unparsed": "critic/unparsed_rate",
    "reflection parse failures": "rollout/parse_failure_rate/revise",
    "rollout seconds": "time/rollout_seconds",
    "update seconds": "time/update_seconds",
}
TIMES = ("time/rollout_seconds", "time/update_seconds")
KEYS = (*CURVES.values(), *TERM_CURVES.values(), *DIAGNOSTICS.values())
# A control run (learning rate 0) skips the update: it logs none of these.
UPDATE_KEYS = tuple(k for k in KEYS if k.startswith(("train/", "grpo/")))
# The reward without its length term: what the protocol is about, not how long replies are.
NON_LENGTH = "reward without the length term"
# Logged by the credit wrapper (advantages.jsonl), not by the loop.
PROBE = {
    "groups with all-zero advantages": "zero_advantage_group_rate",
    "advantage variance": "advantage_var",
    "within-group return std": "group_return_std",
}


def advantage_stats(rewards, group_ids, advantages) -> dict[str, float]:
    """Per step of training: how much signal the credit rule passed on.

    Args:
      rewards: per episode, its step rewards [n_e].
      group_ids: per episode, its GRPO group.
      advantages: per episode, [n_e] advantages.
    """
    groups: dict = {}
    for i, gid in enumerate(group_ids):
        groups.setdefault(gid, []).append(i)
    flat = np.concatenate([np.asarray(a, np.float64) for a in advantages])
    return {
        "zero_advantage_group_rate": float(
            np.mean([all(not np.any(advantages[i]) for i in m) for m in groups.values()])
        ),
        "zero_advantage_step_rate": float(np.mean(flat == 0)),
        "advantage_var": float(flat.var()),
        "group_return_std": float(
            np.mean([np.std([sum(rewards[i]) for i in m]) for m in groups.values()])
        ),
    }


class AdvantageProbe:
    """A credit function that also appends ``advantage_stats`` of every call to a JSONL file.

    The loop calls the credit rule once per training step, so call n of a run that resumes
    after step ``first_step - 1`` is step ``first_step + n``.
    """

    def __init__(self, fn, path: pathlib.Path, first_step: int):
        self.__wrapped__ = fn  # credit.describe names the wrapped rule.
        self.path, self.step = path, first_step

    def __call__(self, rewards, group_ids):
        advantages = self.__wrapped__(rewards, group_ids)
        row = {"step": self.step, **advantage_stats(rewards, group_ids, advantages)}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        self.step += 1
        return advantages


def one_sided_test(trained, control) -> tuple[float, float]:
    """(p, gain): paired sign-flip test that mean(trained - control) > 0, and that mean.

    Exact (all 2^k sign patterns) up to k = 16 steps, 65,536 random patterns beyond.

    Args:
      trained, control: [k] per-step rewards of the same steps (paired by step).
    """
    trained, control = np.asarray(trained, np.float64), np.asarray(control, np.float64)
    p = stats.paired_permutation_test(
        trained, control, n_permutations=2**16, alternative="greater", seed=0
    )
    return p, float(np.mean(trained - control))


def read_run(run_dir: pathlib.Path, steps: int) -> tuple[dict, dict]:
    """({key: [steps] values} of ``KEYS``, {probe key: [steps] values, NaN where absent}).

    Raises:
      ValueError: a step is missing, or a step lacks one of ``KEYS``.
    """
    rows = {row["step"]: row for row in metrics_writer.read_rows(run_dir)}
    missing = [s for s in range(1, steps + 1) if s not in rows]
    if missing:
        raise ValueError(
            f"{run_dir}/metrics.jsonl has no row for steps {missing}; rerun with the same --out"
        )
    for key in KEYS:
        if key in UPDATE_KEYS and all(key not in rows[s] for s in range(1, steps + 1)):
            continue  # a run without updates (learning rate 0)
        lacking = [s for s in range(1, steps + 1) if key not in rows[s]]
        if lacking:
            raise ValueError(
                f"{run_dir}/metrics.jsonl: step {lacking[0]} has no {key!r}; the training loop "
                "no longer logs it (update KEYS in benchmarks/aac_learning.py)"
            )
    curves = {
        k: np.array([float(rows[s].get(k, np.nan)) for s in range(1, steps + 1)]) for k in KEYS
    }
    curves[NON_LENGTH] = curves[REWARD] - curves["rollout/term/length"]
    curves[PARSE_FAILURE] = 1.0 - curves[PARSE_FAILURE]  # Shown as the input parse rate.
    # A step whose critic replies all failed to parse logs a score of 0; it had none.
    curves["critic/score_mean"][curves["critic/unparsed_rate"] >= 1] = np.nan
    probe_rows = {}
    path = run_dir / "advantages.jsonl"
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.endswith("}"):  # A line torn by a kill is left out.
                probe_rows[json.loads(line)["step"]] = json.loads(line)  # A redone step wins.
    probe = {
        k: np.array([probe_rows.get(s, {}).get(k, np.nan) for s in range(1, steps + 1)])
        for k in PROBE.values()
    }
    return curves, probe


def two_sided_test(trained, control) -> tuple[float, float]:
    """(p, mean difference): paired sign-flip test that the means differ, either way.

    Twice the smaller one-sided p (capped at 1): exact where `one_sided_test` is.
    """
    p_up, diff = one_sided_test(trained, control)
    p_down, _ = one_sided_test(-np.asarray(trained), -np.asarray(control))
    return min(1.0, 2 * min(p_up, p_down)), diff


def analyse(curves: dict, probes: dict, *, trained, last_k: int, alpha: float) -> dict:
    """The tests of each trained run against the control over the last ``last_k`` steps.

    Two tests per trained run (the total reward, the reward without its length term);
    ``p_holm`` corrects each family of tests over the trained runs (Holm). Apart from
    them, ``exploration``: a two-sided test of each `EXPLORATION` curve, Holm over the three
    of one run (what the actor does, whether or not the reward moved).
    """
    runs = (*trained, CONTROL)
    steps = len(curves[CONTROL][REWARD])
    k = min(last_k, steps)
    out = {"steps": steps, "last_k": k, "alpha": alpha, "smallest_p": 2.0**-k, "runs": {}}
    for name in runs:
        c = curves[name]
        entry = {
            "reward_last_k": float(c[REWARD][-k:].mean()),
            **{label: _mean(c[key][-k:]) for label, key in CURVES.items()},
        }
        if name in trained:
            entry["p"], entry["gain"] = one_sided_test(c[REWARD][-k:], curves[CONTROL][REWARD][-k:])
            entry["p_non_length"], entry["gain_non_length"] = one_sided_test(
                c[NON_LENGTH][-k:], curves[CONTROL][NON_LENGTH][-k:]
            )
            entry["learns"] = entry["p"] < alpha and entry["gain"] > 0
            tests = [
                two_sided_test(c[CURVES[label]][-k:], curves[CONTROL][CURVES[label]][-k:])
                for label in EXPLORATION
            ]
            holm_p = holm([p for p, _ in tests])
            entry["exploration"] = {
                label: {"difference": d, "p": p, "p_holm": h}
                for label, (p, d), h in zip(EXPLORATION, tests, holm_p)
            }
            entry["diagnosis"] = [] if entry["learns"] else diagnose(c, probes[name])
        out["runs"][name] = entry
    for key in ("p", "p_non_length"):
        for name, p_adj in zip(trained, holm([out["runs"][n][key] for n in trained])):
            out["runs"][name][key + "_holm"] = p_adj
    first = [float(curves[n][REWARD][0]) for n in runs]
    out["step1_identical"] = bool(np.allclose(first, first[0], rtol=0, atol=1e-9))
    return out


def holm(p_values) -> list[float]:
    """Holm-adjusted p-values (step-down, monotone, capped at 1)."""
    order = np.argsort(p_values)
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def _mean(x) -> float:
    """Mean of the finite values (NaN marks a step without a record); NaN when there are none."""
    x = np.asarray(x, np.float64)
    return float(x[np.isfinite(x)].mean()) if np.isfinite(x).any() else float("nan")


def diagnose(c: dict, probe: dict) -> list[str]:
    """Lines with the numbers that say why a run's reward did not rise."""
    zero = probe["zero_advantage_group_rate"]
    per_step = np.round(zero, 2).tolist()
    grad = c["train/grad_norm"]
    lines = [
        f"groups with all-zero advantages {_mean(zero):.2f} (per step {per_step}); groups "
        f"with tied returns {_mean(c['rollout/flat_group_rate']):.2f}",
        f"advantage variance {_mean(probe['advantage_var']):.3g}, mean |A| "
        f"{_mean(c['rollout/advantage_abs_mean']):.3g}, within-group return std "
        f"{_mean(probe['group_return_std']):.3g}",
        f"grad norm mean {_mean(grad):.3g} (max {np.max(grad):.3g}; clipped at 1 on "
        f"{np.mean(grad > 1):.0%} of steps), update norm mean {_mean(c['train/update_norm']):.3g}",
        f"adapter vs base: k3 KL per sampled token {c['grpo/kl'][0]:.3g} at step 1 -> "
        f"{c['grpo/kl'][-1]:.3g} at the last step; entropy {c['grpo/entropy'][0]:.3g} -> "
        f"{c['grpo/entropy'][-1]:.3g}; clip fraction {_mean(c['grpo/clip_fraction']):.3g}",
        f"critic replies unparsed {_mean(c['critic/unparsed_rate']):.2f}; input parse rate "
        f"{_mean(c[PARSE_FAILURE]):.2f}; reflection parse failures "
        f"{_mean(c['rollout/parse_failure_rate/revise']):.2f}; stop rate "
        f"{_mean(c['rollout/stop_rate']):.2f}",
    ]
    hints = []
    if _mean(zero) >= 0.5:
        hints.append("most groups pass no signal (their step rewards tie)")
    if _mean(c["critic/unparsed_rate"]) >= 0.9:
        hints.append("the critic's replies are not parsed, so no reward has a critic term")
    if np.max(c[PARSE_FAILURE]) == 0:
        hints.append("no input ever parsed: every input step gets the failure reward")
    if np.max(c["rollout/stop_rate"]) == 0:
        hints.append("the agent never said STOP: every episode ran to its limit")
    if c["grpo/kl"][-1] < 1e-4:
        hints.append("the adapter barely changed the policy's log-probs")
    return lines + ["hints: " + ("; ".join(hints) if hints else "none of the usual causes")]


def plot(curves: dict, panels: dict, path: pathlib.Path, runs, extra: dict | None = None) -> None:
    """One panel per entry of ``panels`` (label -> key), one line per run; PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    series = [(label, lambda name, key=key: curves[name][key]) for label, key in panels.items()]
    series += [(label, fn) for label, fn in (extra or {}).items()]
    cols = 3
    rows = -(-len(series) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3 * rows), squeeze=False)
    for ax, (label, values) in zip(axes.flat, series):
        for name in runs:
            y = values(name)
            style = dict(linestyle="--", color="gray") if name == CONTROL else {}
            ax.plot(np.arange(1, len(y) + 1), y, marker="o", markersize=3, label=name, **style)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("training step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in list(axes.flat)[len(series) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown(result: dict, curves: dict, settings_rows: list, wall_s: float, trained) -> str:
    """The tables for docs/benchmarks.md."""
    k, runs = result["last_k"], result["runs"]
    names = (*trained, CONTROL)
    lines = ["| setting | here | paper | why |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in settings_rows]
    lines += [
        "",
        f"Means over the last {k} of {result['steps']} steps; p: one-sided exact paired "
        f"sign-flip test against the control (smallest possible {result['smallest_p']:.3g}); "
        "p (no length): the same test on the reward without its length term; with more "
        "than one trained run, Holm-corrected values in brackets.",
    ]
    head = ["run", "reward", "gain vs control", "p", "gain (no length)", "p (no length)"]
    head += [*list(CURVES)[1:], "rollout s", "update s"]
    lines += ["", "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]

    def p_text(r, key):
        return f"{r[key]:.3g}" + (f" [{r[key + '_holm']:.3g}]" if len(trained) > 1 else "")

    for name in names:
        r, c = runs[name], curves[name]
        test = ["", "", "", ""]
        if name in trained:
            test = [f"{r['gain']:+.3f}", p_text(r, "p")]
            test += [f"{r['gain_non_length']:+.3f}", p_text(r, "p_non_length")]
        parts = [f"{r[label]:.3f}" for label in list(CURVES)[1:]]
        times = [f"{c[key].sum():.0f}" for key in TIMES]
        lines.append(f"| {name} | {r['reward_last_k']:.3f} | " + " | ".join(test + parts + times))
        lines[-1] += " |"
    for name in trained:
        found = "; ".join(
            f"{label} {t['difference']:+.3f} (p {t['p']:.3g}, Holm {t['p_holm']:.3g})"
            for label, t in runs[name]["exploration"].items()
        )
        lines += [
            "",
            f"Exploration, `{name}` − control over the last {k} steps (two-sided paired "
            f"sign-flip test, Holm over the three): {found}.",
        ]
    lines += [
        "",
        "Reward per step, then each reward term per step (sums over an episode, means over ",
    ]
    lines[-1] += "the step's episodes):"
    terms = [(n, REWARD) for n in names] + [(n, f"rollout/term/{t}") for t in TERMS for n in names]
    head = ["step"] + [f"{n} {'reward' if k == REWARD else k.split('/')[-1]}" for n, k in terms]
    lines += ["", "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for s in range(result["steps"]):
        lines.append(
            f"| {s + 1} | " + " | ".join(f"{curves[n][k][s]:.3f}" for n, k in terms) + " |"
        )
    for name in trained:
        if runs[name]["diagnosis"]:
            lines += ["", f"Why `{name}` did not learn:", ""]
            lines += [f"- {line}" for line in runs[name]["diagnosis"]]
    logged = sum(curves[n][key].sum() for n in names for key in TIMES)
    lines += [
        "",
        f"Rollouts and updates of all runs (as logged): {logged / 60:.1f} min; wall time of "
        f"this invocation: {wall_s / 60:.1f} min.",
    ]
    return "\n".join(lines) + "\n"


def headline(result: dict, trained) -> str:
    runs = result["runs"]
    return (
        " ".join(f"p_{n}={runs[n]['p']:.3g}" for n in trained)
        + " "
        + " ".join(f"reward_gain_{n}={runs[n]['gain']:+.3f}" for n in trained)
        + " "
        + " ".join(f"p_non_length_{n}={runs[n]['p_non_length']:.3g}" for n in trained)
        + f" last_k={result['last_k']} steps={result['steps']}"
    )


# Settings that change how the learner computes the same gradient (memory, not results):
# a resumed run may change them (`run_claim` leaves them out of a run's fingerprint too).
SAME_GRADIENT = frozenset(run_claim.RESUMABLE_FIELDS["pau_jax.rl.learner.LearnerConfig"])


def _settings(args) -> tuple[dict, list]:
    """(the run-defining settings, rows of setting / here / paper / why)."""
    settings = {
        name: getattr(args, name)
        for name in (
            "checkpoint",
            "dataset",
            "seed",
            "tasks_per_batch",
            "group_size",
            "t_max",
            "max_new_tokens",
            "critic_tokens",
            "learning_rate",
            "lora_rank",
            "micro_batch_size",
            "conversation",
            "decode_weights",
            "remat",
            "remat_min_tokens",
        )
    }
    settings["taus"] = list(args.taus)
    settings["credits"] = list(args.credits)
    rows = [
        ("tasks x G per step", f"{args.tasks_per_batch} x {args.group_size}", "8 x 8", "CPU time"),
        ("steps", args.steps, "5 epochs", "wall budget"),
        ("T_MAX (phases)", args.t_max, 40, f"at most {max(0, (args.t_max - 1) // 2)} calls"),
        (
            "actor / critic new tokens",
            f"{args.max_new_tokens} / {args.critic_tokens}",
            "512 / 128",
            "decode time",
        ),
        (
            "length taus (reason/input/reflect)",
            "/".join(map(str, args.taus)),
            "100/30/100",
            "scaled to the short replies",
        ),
        ("learning rate", args.learning_rate, 1e-6, "visible change in few steps"),
        ("LoRA rank = alpha", args.lora_rank, 16, ""),
        ("dtype / micro-batch", f"float32 / {args.micro_batch_size}", "bfloat16 / none", "CPU"),
        ("credit", " vs ".join(args.credits), "process reward GRPO", "loop.train's default"),
        ("conversation", args.conversation, "fresh prompts", "one learner row per episode"),
        ("rollout decode weights", args.decode_weights, "bfloat16", "CPU decode time"),
        (
            "learner remat",
            f"{args.remat} (rows of >= {args.remat_min_tokens} tokens)" if args.remat else False,
            "",
            "CPU memory",
        ),
        ("training tasks", f"pau/{args.dataset} train", "pau train split", "small, built"),
        ("checkpoint", args.checkpoint, "Qwen3 (aac.gin)", "fits 2 cores"),
    ]
    return settings, rows


def _train_kwargs(args, checkpoint: str) -> dict:
    """`loop.train` arguments shared by the three runs."""
    if args.dataset == "demo":
        dataset = DemoTasksConfig()
    else:
        data_dir = str(pathlib.Path(args.data_dir).expanduser())
        dataset = DatasetConfig(
            config="debug", split="train", data_dir=data_dir, build_if_missing=True
        )
    reasoning, inputs, reflection = args.taus
    return dict(
        actor=ActorConfig(
            checkpoint=checkpoint,
            lora_rank=args.lora_rank,
            lora_alpha=float(args.lora_rank),
            decode_weights=args.decode_weights,
        ),
        seed=args.seed,
        dataset=dataset,
        episode_config=EpisodeConfig(
            call_budget=25, max_steps=args.t_max, conversation=args.conversation
        ),
        reward_config=RewardConfig(
            max_steps=args.t_max,
            reasoning_tau=reasoning,
            input_tau=inputs,
            reflection_tau=reflection,
        ),
        rollout_config=RolloutConfig(
            tasks_per_batch=args.tasks_per_batch,
            group_size=args.group_size,
            sampling=SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=1.0),
        ),
        critic_config=CriticConfig(sampling=SamplingConfig(max_new_tokens=args.critic_tokens)),
        checkpoint_every=1,
        max_checkpoints=2,
        pad_to_multiple=64,
        rows_multiple=args.micro_batch_size,
        sandbox_workers=2,
    )


def _done(run_dir: pathlib.Path) -> int:
    """Steps a run finished (its summary.json; 0 without one)."""
    path = run_dir / "summary.json"
    return int(json.loads(path.read_text())["steps"]) if path.exists() else 0


def _latest_checkpoint(run_dir: pathlib.Path) -> int:
    if not (run_dir / "checkpoints").exists():
        return 0
    checkpointer = checkpoint_lib.Checkpointer(run_dir / "checkpoints", max_to_keep=None)
    try:
        return checkpointer.latest_step() or 0
    finally:
        checkpointer.close()


def train_runs(args, out: pathlib.Path, kwargs: dict) -> int:
    """Advances the runs in rounds of one step; returns the steps every run has finished."""
    started, last_round = time.perf_counter(), 0.0
    runs = (*args.credits, CONTROL)
    done = {name: _done(out / name) for name in runs}
    for step in range(min(done.values()) + 1, args.steps + 1):
        spent = time.perf_counter() - started
        if spent + last_round > 60 * args.wall_minutes:
            print(
                f"[aac_learning] stopping before step {step}: the last round took "
                f"{last_round:.0f} s and {spent:.0f} of {60 * args.wall_minutes:.0f} s are "
                "spent (rerun with the same --out to continue)",
                flush=True,
            )
            break
        round_start = time.perf_counter()
        for name in runs:
            if done[name] >= step:
                continue
            run_dir = out / name
            probe = AdvantageProbe(
                CREDIT[name], run_dir / "advantages.jsonl", _latest_checkpoint(run_dir) + 1
            )
            # The control never moves, so its KL term changes nothing: beta 0 skips its
            # reference pass (a third of the update's work).
            learner = LearnerConfig(
                learning_rate=0.0 if name == CONTROL else args.learning_rate,
                grpo=GRPOConfig(beta=0.0) if name == CONTROL else GRPOConfig(),
                logits_chunk_tokens=512,
                micro_batch_size=args.micro_batch_size,
                remat=args.remat,
                remat_min_tokens=args.remat_min_tokens,
            )
            print(f"[aac_learning] {name}: step {step}", flush=True)
            summary = loop.train(
                run_dir=str(run_dir),
                steps=step,
                advantage_fn=probe,
                learner_config=learner,
                **kwargs,
            )
            done[name] = summary["steps"]
        last_round = time.perf_counter() - round_start
    return min(min(done.values()), args.steps)


def _checkpoint(arg: str, out: pathlib.Path, seed: int) -> str:
    if arg == "tiny":
        path = artefacts.random_base_model(
            out / "tiny_checkpoint", qwen3.Qwen3Config(**TINY), seed=seed
        )
        return str(path)
    path = pathlib.Path(arg).expanduser()
    if not (path / "config.json").is_file():
        raise SystemExit(
            f"{path} has no config.json: pass a Hugging Face checkpoint directory (SmolLM2: "
            "python -m pau_jax.tools.fetch_smollm2) or 'tiny'"
        )
    return str(path)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--out", required=True, help="output folder; a rerun with it resumes")
    add("--checkpoint", default=SMOLLM2, help="HF checkpoint directory, or 'tiny' (random)")
    add("--dataset", choices=("debug", "demo"), default="debug", help="pau/debug train or demo")
    add("--data_dir", default="~/tensorflow_datasets", help="TFDS data_dir of pau/debug")
    add("--seed", type=int, default=0)
    add("--steps", type=int, default=10, help="training steps of every run")
    add("--wall_minutes", type=float, default=60.0, help="start no round past this")
    add("--tasks_per_batch", type=int, default=1)
    add("--group_size", type=int, default=4)
    add("--t_max", type=int, default=3, help="T_MAX: phases per episode")
    add("--max_new_tokens", type=int, default=32, help="actor tokens per reply")
    add("--critic_tokens", type=int, default=48, help="critic tokens per reply")
    add("--taus", type=int, nargs=3, default=(8, 4, 8), help="length thresholds (words)")
    add("--learning_rate", type=float, default=1e-3)
    add("--lora_rank", type=int, default=16)
    add("--micro_batch_size", type=int, default=4)
    add(
        "--credits",
        nargs="+",
        choices=sorted(set(CREDIT) - {CONTROL}),
        default=["final_plus_mean"],
        help="credit rule of each trained run (each against the one control)",
    )
    add("--conversation", choices=("fresh", "multi_turn"), default="fresh")
    add("--decode_weights", choices=("float32", "q8"), default="float32")
    add("--remat", action="store_true", help="recompute layer activations in the backward pass")
    add(
        "--remat_min_tokens",
        type=int,
        default=0,
        help="with --remat, only micro-batches of at least this many tokens recompute",
    )
    add("--last_k", type=int, default=5, help="steps the test compares")
    add("--alpha", type=float, default=0.05, help="significance level of the diagnosis")
    add(
        "--compilation_cache",
        default=os.environ.get("PAU_JAX_COMPILATION_CACHE", "~/.cache/pau_jax/xla"),
        help="JAX persistent compilation cache ('' off)",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.compilation_cache:
        import jax

        cache = pathlib.Path(args.compilation_cache).expanduser()
        cache.mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", str(cache))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

    out = pathlib.Path(args.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = _checkpoint(args.checkpoint, out, args.seed)
    settings, rows = _settings(args)
    recorded = out / "settings.json"
    if recorded.exists():
        old = json.loads(recorded.read_text())
        diff = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
        if set(diff) - SAME_GRADIENT:
            raise SystemExit(f"{out} holds runs with other settings {diff}; use another --out")
        if diff:  # how the same gradient is computed (memory): a resume may change it
            print(f"[aac_learning] resuming with {diff} (the same gradient)", flush=True)
            settings["changed_on_resume"] = old.get("changed_on_resume", []) + [
                {k: list(v) for k, v in diff.items()}
            ]
    artefacts.replace_text(recorded, json.dumps(settings, indent=2) + "\n")
    print(f"load_average_start={','.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for row in rows:
        print("[aac_learning] setting: " + " | ".join(map(str, row)), flush=True)

    steps = train_runs(args, out / "runs", _train_kwargs(args, checkpoint))
    if steps < 1:
        raise SystemExit("no run finished a step within --wall_minutes; raise it and rerun")
    trained, names = tuple(args.credits), (*args.credits, CONTROL)
    data = {name: read_run(out / "runs" / name, steps) for name in names}
    curves = {name: c for name, (c, _) in data.items()}
    probes = {name: p for name, (_, p) in data.items()}
    result = analyse(curves, probes, trained=trained, last_k=args.last_k, alpha=args.alpha)
    probe_panels = {
        label: (lambda name, key=key: probes[name][key]) for label, key in PROBE.items()
    }
    plot(curves, CURVES, out / "learning_curves.png", names)
    plot(curves, TERM_CURVES, out / "reward_terms.png", names)
    plot(curves, DIAGNOSTICS, out / "diagnostics.png", names, extra=probe_panels)
    wall = time.perf_counter() - started
    table = markdown(result, curves, rows, wall, trained)
    artefacts.replace_text(out / "aac_learning.md", table)
    result["curves"] = {n: {k: v.tolist() for k, v in curves[n].items()} for n in names}
    result["settings"] = settings
    artefacts.replace_text(out / "results.json", json.dumps(result, indent=2) + "\n")
    print(table, flush=True)
    if not result["step1_identical"]:
        print(
            "[aac_learning] step-1 rewards differ between runs: the runs are not paired "
            "(sampling not deterministic?); the paired test is then conservative",
            flush=True,
        )
    print(f"load_average_end={','.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    print(headline(result, trained))


if __name__ == "__main__":
    main()
