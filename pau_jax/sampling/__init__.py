"""Token generation from a decoder with a KV cache: greedy, temperature, top-k, top-p, groups."""

from pau_jax.sampling.output import SampleOutput
from pau_jax.sampling.sampler import call_counts, generate, trace_counts

__all__ = ["SampleOutput", "call_counts", "generate", "trace_counts"]
