"""Score vs turn of a run's conversations: one figure per model × chunk × task instance × protocol, one line per
policy × budget with the CI of its Δ against the reference as error bars, the full cache's line beside them."""
from __future__ import annotations

from collections import defaultdict

from matplotlib.figure import Figure

from kdeval.evals.task_run.chunking import chunk_text
from kdeval.jobs.reports.report_rows import FULL, Report, TurnRow
from kdeval.jobs.reports.render.plots import Plot, _png, _slug, _style
from kdeval.jobs.reports.render.figure_text import literal_text


def _label(r: TurnRow) -> str:
    return r.policy if r.budget is None else f"{r.policy} N={r.budget}"


@literal_text
def turn_figure(title: str, rows: list[TurnRow]) -> Figure:
    """Score (points) vs turn; the full cache dashed and grey."""
    lines: dict[str, list[TurnRow]] = defaultdict(list)
    for r in rows:
        if r.value is not None:
            lines[_label(r)].append(r)
    fig = Figure(figsize=(5.6, 3.6), layout="constrained")
    ax = fig.add_subplot()
    others = sorted(k for k in lines if not k.startswith(FULL))
    for i, label in enumerate(others):
        pts = sorted(lines[label], key=lambda r: r.turn)
        low = [r.delta - r.ci_low if r.ci_low is not None else 0.0 for r in pts]
        high = [r.ci_high - r.delta if r.ci_high is not None else 0.0 for r in pts]
        shift = min(0.04, 0.3 / max(len(others), 1)) * (i - (len(others) - 1) / 2)  # dodge equal points a little
        ax.errorbar([r.turn + shift for r in pts], [r.value for r in pts], yerr=[low, high], capsize=3,
                    linewidth=1.4, markersize=5, label=label, **_style(i))
    for label in (k for k in lines if k.startswith(FULL)):
        pts = sorted(lines[label], key=lambda r: r.turn)
        ax.plot([r.turn for r in pts], [r.value for r in pts], color="#555555", linestyle="--", marker=".",
                linewidth=1.2, label=f"{label} (reference)")
    turns = sorted({r.turn for r in rows})
    ax.set_xticks(turns, [str(t) for t in turns])
    ax.set_ylim(-5, 105)
    ax.set_xlabel("turn (error bars: 95% CI of the Δ against the full cache at that turn)", fontsize=8)
    ax.set_ylabel("score (points)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return fig


def _protocol(policy: str) -> str:
    """The protocol tag of a policy label ("query-agnostic", ... ; "" for the default query-aware one)."""
    return policy.split(" [", 1)[1].rstrip("]") if " [" in policy else ""


def turn_plots(report: Report) -> list[Plot]:
    """One score-vs-turn figure per model × chunk × task instance × protocol with conversations (the full cache,
    whose cells carry no protocol, in each)."""
    groups: dict[tuple, list[TurnRow]] = defaultdict(list)
    full: dict[tuple, list[TurnRow]] = defaultdict(list)
    for r in report.turns:
        if r.policy.startswith(FULL):
            full[(r.model, r.chunk, r.task)].append(r)
        else:
            groups[(r.model, r.chunk, r.task, _protocol(r.policy))].append(r)
    for key in full:
        if not any(k[:3] == key for k in groups):
            groups[(*key, "")] = []
    plots = []
    for (model, chunk, task, proto), rows in sorted(groups.items(), key=lambda kv: [str(x) for x in kv[0]]):
        title = f"score by turn — {model}, B={chunk_text(chunk)}, {task}, {proto or 'query-aware'}"
        rows = [TurnRow(**{**r.__dict__, "policy": r.policy.split(" [")[0]}) for r in rows]
        plots.append(Plot("score_vs_turn", title, _slug("turns", model, chunk, task, proto or "query-aware"),
                          _png(turn_figure(title, rows + full[(model, chunk, task)]))))
    return plots
