"""The cross-run leaderboard in one room: its rows (build, cells), its terminal and markdown views, its figures, its HTML page
and its output files."""
