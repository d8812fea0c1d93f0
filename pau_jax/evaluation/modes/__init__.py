"""The evaluation modes, one module each (`run(context) -> ModeRun`), and `REGISTRY`, the modes `evaluate` accepts.

A new mode is a new module here with a `MODE = Mode(run=...)` and one entry in
`REGISTRY`; `pipeline.evaluate` runs the requested modes in the caller's order.
"""

from pau_jax.evaluation.modes import ft, gold, in_context, interactive, memory
from pau_jax.evaluation.modes.context import Context, Mode, ModeRun, Options

# Mode name -> Mode. Requirements are checked in this order.
REGISTRY: dict[str, Mode] = {
    "interactive": interactive.MODE,
    "in_context": in_context.MODE,
    "memory": memory.MODE,
    "ft": ft.MODE,
    "gold": gold.MODE,
}

__all__ = ["REGISTRY", "Context", "Mode", "ModeRun", "Options"]
