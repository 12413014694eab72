"""`kdeval models`: every decoder family the engine is tested on (kdeval/zoo/families.py), with its layer
kinds and what the engine does with it, as the engine's own checks say (kdeval/zoo/family_status.py)."""
from __future__ import annotations

import json

import typer

#: what a status means, said once under the table and on the reference page
STATUS_NOTE = ("runs: the policy evicts every full-attention layer to the budget N. Windowed layers (sliding "
               "window, Llama 4's attention chunks) keep exactly what the model attends to and are never evicted by "
               "the policy; `budget` counts tokens per full-attention layer and KV head. refused: the engine raises "
               "UnsupportedModelError before any weight loads. '<policies> refused: <cause>': every registered "
               "policy's engine is planned on the family, and these are refused when their engine is built, for that "
               "cause (`--json` gives each one's reason). Each family loads as the tiny random model named beside it, "
               "and tests/keydiff/test_families.py proves every one that runs.")


def _short_statuses(rows: list[dict]) -> tuple[list[str], list[str]]:
    """Each row's status in a few words, its reasons as footnote marks (``"runs; 7 refused [1]"``, ``"refused [2]"``),
    and the footnotes (``"[1] snapkv, tova: <cause>"``), one per distinct (policies, cause): the whole status folds
    over a dozen lines in an 80- or 100-column table (``--json`` and the reference page keep it whole)."""
    marks: dict[tuple[tuple[str, ...], str], int] = {}
    statuses = []
    for r in rows:
        if r["refused family"]:
            statuses.append(f"refused [{marks.setdefault(((), r['refused family']), len(marks) + 1)}]")
            continue
        parts = ["runs"] + [r["brief"]] * bool(r["brief"])  # the layers column names the windows
        groups = r["refusal groups"]
        if groups:
            refs = [marks.setdefault((tuple(names), cause), len(marks) + 1) for cause, names in groups]
            parts.append(f"{sum(len(names) for _, names in groups)} refused " + " ".join(f"[{k}]" for k in refs))
        statuses.append("; ".join(parts))
    notes = [f"[{k}] {', '.join(names) + ': ' if names else ''}{cause}" for (names, cause), k in marks.items()]
    return statuses, notes


def family_rows() -> list[dict]:
    """One row per family, in the table's order: name, model_type, random model, layers, status, ``refused``:
    each registered policy the engine refuses on it -> the engine's one-line reason, and the status in its parts:
    ``refused family`` (why the engine refuses the whole family; "" when it runs), ``brief`` (its detail in a few
    words) and ``refusal groups`` ([cause, [policies]])."""
    from kdeval.baselines import get_policy, policy_names
    from kdeval.zoo.family_status import family_statuses, refusal_reason
    from kdeval.names import RANDOM_PREFIX

    policies = {name: get_policy(name) for name in policy_names()}
    return [{"family": s.family.name, "model_type": s.family.model_type,
             "random model": RANDOM_PREFIX + s.family.random_kind, "layers": s.layers, "status": s.text(),
             "refused": {name: refusal_reason(name, msg) for name, msg in s.refused},
             "refused family": "" if s.runs else s.detail, "brief": s.brief,
             "refusal groups": [[c, n] for c, n in s.refusal_groups()]}
            for s in family_statuses(policies)]


def _layers(text: str) -> str:
    """``"1 full, 2 sliding 48"`` from :func:`~kdeval.keydiff.attention.layer_kinds.describe`'s ``"3 layers: 1 full, ..."``."""
    return text.split(": ", 1)[-1]


def models_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List every decoder family the engine is tested on, with its layer kinds and status.

    The status comes from the engine's own checks of each family's tiny config: runs, runs with its windowed
    layers kept whole, or refused and why."""
    from kdeval.cli.generate_cmds import third_party_quiet

    with third_party_quiet():
        rows = family_rows()
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from kdeval.cli.consoles import stdout
    from kdeval.jobs.reports.render.layout import Column, TableView, render

    statuses, notes = _short_statuses(rows)
    view = TableView("models", f"{len(rows)} decoder families (a grid names the random model as printed)",
                     [Column("family"), Column("model_type", key=True), Column("random model", key=True),
                      Column("layers", key=True), Column("status", fold=True)],
                     [[r["family"], r["model_type"], r["random model"], _layers(r["layers"]), status]
                      for r, status in zip(rows, statuses)])
    console = stdout()
    console.print(render(view, console.width))
    console.print("\n".join(notes), highlight=False, soft_wrap=True)
    console.print(STATUS_NOTE, highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add `models` to the main app."""
    app.command("models")(models_cmd)
