"""Plots of a report as PNG bytes (matplotlib, Agg, no pyplot global state).

* score vs budget, one line per policy, per model × chunk × benchmark (the KeyDiff paper's figures),
  the full cache as a dashed horizontal line;
* needle heatmaps (depth × length, accuracy) per policy, per model × chunk × budget;
* peak KV-cache bytes vs prompt length, per model × chunk, one line per policy × budget × task (a line
  never joins two tasks), y axis from 0.
"""
from __future__ import annotations

import io
from collections import defaultdict
from dataclasses import dataclass

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from kdeval.jobs.reports.metrics import AVERAGED
from kdeval.jobs.reports.model import FULL, MetricRow, Report
from kdeval.jobs.reports.samples import task_of_label


@dataclass(frozen=True)
class Plot:
    """One figure: what it shows and its PNG bytes."""

    kind: str        # "score_vs_budget" | "needle_heatmap" | "memory_vs_length"
    title: str
    slug: str        # file-name-safe name
    png: bytes


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def _slug(*parts: object) -> str:
    text = "-".join(str(p) for p in parts)
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)


def _headline(r: MetricRow) -> bool:
    """The one number per benchmark that score-vs-budget plots: the average, or the single task's score."""
    if r.benchmark in AVERAGED:
        return r.level == "benchmark"
    return r.level == "task" and r.metric == r.benchmark


def score_vs_budget(report: Report) -> list[Plot]:
    """Headline score vs budget, one line per policy."""
    groups: dict[tuple[str, int, str], list[MetricRow]] = defaultdict(list)
    for r in report.scores:
        if _headline(r) and r.value is not None:
            groups[(r.model, r.chunk, r.metric)].append(r)
    plots = []
    for (model, chunk, metric), rows in sorted(groups.items()):
        lines: dict[str, list[tuple[int, float]]] = defaultdict(list)
        full = [r.value for r in rows if r.policy == FULL]
        for r in rows:
            if r.budget is not None:
                lines[r.policy].append((r.budget, r.value))
        if not lines:
            continue
        fig = Figure(figsize=(5.5, 3.6), layout="constrained")
        ax = fig.add_subplot()
        for policy, pts in sorted(lines.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=policy)
        if full:
            ax.axhline(full[0], color="black", linestyle="--", linewidth=1, label="full")
        budgets = sorted({p[0] for pts in lines.values() for p in pts})
        if len(budgets) > 1 and budgets[-1] / budgets[0] >= 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.set_xlabel("KV budget (tokens per layer and head)")
        ax.set_ylabel(f"{metric} (points)")
        title = f"{metric} vs budget — {model}, chunk {chunk}"
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        plots.append(Plot("score_vs_budget", title, _slug("score", model, chunk, metric), _png(fig)))
    return plots


def needle_heatmaps(report: Report) -> list[Plot]:
    """Accuracy by depth × length, one panel per policy (full included), per model × chunk × budget."""
    Grid = dict[tuple[int, float], float]  # (length, depth) -> accuracy
    cells: dict[tuple[str, int], dict[tuple[str, int | None], Grid]] = defaultdict(lambda: defaultdict(dict))
    for r in report.scores:
        if r.benchmark == "needle" and r.level == "detail" and r.length is not None and r.depth is not None \
                and r.value is not None:
            cells[(r.model, r.chunk)][(r.policy, r.budget)][(r.length, r.depth)] = r.value
    plots = []
    for (model, chunk), by_cfg in sorted(cells.items()):
        budgets = sorted({b for (_, b) in by_cfg if b is not None}) or [None]
        for budget in budgets:
            panels = [(p, b) for (p, b) in sorted(by_cfg, key=lambda k: (k[0] != FULL, k[0])) if b in (None, budget)]
            fig = Figure(figsize=(2.8 * len(panels) + 0.8, 3.0), layout="constrained")
            axes = fig.subplots(1, len(panels), squeeze=False)[0]
            image = None
            for ax, (policy, b) in zip(axes, panels):
                grid = by_cfg[(policy, b)]
                lengths = sorted({k[0] for k in grid})
                depths = sorted({k[1] for k in grid})
                z = [[grid.get((l, d), float("nan")) for l in lengths] for d in depths]
                image = ax.imshow(z, vmin=0, vmax=100, cmap="RdYlGn", aspect="auto", origin="upper")
                ax.set_xticks(range(len(lengths)), [str(l) for l in lengths], fontsize=7, rotation=45)
                ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
                ax.set_title(policy if b is None else f"{policy} N={b}", fontsize=8)
                ax.set_xlabel("length", fontsize=7)
            axes[0].set_ylabel("depth (%)", fontsize=7)
            if image is not None:
                fig.colorbar(image, ax=list(axes), shrink=0.8, label="accuracy")
            title = f"needle accuracy — {model}, chunk {chunk}" + (f", budget {budget}" if budget else "")
            fig.suptitle(title, fontsize=9)
            plots.append(Plot("needle_heatmap", title, _slug("needle", model, chunk, budget), _png(fig)))
    return plots


def kv_memory_series(report: Report) -> dict[tuple[str, int], dict[str, list[tuple[float, float]]]]:
    """(model, chunk) -> line label ``"<policy>[ N=<budget>] · <task>"`` -> sorted (median prompt tokens,
    peak KV-cache MiB) points, one per cell. Cells without ``peak_kv_bytes`` (old rows) are left out."""
    series: dict[tuple[str, int], dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for p in report.perf:
        if p.prompt_tokens is None or p.peak_kv_bytes is None:
            continue
        policy = p.policy if p.budget is None else f"{p.policy} N={p.budget}"
        series[(p.model, p.chunk)][f"{policy} · {task_of_label(p.task)}"].append(
            (p.prompt_tokens, p.peak_kv_bytes / 2**20))
    return {k: {label: sorted(pts) for label, pts in lines.items()} for k, lines in series.items()}


def memory_figure(title: str, lines: dict[str, list[tuple[float, float]]]) -> Figure:
    """One figure of :func:`kv_memory_series` lines (label -> (prompt tokens, KV MiB)), both axes from 0."""
    fig = Figure(figsize=(6.5, 3.8), layout="constrained")
    ax = fig.add_subplot()
    for label, pts in sorted(lines.items()):
        ax.plot([x for x, _ in pts], [m for _, m in pts], marker="o",
                linestyle="--" if label.startswith(f"{FULL} ") else "-", label=label)
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    ax.set_ylabel("peak KV-cache MiB")
    ax.set_xlabel("prompt tokens (median per cell)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    return fig


def memory_vs_length(report: Report) -> list[Plot]:
    """Peak KV-cache MiB vs median prompt length, per model × chunk; one line per policy × budget × task
    (its lengths and seeds are the points), both axes from 0."""
    plots = []
    for (model, chunk), lines in sorted(kv_memory_series(report).items()):
        title = f"KV-cache memory vs prompt length — {model}, chunk {chunk}"
        plots.append(Plot("memory_vs_length", title, _slug("memory", model, chunk), _png(memory_figure(title, lines))))
    return plots


def all_plots(report: Report) -> list[Plot]:
    """Every plot the report's data supports."""
    return score_vs_budget(report) + needle_heatmaps(report) + memory_vs_length(report)
