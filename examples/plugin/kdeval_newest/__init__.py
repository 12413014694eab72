"""An example kdeval plugin: the ``newest`` eviction policy (kdeval_newest/policy.py)."""
