"""The conversation, broken-sample and answer-length tables as a reader sees them (terminal, Markdown, HTML).

* :func:`turns_view` — score by turn per policy × budget, Δ against the reference's same turn, and the turn
  decay Δ(turn t − turn 1), each with its CI;
* :func:`turn_query_view` — query-aware − query-agnostic per turn;
* :func:`broken_view` — the samples the reference answers and a policy does not, both predictions and the gold;
* :func:`length_view` — generated tokens against the reference's, paired, with the CI of the difference.
"""
from __future__ import annotations

from kdeval.jobs.reports.report_rows import BrokenRow, LengthRow, Report, State, TurnRow
from kdeval.jobs.reports.render.layout import Column, TableView
from kdeval.jobs.reports.render.units import interval, number, points, text
from kdeval.jobs.reports.render.views import _Shared, _reference, budget_text, legend

#: how much of a prediction a broken-sample row shows (the JSON and CSV keep all of it)
SHOWN_CHARS = 80


def _delta(value: float | None, low: float | None, high: float | None, n: int) -> str:
    return f"{points(value, signed=True)} {interval(low, high, 'ci_low', n)}".strip()


def turns_view(report: Report) -> TableView | None:
    """Score by turn (None when the runs hold no conversations)."""
    rows: list[TurnRow] = report.turns
    if not rows:
        return None
    shared = _Shared(rows)
    conf = int(report.meta.confidence * 100)
    cols = shared.columns() + [Column("task", key=True), Column("turn", numeric=True), Column("n", numeric=True),
                               Column("score", numeric=True), Column(f"Δ vs ref [{conf}% CI]", numeric=True),
                               Column(f"decay Δ(t − 1) [{conf}% CI]", numeric=True), Column("note", fold=True)]
    body = [shared.cells(r) + [r.task, str(r.turn), str(r.n), text(r.value, "value"),
                               _delta(r.delta, r.ci_low, r.ci_high, r.n_paired),
                               _delta(r.decay, r.decay_low, r.decay_high, r.n), r.note] for r in rows]
    title = (f"score by turn vs {_reference(report)}{shared.suffix()} (points; Δ paired by sample at the same "
             f"turn; decay: this turn − turn 1 of the same cell, paired by sample)")
    return TableView("turns", title, cols, body, [r.state for r in rows], list(rows), legend(body))


def turn_query_view(report: Report) -> TableView | None:
    """Query dependence per turn (None when the runs lack one of the protocols)."""
    from kdeval.jobs.reports.render.contrast_views import contrast_view

    view = contrast_view(report, "query_dependence_by_turn")
    return view


def _short(value: str) -> str:
    flat = " ".join(value.split())
    return flat if len(flat) <= SHOWN_CHARS else flat[: SHOWN_CHARS - 1] + "…"


def broken_view(report: Report) -> TableView | None:
    """Every sample the reference answers and a policy does not (None when there is none)."""
    rows: list[BrokenRow] = report.broken
    if not rows:
        return None
    shared = _Shared(rows)
    turns = any(r.turn for r in rows)
    cols = shared.columns() + [Column("task", key=True), Column("id", key=True)] + (
        [Column("turn", numeric=True)] if turns else []) + [
        Column("score", numeric=True), Column("ref", numeric=True), Column("prediction", fold=True),
        Column("reference's prediction", fold=True), Column("gold", fold=True)]
    body = [shared.cells(r) + [r.task, r.id] + ([str(r.turn)] if turns else []) + [
        number(r.score or 0.0), number(r.ref_score or 0.0), _short(r.prediction), _short(r.ref_prediction),
        _short(r.gold)] for r in rows]
    title = (f"what compression broke{shared.suffix()}: samples {_reference(report)} answers (score >= 0.5) and "
             f"the policy does not ({len(rows)})")
    return TableView("broken", title, cols, body, [""] * len(rows), list(rows),
                     f"predictions cut at {SHOWN_CHARS} characters; JSON and CSV hold them whole")


def length_view(report: Report) -> TableView | None:
    """Answer length per cell against the reference (None when nothing pairs)."""
    rows: list[LengthRow] = report.answer_length
    if not rows:
        return None
    shared = _Shared(rows)
    conf = int(report.meta.confidence * 100)
    cols = shared.columns() + [Column("task", key=True), Column("n", numeric=True), Column("tokens", numeric=True),
                               Column("ref tokens", numeric=True), Column(f"Δ tokens [{conf}% CI]", numeric=True),
                               Column("×", numeric=True), Column("tok/solved", numeric=True),
                               Column("ref tok/solved", numeric=True), Column("capped", numeric=True),
                               Column("ref capped", numeric=True), Column("note", fold=True)]
    body = []
    for r in rows:
        delta = "" if r.delta is None else (
            f"{r.delta:+.2f} " + (f"[{r.ci_low:+.2f}, {r.ci_high:+.2f}]" if r.ci_low is not None else "")).strip()
        body.append(shared.cells(r) + [r.task, str(r.n_paired), "" if r.tokens is None else f"{r.tokens:.1f}",
                                       "" if r.ref_tokens is None else f"{r.ref_tokens:.1f}", delta,
                                       "" if r.ratio is None else number(r.ratio),
                                       _tokens(r.per_solved), _tokens(r.ref_per_solved), _share(r.capped),
                                       _share(r.ref_capped),
                                       "; ".join(x for x in ("" if r.state == State.OK else r.state, r.note) if x)])
    title = (f"answer length vs {_reference(report)}{shared.suffix()} (generated tokens, means over the samples "
             f"paired by id; Δ = this − reference; tok/solved: decode tokens per solved problem; capped: "
             f"share of traces cut at max_new_tokens)")
    return TableView("answer_length", title, cols, body, [r.state for r in rows], list(rows))


def _tokens(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _share(value: float | None) -> str:
    return "" if value is None else f"{value:.0%}"


def conversation_views(report: Report) -> list[TableView]:
    """The tables of runs holding conversations: score by turn, then query dependence by turn."""
    return [v for v in (turns_view(report), turn_query_view(report)) if v is not None]
