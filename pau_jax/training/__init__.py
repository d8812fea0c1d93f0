"""What every training algorithm shares: the update step, log-probs, batches, checkpoints, the run.

``step`` is the one jitted LoRA update (an algorithm supplies a loss),
``logprobs`` the chunked token log-probs every loss reads, ``batch`` the
left-padded row layout, ``checkpoint`` the orbax train-state checkpoints,
``artefacts`` the run-directory files written atomically (temporary name, then
rename) and ``run`` the run directory with its actor, mesh, checkpointer and
writer.
Algorithms (``rl``, ``sft``) build on this package; it imports neither.
"""
