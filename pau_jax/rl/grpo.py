"""GRPO policy loss in JAX: sampled-token log-probs, clipped ratio objective, k3 KL and aggregation.

Token alignment: for ids [B, T], ``logp[:, t] = log softmax(logits[:, t-1] / T)[ids[:, t]]``
for t >= 1 and ``logp[:, 0] = 0`` (no prediction exists for the first token);
sampler log-probs [B, T] use the same alignment, and position 0 is never part
of the loss, whatever the loss mask says there.

Per completion token (``m = loss_mask``, ``A`` the advantage; under the default
``sampler_correction='tis'``, ``rho = exp(logp - sg(logp))``, the ratio to the learner's own
policy before the update, and ``w = sg(min(exp(logp - logp_sampler), tis_cap))``, the truncated
importance weight of the sampler's mismatch; under ``'none'``, ``rho =
exp(clamp(logp - logp_sampler))`` and ``w = 1``)::

    l = w * max(-A * rho, -A * clip(rho, 1 - eps_low, 1 + eps_high)) + beta * k3
    k3 = exp(d) - d - 1,  d = clamp(logp_ref - logp)

With a sampler that computes the learner's log-probs exactly, both give the same loss and
gradient. ``'tis'`` needs exactly one optimizer update per batch (the loop's rule): the
policy before the update is then the current one.

and the aggregation turns [B, T] token losses into ``loss_sum / denominator``:

* ``token-mean``: sum over all tokens / number of tokens;
* ``sequence-mean-token-mean``: per sequence the token mean, summed / number of
  sequences with at least one token;
* ``sequence-mean-token-sum-norm``: per sequence the token sum / ``max_length``,
  summed / number of sequences with at least one token (Dr. GRPO's constant
  normaliser; its advantages without the std are a credit rule, ``rl.credit``).

A sequence is one phase's reply. A row holds one phase, or a whole episode (the
final token sequence, every reply in the loss, ``rl.samples.EpisodeSample``); then
``sequence_tokens`` [B, T] gives each loss token the token count of its own phase
and ``sequences`` [B] the phases of the row, so every aggregation is the number
one row per phase gives. Without them each row is one sequence.

Each aggregation is one function in ``_AGGREGATE``.

Returning the pair keeps micro-batching exact: summing ``loss_sum`` and
``denominator`` over micro-batches and dividing once gives the full-batch mean.
"""

import dataclasses

import jax
import jax.numpy as jnp

from pau_jax.training import step as step_lib
from pau_jax.training.logprobs import token_logprobs


def _token_mean(losses, mask, sequence_tokens, sequences, config):
    """Every token of the batch counts once: sum / number of tokens."""
    return jnp.sum(losses), jnp.sum(mask)


def _sequence_mean_token_mean(losses, mask, sequence_tokens, sequences, config):
    """Each sequence's token mean, averaged over the sequences with tokens."""
    return jnp.sum(losses / jnp.maximum(sequence_tokens, 1.0)), jnp.sum(sequences)


def _sequence_mean_token_sum_norm(losses, mask, sequence_tokens, sequences, config):
    """Each sequence's token sum / ``max_length`` (a constant; Dr. GRPO), averaged over sequences."""
    return jnp.sum(losses) / config.max_length, jnp.sum(sequences)


# Aggregation name -> fn(losses [B, T] (masked), mask [B, T], sequence_tokens [B, T],
# sequences [B], config) -> (loss_sum, denominator). A new aggregation is a function here
# and one entry.
_AGGREGATE = {
    "token-mean": _token_mean,
    "sequence-mean-token-mean": _sequence_mean_token_mean,
    "sequence-mean-token-sum-norm": _sequence_mean_token_sum_norm,
}
AGGREGATIONS = tuple(_AGGREGATE)
SAMPLER_CORRECTIONS = ("tis", "none")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GRPOConfig:
    """Constants of the GRPO objective (paper values by default).

    Attributes:
      eps_low: the ratio is clipped below at 1 - eps_low.
      eps_high: the ratio is clipped above at 1 + eps_high.
      beta: weight of the k3 KL to the reference (base) model; 0 skips the
        reference forward pass entirely.
      temperature: the rollout temperature; log-probs are log_softmax(logits / T).
        Set by the run (``rl.loop.train``) from the actor's sampling temperature;
        gin refuses a binding of it (``experiment.RUN_SET_FIELDS``).
      aggregation: one of ``AGGREGATIONS``.
      max_length: the constant of ``sequence-mean-token-sum-norm`` (completion
        token budget); required by that mode only.
      log_ratio_clamp: |log ratio| (policy/sampler and reference/policy) is
        clamped to this before exponentiation.
      sampler_correction: how the loss treats a sampler whose log-probs differ from the
        learner's (an 8-bit decode, another dtype or kernel): 'tis' (default) takes the
        PPO ratio against the learner's own policy before this update and weights each
        token by the truncated importance ratio min(pi_old / pi_sampler, tis_cap),
        detached (token-level truncated importance sampling), so the clip does not treat
        the mismatch as staleness; 'none' takes the ratio against the sampler's log-probs
        (the mismatch is clipped like staleness). Equal log-probs give the same loss.
      tis_cap: the cap of the importance weight under 'tis'.
    """

    eps_low: float = 0.2
    eps_high: float = 0.2
    beta: float = 0.001
    temperature: float = 1.0
    aggregation: str = "token-mean"
    max_length: int | None = None
    log_ratio_clamp: float = 20.0
    sampler_correction: str = "tis"
    tis_cap: float = 2.0

    def __post_init__(self):
        if self.sampler_correction not in SAMPLER_CORRECTIONS:
            raise ValueError(
                f"sampler_correction must be one of {SAMPLER_CORRECTIONS}, "
                f"got {self.sampler_correction!r}"
            )
        if not self.tis_cap >= 1.0:
            raise ValueError(f"tis_cap must be >= 1, got {self.tis_cap}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        if self.aggregation == "sequence-mean-token-sum-norm" and not self.max_length:
            raise ValueError("aggregation 'sequence-mean-token-sum-norm' needs max_length > 0")
        if self.temperature <= 0:
            raise ValueError(
                f"temperature must be > 0 (training needs a sampling distribution), "
                f"got {self.temperature}"
            )
        if self.eps_low < 0 or self.eps_high < 0 or self.beta < 0:
            raise ValueError("eps_low, eps_high and beta must be >= 0")


def policy_loss(
    logp: jax.Array,
    sampler_logp: jax.Array,
    advantages: jax.Array,
    loss_mask: jax.Array,
    config: GRPOConfig,
    *,
    ref_logp: jax.Array | None = None,
    entropy: jax.Array | None = None,
    sequence_tokens: jax.Array | None = None,
    sequences: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """The GRPO loss of a (micro-)batch as (loss_sum, denominator, statistics).

    Args:
      logp: [B, T] log-probs of the trained policy (differentiated).
      sampler_logp: [B, T] log-probs of the same tokens under the sampler.
      advantages: [B] per sequence or [B, T] per token.
      loss_mask: [B, T], 1 on completion tokens.
      config: the objective's constants.
      ref_logp: [B, T] reference (base model) log-probs; needed when beta > 0.
      entropy: [B, T] entropies for the statistics (optional).
      sequence_tokens: [B, T], per loss token the loss tokens of its sequence (phase);
        None: each row is one sequence.
      sequences: [B], sequences with a loss token per row (given with ``sequence_tokens``).

    Returns:
      (scalar loss sum, scalar denominator, statistics: sums, and ``*_min``/``*_max``
      extremes, as ``training.step`` combines them over micro-batches).
    """
    if config.beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs the reference log-probs (ref_logp)")
    t = logp.shape[1]
    mask = loss_mask.astype(jnp.float32) * (jnp.arange(t) > 0)
    adv = advantages.astype(jnp.float32)
    adv = adv[:, None] if adv.ndim == 1 else adv
    clamp = config.log_ratio_clamp
    sg = jax.lax.stop_gradient
    if config.sampler_correction == "tis":
        # Every batch gets exactly one optimizer update, so the learner's policy before it
        # is the current one without gradient: ratio 1 in value, grad log p in gradient.
        old = sg(logp)
        log_ratio = jnp.clip(logp - old, -clamp, clamp)
        mismatch = jnp.exp(jnp.clip(old - sampler_logp, -clamp, clamp))
        weight = jnp.minimum(mismatch, config.tis_cap)
    else:
        log_ratio = jnp.clip(logp - sampler_logp, -clamp, clamp)
        mismatch = weight = jnp.ones_like(logp)
    ratio = jnp.exp(log_ratio)
    clipped_ratio = jnp.clip(ratio, 1.0 - config.eps_low, 1.0 + config.eps_high)
    per_token = weight * jnp.maximum(-adv * ratio, -adv * clipped_ratio)
    kl = jnp.zeros_like(per_token)
    if ref_logp is not None:
        delta = jnp.clip(jax.lax.stop_gradient(ref_logp) - logp, -clamp, clamp)
        kl = jnp.exp(delta) - delta - 1.0
        if config.beta > 0:
            per_token = per_token + config.beta * kl

    if sequence_tokens is None:  # one sequence per row
        counts = jnp.sum(mask, axis=-1)  # [B]
        sequence_tokens = jnp.broadcast_to(counts[:, None], mask.shape)
        sequences = (counts > 0).astype(jnp.float32)
    loss_sum, denominator = _AGGREGATE[config.aggregation](
        per_token * mask, mask, sequence_tokens.astype(jnp.float32), sequences, config
    )

    is_clipped = ((adv > 0) & (ratio > 1.0 + config.eps_high)) | (
        (adv < 0) & (ratio < 1.0 - config.eps_low)
    )
    real = mask > 0
    gap = jnp.abs(sg(logp) - sampler_logp)
    stats = {
        "tokens": jnp.sum(mask),
        "kl_sum": jnp.sum(sg(kl) * mask),
        "entropy_sum": jnp.sum(entropy * mask) if entropy is not None else jnp.zeros(()),
        "clipped_sum": jnp.sum(is_clipped * mask),
        "gap_sum": jnp.sum(gap * mask),
        "tis_weight_sum": jnp.sum(weight * mask),
        "tis_capped_sum": jnp.sum((mismatch > config.tis_cap) * mask),
        "ratio_min": jnp.min(jnp.where(real, sg(ratio), jnp.inf)),
        "ratio_max": jnp.max(jnp.where(real, sg(ratio), -jnp.inf)),
        "gap_max": jnp.max(jnp.where(real, gap, 0.0)),
    }
    return loss_sum, denominator, stats


@dataclasses.dataclass(frozen=True, kw_only=True)
class GRPOLoss:
    """The GRPO loss as ``training.step`` takes it: ``loss(model, batch)`` on a ``learner.Batch``.

    With ``config.beta > 0`` the reference log-probs come from the same model with
    every adapter zeroed (``training.step.reference_model``), without gradient. A batch
    with ``score_positions`` has its head run on those columns only (policy and reference);
    one with masks (``mask_table``) scores each token under the mask it was sampled with,
    so the ratio and the KL are those of the masked policies.
    ``remat`` recomputes the policy forward's layer activations in the backward pass, for
    (micro-)batches of at least ``remat_min_tokens`` tokens (rows x length; static shapes,
    so the choice is made per compiled shape).
    """

    config: GRPOConfig
    chunk_tokens: int = 1024
    remat: bool = False
    remat_min_tokens: int = 0

    def __call__(self, model, batch):
        logp, entropy = token_logprobs(
            model,
            batch.input_ids,
            batch.attention_mask,
            temperature=self.config.temperature,
            chunk_tokens=self.chunk_tokens,
            remat=self.remat and batch.input_ids.size >= self.remat_min_tokens,
            positions=batch.score_positions,
            masks=_masks(batch),
        )
        ref_logp = None
        if self.config.beta > 0:
            ref_logp, _ = token_logprobs(
                step_lib.reference_model(model),
                batch.input_ids,
                batch.attention_mask,
                temperature=self.config.temperature,
                chunk_tokens=self.chunk_tokens,
                positions=batch.score_positions,
                masks=_masks(batch),
            )
            ref_logp = jax.lax.stop_gradient(ref_logp)
        return policy_loss(
            logp,
            batch.sampler_logprobs,
            batch.advantages,
            batch.loss_mask,
            self.config,
            ref_logp=ref_logp,
            entropy=entropy,
            sequence_tokens=batch.sequence_tokens,
            sequences=batch.sequences,
        )

    def metrics(self, loss_sum, denominator, stats) -> dict:
        return metrics(loss_sum, denominator, stats)


def _masks(batch):
    """A batch's structured-decoding masks as ``token_logprobs`` takes them, or None."""
    if batch.mask_table is None:
        return None
    return batch.mask_table, batch.mask_index


def metrics(loss_sum: jax.Array, denominator: jax.Array, stats: dict[str, jax.Array]) -> dict:
    """Scalar metrics (slash names) from accumulated loss terms and statistics."""
    tokens = jnp.maximum(stats["tokens"], 1.0)
    return {
        "train/loss": loss_sum / jnp.maximum(denominator, 1.0),
        "train/tokens": stats["tokens"],
        "grpo/kl": stats["kl_sum"] / tokens,
        "grpo/entropy": stats["entropy_sum"] / tokens,
        "grpo/clip_fraction": stats["clipped_sum"] / tokens,
        "grpo/ratio_min": stats["ratio_min"],
        "grpo/ratio_max": stats["ratio_max"],
        "grpo/logprob_gap_mean": stats["gap_sum"] / tokens,
        "grpo/logprob_gap_max": stats["gap_max"],
        "grpo/tis_weight_mean": stats["tis_weight_sum"] / tokens,
        "grpo/tis_capped_fraction": stats["tis_capped_sum"] / tokens,
    }
