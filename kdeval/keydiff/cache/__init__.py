"""Where kept tokens live: slot buffers, the one budgeted cache and its layer arrangements (rows, static, head
pool), a step's geometry on the rows, and the layout adapters eviction works through."""
