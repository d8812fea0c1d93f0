"""GRPO policy loss in JAX: sampled-token log-probs, clipped ratio objective, k3 KL and aggregation.

Token alignment: for ids [B, T], ``logp[:, t] = log softmax(logits[:, t-1] / T)[ids[:, t]]``
for t >= 1 and ``logp[:, 0] = 0`` (no prediction exists for the first token);
sampler log-probs [B, T] use the same alignment, and position 0 is never part
of the loss, whatever the loss mask says there.

Per completion token (``m = loss_mask``, ``A`` the advantage, ``rho =
exp(clamp(logp - logp_sampler))``)::

    l = max(-A * rho, -A * clip(rho, 1 - eps_low, 1 + eps_high)) + beta * k3
    k3 = exp(d) - d - 1,  d = clamp(logp_ref - logp)

and the aggregation turns [B, T] token losses into ``loss_sum / denominator``:

* ``token-mean``: sum over all tokens / number of tokens;
* ``sequence-mean-token-mean``: per sequence the token mean, summed / number of
  sequences with at least one token;
* ``sequence-mean-token-sum-norm``: per sequence the token sum / ``max_length``,
  summed / number of sequences with at least one token.

Returning the pair keeps micro-batching exact: summing ``loss_sum`` and
``denominator`` over micro-batches and dividing once gives the full-batch mean.
"""

import dataclasses

import jax
import jax.numpy as jnp

AGGREGATIONS = ("token-mean", "sequence-mean-token-mean", "sequence-mean-token-sum-norm")

# Statistics accumulated over micro-batches: sums, except the *_min and *_max entries.
_SUM_STATS = ("tokens", "kl_sum", "entropy_sum", "clipped_sum", "gap_sum")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GRPOConfig:
    """Constants of the GRPO objective (paper values by default).

    Attributes:
      eps_low: the ratio is clipped below at 1 - eps_low.
      eps_high: the ratio is clipped above at 1 + eps_high.
      beta: weight of the k3 KL to the reference (base) model; 0 skips the
        reference forward pass entirely.
      temperature: the rollout temperature; log-probs are log_softmax(logits / T).
      aggregation: one of ``AGGREGATIONS``.
      max_length: the constant of ``sequence-mean-token-sum-norm`` (completion
        token budget); required by that mode only.
      log_ratio_clamp: |log ratio| (policy/sampler and reference/policy) is
        clamped to this before exponentiation.
    """

    eps_low: float = 0.2
    eps_high: float = 0.2
    beta: float = 0.001
    temperature: float = 1.0
    aggregation: str = "token-mean"
    max_length: int | None = None
    log_ratio_clamp: float = 20.0

    def __post_init__(self):
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


def logprobs_from_logits(
    logits: jax.Array, targets: jax.Array, temperature: float = 1.0
) -> tuple[jax.Array, jax.Array]:
    """Log-prob of each target and the entropy, under softmax(logits / temperature).

    Args:
      logits: [..., V].
      targets: [...] int token ids.
      temperature: T > 0.

    Returns:
      ([...] float32 log-probs, [...] float32 entropies; the entropy carries no gradient).
    """
    scaled = logits.astype(jnp.float32) / temperature
    log_z = jax.nn.logsumexp(scaled, axis=-1)
    picked = jnp.take_along_axis(scaled, targets[..., None], axis=-1)[..., 0]
    probs = jnp.exp(scaled - log_z[..., None])
    entropy = jax.lax.stop_gradient(log_z - jnp.sum(probs * scaled, axis=-1))
    return picked - log_z, entropy


def token_logprobs(
    model,
    input_ids: jax.Array,
    attention_mask: jax.Array,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
) -> tuple[jax.Array, jax.Array]:
    """Log-probs and entropies of the given tokens, without materialising [B, T, V] logits.

    The final hidden states are computed once; the language-model head, softmax
    and gather then run over chunks of at most ``chunk_tokens`` positions
    (``lax.map``), each chunk rematerialised in the backward pass, so peak
    memory holds one [chunk, V] block instead of B * T * V logits.

    Args:
      model: a causal LM with ``hidden_states`` and ``logits_from_hidden``.
      input_ids: [B, T] int32.
      attention_mask: [B, T], 1 for real tokens.
      temperature: rollout temperature.
      chunk_tokens: largest number of positions whose logits exist at once.

    Returns:
      ([B, T] log-probs, [B, T] entropies of the predicting distribution), both
      0 in column 0.
    """
    hidden = model.hidden_states(input_ids, attention_mask)  # [B, T, D]
    b, t, d = hidden.shape
    n = b * (t - 1)
    if n == 0:
        zeros = jnp.zeros((b, t), jnp.float32)
        return zeros, zeros
    n_chunks = -(-n // chunk_tokens)
    size = -(-n // n_chunks)
    pad = n_chunks * size - n
    h = jnp.pad(hidden[:, :-1].reshape(n, d), ((0, pad), (0, 0))).reshape(n_chunks, size, d)
    targets = jnp.pad(input_ids[:, 1:].reshape(n), (0, pad)).reshape(n_chunks, size)

    @jax.checkpoint
    def chunk(args):
        h_chunk, target_chunk = args
        return logprobs_from_logits(model.logits_from_hidden(h_chunk), target_chunk, temperature)

    logp, entropy = jax.lax.map(chunk, (h, targets))

    def unchunk(x):
        return jnp.pad(x.reshape(-1)[:n].reshape(b, t - 1), ((0, 0), (1, 0)))

    return unchunk(logp), unchunk(entropy)


def empty_stats() -> dict[str, jax.Array]:
    """The neutral element of ``combine_stats``."""
    stats = {key: jnp.zeros((), jnp.float32) for key in _SUM_STATS}
    stats["ratio_min"] = jnp.array(jnp.inf, jnp.float32)
    stats["ratio_max"] = jnp.array(-jnp.inf, jnp.float32)
    stats["gap_max"] = jnp.zeros((), jnp.float32)
    return stats


def combine_stats(a: dict[str, jax.Array], b: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Statistics of two micro-batches together."""
    out = {key: a[key] + b[key] for key in _SUM_STATS}
    out["ratio_min"] = jnp.minimum(a["ratio_min"], b["ratio_min"])
    out["ratio_max"] = jnp.maximum(a["ratio_max"], b["ratio_max"])
    out["gap_max"] = jnp.maximum(a["gap_max"], b["gap_max"])
    return out


def policy_loss(
    logp: jax.Array,
    sampler_logp: jax.Array,
    advantages: jax.Array,
    loss_mask: jax.Array,
    config: GRPOConfig,
    *,
    ref_logp: jax.Array | None = None,
    entropy: jax.Array | None = None,
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

    Returns:
      (scalar loss sum, scalar denominator, statistics for ``combine_stats``).
    """
    if config.beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs the reference log-probs (ref_logp)")
    t = logp.shape[1]
    mask = loss_mask.astype(jnp.float32) * (jnp.arange(t) > 0)
    adv = advantages.astype(jnp.float32)
    adv = adv[:, None] if adv.ndim == 1 else adv
    clamp = config.log_ratio_clamp
    log_ratio = jnp.clip(logp - sampler_logp, -clamp, clamp)
    ratio = jnp.exp(log_ratio)
    clipped_ratio = jnp.clip(ratio, 1.0 - config.eps_low, 1.0 + config.eps_high)
    per_token = jnp.maximum(-adv * ratio, -adv * clipped_ratio)
    kl = jnp.zeros_like(per_token)
    if ref_logp is not None:
        delta = jnp.clip(jax.lax.stop_gradient(ref_logp) - logp, -clamp, clamp)
        kl = jnp.exp(delta) - delta - 1.0
        if config.beta > 0:
            per_token = per_token + config.beta * kl

    token_sum = jnp.sum(per_token * mask, axis=-1)  # [B]
    counts = jnp.sum(mask, axis=-1)  # [B]
    has_tokens = (counts > 0).astype(jnp.float32)
    if config.aggregation == "token-mean":
        loss_sum, denominator = jnp.sum(token_sum), jnp.sum(counts)
    elif config.aggregation == "sequence-mean-token-mean":
        loss_sum = jnp.sum(token_sum / jnp.maximum(counts, 1.0))
        denominator = jnp.sum(has_tokens)
    else:
        loss_sum = jnp.sum(token_sum) / config.max_length
        denominator = jnp.sum(has_tokens)

    is_clipped = ((adv > 0) & (ratio > 1.0 + config.eps_high)) | (
        (adv < 0) & (ratio < 1.0 - config.eps_low)
    )
    real = mask > 0
    sg = jax.lax.stop_gradient
    gap = jnp.abs(sg(logp) - sampler_logp)
    stats = {
        "tokens": jnp.sum(mask),
        "kl_sum": jnp.sum(sg(kl) * mask),
        "entropy_sum": jnp.sum(entropy * mask) if entropy is not None else jnp.zeros(()),
        "clipped_sum": jnp.sum(is_clipped * mask),
        "gap_sum": jnp.sum(gap * mask),
        "ratio_min": jnp.min(jnp.where(real, sg(ratio), jnp.inf)),
        "ratio_max": jnp.max(jnp.where(real, sg(ratio), -jnp.inf)),
        "gap_max": jnp.max(jnp.where(real, gap, 0.0)),
    }
    return loss_sum, denominator, stats


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
    }
