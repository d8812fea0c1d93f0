"""The causal LM every model family shares, in Flax NNX: ``Backbone`` and ``Decoder``.

``Decoder`` builds the Hugging Face module tree (``model.embed_tokens``,
``model.layers.{i}``, ``model.norm``, ``lm_head``) from any family's
``decoder_config.DecoderConfig``; the config chooses the attention variant and
each layer's feed-forward block. Checkpoints in and out are ``hf_checkpoint.py``.
"""

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from pau_jax.models import decoder_config, kv_cache, layers, quantization, sharding


class Backbone(nnx.Module):
    """Token embedding, decoder layers and final norm (``model.*`` in Hugging Face names)."""

    def __init__(self, config: decoder_config.DecoderConfig, *, dtype, rngs: nnx.Rngs):
        self.embed_tokens = nnx.Embed(
            config.vocab_size,
            config.hidden_size,
            dtype=dtype,
            param_dtype=dtype,
            embedding_init=layers.partitioned(
                nnx.initializers.normal(layers.INIT_STDDEV), ("vocab", "embed")
            ),
            rngs=rngs,
        )
        self.layers = nnx.List(
            [
                layers.DecoderLayer(config, dtype=dtype, rngs=rngs, mlp_class=config.mlp_class(i))
                for i in range(config.num_hidden_layers)
            ]
        )
        self.norm = layers.RMSNorm(
            config.hidden_size, eps=config.rms_norm_eps, axis_name="embed", dtype=dtype
        )

    def __call__(
        self,
        input_ids,
        *,
        positions,
        mask,
        cache=None,
        cache_index=None,
        cache_mask=None,
        write_mask=None,
        remat: bool = False,
    ):
        """Maps [B, T] ids to ([B, T, D] normed hidden states, updated (keys, values) or None).

        ``mask`` is [B, T, T] (which of the T tokens each attends to); ``cache`` is None
        or (keys, values), L arrays [B, K, S, H] and [B, K, H, S], that the tokens are
        written into from slot ``cache_index`` (only those in ``write_mask``, [B, T] or
        None for all); ``cache_mask`` ([B, S] or None) is which cached slots they also
        attend to (see ``layers.Attention``). ``remat`` (without a cache): each layer's
        activations are recomputed in the backward pass instead of kept, so a training
        step holds one layer's activations at a time (about a third more compute).
        """
        x = sharding.constrain(self.embed_tokens(input_ids), layers.ACTIVATION_AXES)
        if remat and cache is None:
            return self.norm(_remat_layers(self.layers, x, positions, mask)), None
        keys, values = [], []
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else (cache[0][i], cache[1][i])
            x, new = layer(
                x,
                positions=positions,
                mask=mask,
                cache=layer_cache,
                cache_index=cache_index,
                cache_mask=cache_mask,
                write_mask=write_mask,
            )
            if new is not None:
                keys.append(new[0])
                values.append(new[1])
        return self.norm(x), (None if cache is None else (tuple(keys), tuple(values)))


def _remat_layers(layers, x, positions, mask):
    """The decoder layers without a cache, each one's activations recomputed in the backward pass.

    Each layer is split into its definition and state so ``jax.checkpoint`` sees plain
    arrays (a cache-less layer call mutates nothing). Layers of one definition (every
    dense model) run as a ``lax.scan`` over their stacked states: the loop is what keeps
    XLA from scheduling every layer's recomputation at once. Temporaries of one GRPO
    update of Qwen2.5-0.5B (XLA:CPU's memory analysis), one 1,408-token row: 14.2 GB
    without remat, 13.6 GB with checkpointed layers unrolled, 2.5 GB scanned; four rows
    of 1,600: 66.9 GB without, 5.4 GB scanned. Layers that differ (a mixture-of-experts
    schedule) stay unrolled.
    """
    splits = [nnx.split(layer) for layer in layers]

    def run(graphdef, state, x):
        return nnx.merge(graphdef, state)(x, positions=positions, mask=mask)[0]

    graphdef = splits[0][0]
    if any(g != graphdef for g, _ in splits[1:]):
        for g, state in splits:
            x = jax.checkpoint(run, static_argnums=(0,))(g, state, x)
        return x
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *(state for _, state in splits))

    @jax.checkpoint
    def body(x, state):
        return run(graphdef, state, x), None

    return jax.lax.scan(body, x, stacked)[0]


class Decoder(nnx.Module):
    """The causal language model of any family; ``lm_head`` is None when tied to the embedding.

    ``decode_head`` is None or a quantised copy of the head (the tied table or ``lm_head``'s
    kernel; ``quantization.quantize_for_decode``), read by decode steps only.
    """

    decode_head: Any = nnx.data(None)

    def __init__(
        self,
        config: decoder_config.DecoderConfig,
        *,
        dtype=jnp.float32,
        rngs: nnx.Rngs | None = None,
    ):
        rngs = nnx.Rngs(0) if rngs is None else rngs
        self.config = config
        self.dtype = jnp.dtype(dtype)
        self.model = Backbone(config, dtype=self.dtype, rngs=rngs)
        self.decode_head = None
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nnx.Linear(
                config.hidden_size,
                config.vocab_size,
                use_bias=False,
                dtype=self.dtype,
                param_dtype=self.dtype,
                kernel_init=layers.partitioned(
                    nnx.initializers.normal(layers.INIT_STDDEV), ("embed", "vocab")
                ),
                rngs=rngs,
            )

    def __call__(self, input_ids, attention_mask=None, positions=None) -> jax.Array:
        """Logits of a full sequence.

        Args:
          input_ids: [B, T] int32.
          attention_mask: [B, T], 1 for real tokens and 0 for (left) padding.
          positions: [B, T]; defaults to ``cumsum(attention_mask) - 1`` clipped at 0.

        Returns:
          [B, T, V] float32 logits.
        """
        return self.logits_from_hidden(self.hidden_states(input_ids, attention_mask, positions))

    def hidden_states(
        self, input_ids, attention_mask=None, positions=None, *, remat: bool = False
    ) -> jax.Array:
        """[B, T, D] hidden states after the final norm; arguments as in ``__call__``.

        ``remat``: recompute each layer's activations in the backward pass (training
        memory: one layer's activations instead of all of them).
        """
        _, t = input_ids.shape
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, bool)
        real = attention_mask.astype(bool)
        if positions is None:
            positions = jnp.maximum(jnp.cumsum(real, axis=-1, dtype=jnp.int32) - 1, 0)
        causal = jnp.tril(jnp.ones((t, t), bool))
        mask = causal[None, :, :] & real[:, None, :]
        hidden, _ = self.model(input_ids, positions=positions, mask=mask, remat=remat)
        return hidden

    def logits_from_hidden(self, hidden: jax.Array) -> jax.Array:
        """Maps [..., D] hidden states to [..., V] float32 logits."""
        if self.lm_head is None:
            table = self.model.embed_tokens.embedding[...]
            return jnp.einsum("...d,vd->...v", hidden, table, preferred_element_type=jnp.float32)
        kernel = self.lm_head.kernel[...]
        return jnp.einsum("...d,dv->...v", hidden, kernel, preferred_element_type=jnp.float32)

    def decode(
        self,
        input_ids,
        *,
        positions,
        cache: kv_cache.KVCache,
        cache_index,
        attention_mask=None,
        last_only: bool = False,
        cache_is_empty: bool = False,
        overlay: bool = False,
    ) -> tuple[jax.Array, kv_cache.KVCache]:
        """Runs T new tokens against a KV cache (prefill when the cache is empty).

        New tokens occupy slots [cache_index, cache_index + T). A new token attends to
        the cached slots before ``cache_index`` whose slot mask is True and to the new
        tokens up to itself that are real.

        With ``overlay``, the T slots may already hold cached tokens where the new tokens
        are padding (the sampler's prefix reuse; ``sampling.batching.BatchLayout`` states
        its slot layout). Only real new tokens are written (the other slots keep their
        keys, values and mask), and the new tokens attend to every cached slot whose mask
        is True, inside the block too.

        Args:
          input_ids: [B, T] int32 new tokens.
          positions: [B, T] their RoPE positions.
          cache: the cache, S slots.
          cache_index: int32 scalar (may be traced), slot of ``input_ids[:, 0]``.
          attention_mask: [B, T], 1 for real new tokens (default all real).
          last_only: return logits of the last new position only.
          cache_is_empty: static; True when no slot holds a token yet, so the new tokens
            attend only to each other (a prefill then costs T x T scores, not T x S).
          overlay: static; see above. Every True slot of the cache, wherever it lies,
            must precede the new tokens in the sequence (a smaller position): the cache
            should end with the block.

        Returns:
          ([B, T, V] or [B, 1, V] float32 logits, updated cache).
        """
        _, t = input_ids.shape
        real = jnp.ones(input_ids.shape, bool) if attention_mask is None else attention_mask
        real = real.astype(bool)
        mask = jnp.tril(jnp.ones((t, t), bool))[None, :, :] & real[:, None, :]
        if overlay:
            earlier = cache.mask
        else:
            earlier = cache.mask & (jnp.arange(cache.max_len) < cache_index)[None, :]
        hidden, (keys, values) = self.model(
            input_ids,
            positions=positions,
            mask=mask,
            cache=(cache.k, cache.v),
            cache_index=cache_index,
            cache_mask=None if cache_is_empty else earlier,
            write_mask=real if overlay else None,
        )
        if last_only:
            hidden = hidden[:, -1:]
        written = real
        if overlay:
            written = real | jax.lax.dynamic_slice(cache.mask, (0, cache_index), real.shape)
        slot_mask = jax.lax.dynamic_update_slice(cache.mask, written, (0, cache_index))
        new_cache = kv_cache.KVCache(k=keys, v=values, mask=slot_mask)
        return self._decode_logits(hidden), new_cache

    def _decode_logits(self, hidden: jax.Array) -> jax.Array:
        """``logits_from_hidden`` for the few rows of a decode step: [B, T, D] -> [B, T, V].

        With a tied [V, D] embedding the table is the left operand of two products over
        half the vocabulary each, [V / 2, D] x [D, B * T]. The CPU backend's matmul then
        streams the table once with B * T columns; as ``hidden @ table.T`` it runs about
        2.5x slower at 8 rows (and no faster at 1). Same contraction, float32 results.
        """
        if quantization.active(self.decode_head):
            return quantization.matmul(hidden, self.decode_head)
        if self.lm_head is not None or self.config.vocab_size % 2:
            return self.logits_from_hidden(hidden)
        b, t, d = hidden.shape
        table = self.model.embed_tokens.embedding[...]
        halves = table.reshape(2, table.shape[0] // 2, d)
        rows = jnp.broadcast_to(hidden.reshape(1, b * t, d), (2, b * t, d))
        logits = jnp.einsum("nvd,nrd->nvr", halves, rows, preferred_element_type=jnp.float32)
        return logits.reshape(table.shape[0], b * t).T.reshape(b, t, table.shape[0])
