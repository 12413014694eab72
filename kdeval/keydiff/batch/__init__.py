"""Batches: independent requests as ragged rows, and the batched recording of shared prompt steps."""
