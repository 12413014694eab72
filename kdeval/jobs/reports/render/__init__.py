"""How a report is drawn: the one formatter of every field, tables for the terminal, Markdown and HTML,
plots, the HTML page, and writing the requested formats (what is computed lives one folder up).
"""
