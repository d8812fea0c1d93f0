"""Evaluation: the batched episode runner (scoring, metrics and reports build on its records)."""
