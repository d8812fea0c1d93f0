"""Test-wide settings: JAX on the CPU in float32."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
