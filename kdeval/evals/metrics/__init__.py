"""Metrics: LongBench's official scorers, RULER string match, math equivalence, ROUGE-L recall."""
