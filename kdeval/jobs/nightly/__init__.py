"""The nightly: its file, the run (resume, baseline, salts), the gate apart from it (scores, speed, drift,
attribution) and the history it keeps (history.jsonl and its page).
"""
