"""Plots of a report as PNG bytes (matplotlib, Agg, no pyplot global state).

* score vs budget, one line per policy with the CI of its Δ as error bars, per model × chunk × benchmark
  (the KeyDiff paper's figures), the full cache as a dashed horizontal line; budgets in tokens and budgets as
  a share of the prompt (``25%``) get a figure each, never one axis;
* needle heatmaps (depth × length: accuracy and n in each cell) per policy, per model × chunk × budget;
* peak KV-cache bytes vs prompt length, per model × chunk, one line per policy × budget × task (a line
  never joins two tasks), both axes from 0.

Policies differ in colour (Okabe–Ito), marker and dash; heatmaps use ``cividis``: all readable with the
common colour-vision deficiencies.
"""
from __future__ import annotations

import io
import textwrap
from collections import defaultdict
from dataclasses import dataclass

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from kdeval.evals.task_run.budget import Budget, budget_order, is_share, share_fraction
from kdeval.evals.task_run.chunking import chunk_text
from kdeval.jobs.reports.report_rows import FULL, MetricRow, Report
from kdeval.jobs.reports.render.views import budget_per, headline_rows, windowed_note
from kdeval.jobs.reports.samples import task_of_label
from kdeval.jobs.reports.render.figure_text import literal_text


@dataclass(frozen=True)
class Plot:
    """One figure: what it shows and its PNG bytes."""

    kind: str        # "score_vs_budget" | "needle_heatmap" | "memory_vs_length"
    title: str
    slug: str        # file-name-safe name
    png: bytes


#: how many marker sizes the memory figure nests (more policies than that: the first ones share the largest)
NESTED = 5


@literal_text
def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def _slug(*parts: object) -> str:
    text = "-".join(str(p) for p in parts)
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)


#: Okabe–Ito colours (distinguishable with the common colour-vision deficiencies), markers and dashes: each
#: policy differs from the others in all three, so lines that overlap stay visible.
COLORS = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#F0E442")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
DASHES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1)), (0, (1, 1)), (0, (8, 2)))


def _style(i: int) -> dict:
    return {"color": COLORS[i % len(COLORS)], "marker": MARKERS[i % len(MARKERS)],
            "linestyle": DASHES[i % len(DASHES)]}


def _budget_x(budget: int | str) -> float:
    """Where a budget sits on a score-vs-budget axis: N tokens, or a share in percent."""
    return float(share_fraction(budget) * 100) if is_share(budget) else float(budget)


@literal_text
def budget_figure(title: str, rows: list[MetricRow], layer_kinds: str = "") -> Figure:
    """Score vs budget of one benchmark's headline ``rows``: a line per policy with the CI of its Δ as error
    bars, dodged sideways a little so equal points stay visible; the full cache as a dashed line. The budgets
    are all tokens or all shares of the prompt (ValueError otherwise: one axis cannot hold both).
    ``layer_kinds``: the model's layers when some are windowed (the axis then says the budget is per
    full-attention layer, :func:`~kdeval.jobs.reports.render.views.budget_per`)."""
    lines: dict[str, list[MetricRow]] = defaultdict(list)
    for r in rows:
        if r.budget is not None:
            lines[r.policy].append(r)
    shares = {is_share(r.budget) for pts in lines.values() for r in pts}
    if len(shares) > 1:
        raise ValueError("rows: budgets in tokens and shares of the prompt cannot share a score-vs-budget axis")
    fig = Figure(figsize=(5.6, 3.6), layout="constrained")
    ax = fig.add_subplot()
    ax.set_xscale("log", base=2)
    for i, (policy, pts) in enumerate(sorted(lines.items())):
        pts.sort(key=lambda r: budget_order(r.budget))
        shift = 2 ** (0.06 * (i - (len(lines) - 1) / 2))  # dodge: a few % of a doubling
        low = [r.delta - r.ci_low if r.ci_low is not None else 0.0 for r in pts]
        high = [r.ci_high - r.delta if r.ci_high is not None else 0.0 for r in pts]
        ax.errorbar([_budget_x(r.budget) * shift for r in pts], [r.value for r in pts], yerr=[low, high], capsize=3,
                    linewidth=1.4, markersize=5, label=policy, **_style(i))
    full = [r.value for r in rows if r.policy == FULL]
    if full:
        ax.axhline(full[0], color="#555555", linestyle="--", linewidth=1, label="full (reference)")
    budgets = sorted({r.budget for pts in lines.values() for r in pts}, key=budget_order)
    ax.set_xticks([_budget_x(b) for b in budgets], [str(b) for b in budgets])
    ax.minorticks_off()
    ax.set_xlim(_budget_x(budgets[0]) / 1.5, _budget_x(budgets[-1]) * 1.5)
    ax.set_ylim(-5, 105)
    per = budget_per(layer_kinds)
    label = (f"KV budget: share of each prompt kept ({per})" if shares == {True} else f"KV budget N (tokens {per})")
    # wrapped: a long note (several layer kinds) would otherwise shrink the whole figure to the label's width
    ax.set_xlabel(label + (f"\n{textwrap.fill(windowed_note(layer_kinds), 80)}" if layer_kinds else ""))
    ax.set_ylabel(f"{rows[0].metric} (points)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return fig


def score_vs_budget(report: Report) -> list[Plot]:
    """Headline score vs budget per model × chunk × benchmark (:func:`budget_figure`), token budgets and
    shares of the prompt in separate figures (each with the full cache's line)."""
    groups: dict[tuple[str, int, str], list[MetricRow]] = defaultdict(list)
    for r in headline_rows(report.scores):
        if r.value is not None:
            groups[(r.model, r.chunk, r.metric)].append(r)
    plots = []
    for (model, chunk, metric), rows in sorted(groups.items()):
        for shares in (False, True):
            part = [r for r in rows if r.budget is None or is_share(r.budget) == shares]
            if all(r.budget is None for r in part):
                continue
            title = f"{metric} vs budget{' (share of the prompt)' if shares else ''} — {model}, B={chunk_text(chunk)}"
            slug = _slug("score", model, chunk, metric, *(["share"] if shares else []))
            figure = budget_figure(title, part, report.meta.layer_kinds.get(model, ""))
            plots.append(Plot("score_vs_budget", title, slug, _png(figure)))
    return plots


#: (length, depth) -> (accuracy in points, samples)
NeedleGrid = dict[tuple[int, float], tuple[float, int]]


@literal_text
def needle_figure(title: str, panels: list[tuple[str, NeedleGrid]]) -> Figure:
    """One heatmap per (panel title, grid): accuracy by depth × length, each cell printing its value and n."""
    width = min(2.6 * len(panels) + 1.0, 13.0)
    fig = Figure(figsize=(width, 3.0), layout="constrained")
    # a title line fits its panel (about 11 characters per inch at size 9): a long policy label would otherwise
    # run into its neighbours; a label without spaces breaks inside
    title_chars = max(10, int((width - 1.0) / len(panels) * 11))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    image = None
    for ax, (name, grid) in zip(axes, panels):
        lengths = sorted({k[0] for k in grid})
        depths = sorted({k[1] for k in grid})
        z = [[grid.get((l, d), (float("nan"), 0))[0] for l in lengths] for d in depths]
        image = ax.imshow(z, vmin=0, vmax=100, cmap="cividis", aspect="auto", origin="upper")
        for yi, d in enumerate(depths):
            for xi, l in enumerate(lengths):
                if (l, d) in grid:
                    value, n = grid[(l, d)]
                    ax.text(xi, yi, f"{value:.0f}\nn={n}", ha="center", va="center", fontsize=8,
                            color="white" if value < 55 else "black")  # cividis: dark below ~55
        ax.set_xticks(range(len(lengths)), [str(l) for l in lengths], fontsize=8)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=8)
        ax.set_title(textwrap.fill(name, title_chars, break_on_hyphens=False), fontsize=9)
        ax.set_xlabel("length (tokens)", fontsize=8)
    axes[0].set_ylabel("depth (%)", fontsize=8)
    if image is not None:
        fig.colorbar(image, ax=list(axes), shrink=0.8, label="accuracy (points)")
    fig.suptitle(title, fontsize=9)
    return fig


def needle_heatmaps(report: Report) -> list[Plot]:
    """Needle accuracy by depth × length, one panel per policy (full included), per model × chunk × budget
    (:func:`needle_figure`)."""
    cells: dict[tuple[str, int], dict[tuple[str, Budget], NeedleGrid]] = defaultdict(lambda: defaultdict(dict))
    for r in report.scores:
        if r.benchmark == "needle" and r.level == "detail" and r.length is not None and r.depth is not None \
                and r.value is not None:
            cells[(r.model, r.chunk)][(r.policy, r.budget)][(r.length, r.depth)] = (r.value, r.n)
    plots = []
    for (model, chunk), by_cfg in sorted(cells.items()):
        budgets = sorted({b for (_, b) in by_cfg if b is not None}, key=budget_order) or [None]
        for budget in budgets:
            panels = [(p if b is None else f"{p} N={b}", by_cfg[(p, b)])
                      for (p, b) in sorted(by_cfg, key=lambda k: (k[0] != FULL, k[0])) if b in (None, budget)]
            title = f"needle accuracy — {model}, B={chunk_text(chunk)}" + (f", N={budget}" if budget else "")
            plots.append(Plot("needle_heatmap", title, _slug("needle", model, chunk, budget),
                              _png(needle_figure(title, panels))))
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


@literal_text
def memory_figure(title: str, lines: dict[str, list[tuple[float, float]]]) -> Figure:
    """One figure of :func:`kv_memory_series` lines (label -> (prompt tokens, KV MiB)), both axes from 0:
    a colour and dash per policy, a marker per task."""
    longest = max((len(label) for label in lines), default=0)  # the legend sits right of the plot: widen for it
    fig = Figure(figsize=(6.4 + 0.07 * max(0, longest - 30), 3.6), layout="constrained")
    ax = fig.add_subplot()
    policies = sorted({label.split(" · ")[0] for label in lines})
    tasks = sorted({label.split(" · ")[-1] for label in lines})
    for label, pts in sorted(lines.items()):
        policy, task = label.split(" · ")[0], label.split(" · ")[-1]
        i = policies.index(policy)
        style = _style(i)
        style["marker"] = MARKERS[tasks.index(task) % len(MARKERS)]
        # Policies with the same KV bytes share points: hollow markers, larger for earlier policies, nest (up to
        # NESTED sizes: past that a marker would hide the plot and the legend)
        size = 4 + 2.5 * min(len(policies) - 1 - i, NESTED - 1)
        ax.plot([x for x, _ in pts], [m for _, m in pts], linewidth=1.4, markersize=size,
                markerfacecolor="none", markeredgewidth=1.5, label=label, **style)
    ax.set_ylim(bottom=0, top=max((m for pts in lines.values() for _, m in pts), default=1.0) * 1.1)
    ax.set_xlim(left=0, right=max((x for pts in lines.values() for x, _ in pts), default=1.0) * 1.1)
    ax.set_ylabel("peak KV-cache MiB")
    ax.set_xlabel("prompt tokens (median per cell)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    ax.set_title(title, fontsize=9)
    return fig


def memory_vs_length(report: Report) -> list[Plot]:
    """Peak KV-cache MiB vs median prompt length, per model × chunk; one line per policy × budget × task
    (its lengths and seeds are the points), both axes from 0."""
    plots = []
    for (model, chunk), lines in sorted(kv_memory_series(report).items()):
        title = f"KV-cache memory vs prompt length — {model}, B={chunk_text(chunk)}"
        plots.append(Plot("memory_vs_length", title, _slug("memory", model, chunk), _png(memory_figure(title, lines))))
    return plots


def all_plots(report: Report) -> list[Plot]:
    """Every plot the report's data supports."""
    return score_vs_budget(report) + needle_heatmaps(report) + memory_vs_length(report)
