"""Command-line tools that inspect a configuration without running it (``python -m pau_jax.tools.X``)."""
