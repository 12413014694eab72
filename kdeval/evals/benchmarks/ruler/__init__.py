"""RULER: synthetic long-context tasks generated per tokenizer and length (plus two QA tasks)."""
from kdeval.evals.benchmarks.ruler.task import RulerTask
from kdeval.evals.benchmarks.ruler.templates import CONFIGS, QA_TASKS, SYNTHETIC_TASKS

__all__ = ["RulerTask", "CONFIGS", "QA_TASKS", "SYNTHETIC_TASKS"]
