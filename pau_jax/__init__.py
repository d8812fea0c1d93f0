"""pau_jax: the PAU benchmark and AAC training in JAX/Flax."""

__version__ = "0.1.0"
