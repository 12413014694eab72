"""kdeval: evaluation service for KV-cache eviction policies under a hard memory budget."""
__version__ = "0.1.0"
