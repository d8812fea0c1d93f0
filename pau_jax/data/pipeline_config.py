"""Settings of record construction (`PipelineConfig`), read by `pipeline` and `inputs`."""

import dataclasses

from pau_jax.data import mutations


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    """Settings of record construction.

    Attributes:
      seed: seed of every random choice (per item it is combined with the task id).
      n_shown: shown examples per item (distinct outputs).
      min_heldout: fewest held-out inputs an item may have.
      n_heldout: held-out inputs wanted (the coverage cover is kept even if larger).
      max_candidates: generated inputs tried per item at most.
      batch_size: generated inputs run per sandbox call.
      timeout_s: time limit of one function call.
      max_call_s: inputs whose call took longer are not kept (fast examples re-run reliably).
      check_timeout_s: time limit of one call when the kept examples are re-run.
      harness_timeout_s: time limit of running a source's whole test.
      max_seeds: most inputs taken from a source's tests.
      max_input_chars: longest encoded argument tuple kept.
      max_output_chars: longest encoded output kept.
      max_timeouts: generation for an item stops after this many timed-out calls (each
        one costs a worker restart).
      min_statement_coverage: items whose held-out statement coverage is lower are excluded.
      min_branch_coverage: items whose held-out branch coverage is lower are excluded.
      limits: size limits of generated values.
    """

    seed: int = 0
    n_shown: int = 2
    min_heldout: int = 4
    n_heldout: int = 10
    max_candidates: int = 300
    batch_size: int = 30
    timeout_s: float = 2.0
    max_call_s: float = 0.5
    check_timeout_s: float = 5.0
    harness_timeout_s: float = 60.0
    max_seeds: int = 40
    max_input_chars: int = 400
    max_output_chars: int = 1000
    max_timeouts: int = 3
    min_statement_coverage: float = 0.9
    min_branch_coverage: float = 0.9
    limits: mutations.Limits = mutations.Limits()
