"""Plots of a report as PNG bytes (matplotlib, Agg, no pyplot global state).

* score vs budget, one line per policy, per model × chunk × benchmark (the KeyDiff paper's figures),
  the full cache as a dashed horizontal line;
* needle heatmaps (depth × length, accuracy) per policy, per model × chunk × budget;
* peak memory and peak KV tokens vs prompt length, per model × chunk, one line per policy × budget.
"""
from __future__ import annotations

import io
from collections import defaultdict
from dataclasses import dataclass

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from kdeval.jobs.reports.metrics import AVERAGED
from kdeval.jobs.reports.model import FULL, MetricRow, Report


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


def memory_vs_length(report: Report) -> list[Plot]:
    """Peak memory (MiB) and peak KV tokens vs median prompt length, per model × chunk."""
    Point = tuple[float, float | None, float | None]  # prompt tokens, MiB, KV tokens
    series: dict[tuple[str, int], dict[str, list[Point]]] = defaultdict(lambda: defaultdict(list))
    for p in report.perf:
        if p.prompt_tokens is None or (p.peak_memory_bytes is None and p.peak_kv_tokens is None):
            continue
        label = p.policy if p.budget is None else f"{p.policy} N={p.budget}"
        mem = p.peak_memory_bytes / 2**20 if p.peak_memory_bytes is not None else None
        series[(p.model, p.chunk)][label].append((p.prompt_tokens, mem, p.peak_kv_tokens))
    plots = []
    for (model, chunk), lines in sorted(series.items()):
        fig = Figure(figsize=(9, 3.4), layout="constrained")
        ax_mem, ax_kv = fig.subplots(1, 2)
        for label, pts in sorted(lines.items()):
            pts.sort()
            xs = [x for x, _, _ in pts]
            style = dict(marker="o", linestyle="--" if label == FULL else "-", label=label)
            ax_mem.plot(xs, [m if m is not None else float("nan") for _, m, _ in pts], **style)
            ax_kv.plot(xs, [k if k is not None else float("nan") for _, _, k in pts], **style)
        ax_mem.set_ylabel("peak memory (MiB)")
        ax_kv.set_ylabel("peak KV tokens per layer")
        for ax in (ax_mem, ax_kv):
            ax.set_xlabel("prompt tokens (median per cell)")
            ax.grid(alpha=0.3)
        ax_kv.legend(fontsize=7)
        title = f"memory vs prompt length — {model}, chunk {chunk}"
        fig.suptitle(title, fontsize=9)
        plots.append(Plot("memory_vs_length", title, _slug("memory", model, chunk), _png(fig)))
    return plots


def all_plots(report: Report) -> list[Plot]:
    """Every plot the report's data supports."""
    return score_vs_budget(report) + needle_heatmaps(report) + memory_vs_length(report)
