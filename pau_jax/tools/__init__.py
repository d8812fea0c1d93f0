"""Command-line tools (``python -m pau_jax.tools.X``): memory estimates of a configuration, and fetching a real checkpoint."""
