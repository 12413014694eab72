"""Other tools' files: `kdeval export` (Parquet, CSV, JSONL; kvpress and lm-eval layouts) and
`kdeval import kvpress`.
"""
