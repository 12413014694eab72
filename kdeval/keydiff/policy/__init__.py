"""The policy interface, the table policies register into, the one selector, KeyDiff and ``full``."""
