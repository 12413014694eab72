"""The grid: its schema, loading and checks (errors that name the field), its expansion into cells,
and each cell's identity (the content hash of what changes its result, and the identity columns of its rows).
"""
