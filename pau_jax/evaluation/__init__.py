"""Evaluation: the batched episode runner and paired statistics (scoring and reports build on them)."""
