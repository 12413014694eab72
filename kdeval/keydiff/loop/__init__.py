"""The one generation loop, the one place a prompt is cut into steps, and what a run produces and continues from."""
