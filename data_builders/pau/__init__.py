"""The pau dataset (TFDS builder folder)."""
