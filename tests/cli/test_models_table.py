"""`kdeval models` in a terminal: each status in a few words, its reasons as footnotes shared by the families
that have the same ones (the whole status stays in --json and the reference page)."""
from kdeval.cli.models_cmds import _short_statuses

WINDOWED = "not supported on a model with windowed (sliding or chunked) attention layers"


def _row(brief: str, groups: list, refused_family: str = "") -> dict:
    return {"brief": brief, "refusal groups": groups, "refused family": refused_family}


def test_statuses_are_short_and_families_with_the_same_refusals_share_a_footnote():
    rows = [_row("", []),
            _row("windows kept whole", [[WINDOWED, ["kvzip", "sink-rerotate"]]]),
            _row("windows kept whole", [[WINDOWED, ["kvzip", "sink-rerotate"]]]),
            _row("latent rows", [["no latent", ["cam"]], [WINDOWED, ["kvzip", "sink-rerotate"]]]),
            _row("", [], refused_family="model_type 'falcon' is not supported: its attention bypasses")]
    statuses, notes = _short_statuses(rows)
    assert statuses == ["runs", "runs; windows kept whole; 2 refused [1]",
                        "runs; windows kept whole; 2 refused [1]", "runs; latent rows; 3 refused [2] [1]",
                        "refused [3]"]
    assert notes == [f"[1] kvzip, sink-rerotate: {WINDOWED}", "[2] cam: no latent",
                     "[3] model_type 'falcon' is not supported: its attention bypasses"]
