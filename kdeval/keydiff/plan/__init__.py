"""Decided once from (model, policy, config): the plan, and the caches made and sized from it."""
