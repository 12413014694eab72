"""`kdeval tasks` and `kdeval score`: list the evaluation tasks; score predictions without a model."""
from __future__ import annotations

import json
from pathlib import Path

import typer

from kdeval.cli.errors import bad_input


def tasks_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List every task with its benchmark, metric and data source."""
    from kdeval.evals import REGISTRY

    specs = list(REGISTRY.values())
    if as_json:
        typer.echo(json.dumps([s.to_dict() for s in specs], indent=2))
        return
    from kdeval.cli.consoles import stdout
    from kdeval.jobs.reports.render.layout import Column, TableView, render

    view = TableView("tasks", f"{len(specs)} tasks (`kdeval score TASK` and grids name them as printed)",
                     [Column("task", key=True), Column("benchmark"), Column("metric", fold=True), Column("data source", fold=True)],
                     [[s.name, s.benchmark, s.metric, s.source] for s in specs])
    console = stdout()
    console.print(render(view, console.width))  # task names stay whole: they are typed as printed


def score_cmd(
    task: str = typer.Argument(..., help="Task name, e.g. longbench.trec or ruler.niah_single_1 (see `kdeval tasks`)."),
    predictions: Path = typer.Option(..., "--predictions", help='JSON lines: {"id", "prediction", "references": [...]} (+ e.g. "all_classes").'),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Score stored predictions with the task's metric; print per-sample scores and the aggregate."""
    from kdeval.evals import get_scorer
    from kdeval.evals.tasks.scoring import read_predictions, score_records

    with bad_input():
        scorer = get_scorer(task)
        rows = score_records(scorer, read_predictions(predictions))
        headline = scorer.aggregate(rows)
    if as_json:
        typer.echo(json.dumps({"task": task, "samples": rows, "aggregate": headline}, indent=2, ensure_ascii=False))
        return
    from kdeval.cli.consoles import stdout
    from kdeval.jobs.reports.render.layout import Column, TableView, render

    subs = [k for k in rows[0] if k not in ("id", "score", "length", "depth", "level")]
    view = TableView("samples", f"{task}: per-sample scores (0-1)",
                     [Column("id", key=True), Column("score", numeric=True)] + [Column(k, numeric=True) for k in subs],
                     [[str(r["id"]), f"{r['score']:.4f}", *(f"{r[k]:.4f}" for k in subs)] for r in rows])
    console = stdout()
    console.print(render(view, console.width))
    console.print(f"{task}: " + ", ".join(f"{k}={v}" for k, v in headline.items() if not isinstance(v, (list, dict))))


def register(app: typer.Typer) -> None:
    """Add `tasks` and `score` to the main app."""
    app.command("tasks")(tasks_cmd)
    app.command("score")(score_cmd)
