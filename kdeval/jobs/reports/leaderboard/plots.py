"""The leaderboard's figures, per model × task instance: score vs budget and score vs peak KV-cache bytes.

Left, score vs budget N: one line per policy (per chunk size and code version too, when rows differ in them),
with the CI of its Δ against the full cache as error bars around the score, and the full cache as a dashed
horizontal line (budgets given as a share of the prompt are left to the right panel: one axis cannot hold
both). Right, score vs peak KV-cache bytes on a log axis: every row a point, the full cache included, so a
policy that scores as much with fewer bytes sits up and to the left. PNG bytes through matplotlib's Agg canvas
(no pyplot state), styled as the report's figures (Okabe–Ito colours, a marker and a dash per line).
"""
from __future__ import annotations

from collections import defaultdict

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from kdeval.evals.task_run.budget import is_share
from kdeval.jobs.reports.leaderboard.build import LeaderboardRow
from kdeval.jobs.reports.report_rows import FULL, State
from kdeval.jobs.reports.leaderboard.views import short_code
from kdeval.jobs.reports.render.plots import _png, _style
from kdeval.jobs.reports.render.figure_text import literal_text


def line_label(r: LeaderboardRow, chunks: int, versioned: set[str]) -> str:
    """A line's legend: the policy, with ``B=`` when the task has several chunk sizes and its code version when
    the policy has cells of several code versions here (``versioned``: those policies)."""
    label = r.policy + (f" B={r.chunk}" if chunks > 1 else "")
    return label + (f" @{short_code(r.code)}" if r.policy in versioned else "")


@literal_text
def task_figure(title: str, rows: list[LeaderboardRow]) -> bytes:
    """The two panels of one model × task instance (see the module's docstring) as PNG bytes."""
    fig = Figure(figsize=(11, 3.8))
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    chunks = len({r.chunk for r in rows})
    codes = {r.policy for r in rows if r.variant}
    lines: dict[str, list[LeaderboardRow]] = defaultdict(list)
    fulls = [r for r in rows if r.state == State.REFERENCE and r.value is not None]
    for r in rows:
        if r.value is not None and r.budget is not None and not is_share(r.budget):
            lines[line_label(r, chunks, codes)].append(r)
    for i, (label, members) in enumerate(sorted(lines.items())):
        members.sort(key=lambda r: float(r.budget))
        xs = [float(r.budget) for r in members]
        ys = [r.value for r in members]
        err = [[r.delta - r.ci_low if r.delta is not None else 0.0 for r in members],
               [r.ci_high - r.delta if r.delta is not None else 0.0 for r in members]]
        left.errorbar(xs, ys, yerr=err, capsize=3, lw=1.4, ms=5, label=label, **_style(i))
    for j, f in enumerate(fulls):
        left.axhline(f.value, color="#555", ls="--", lw=1, label=line_label(f, chunks, codes) if j < 4 else None)
    left.set_xlabel("budget N (tokens kept per layer and KV head)")
    left.set_ylabel("score (points)")
    left.set_title("score vs budget (bars: 95% CI of Δ vs full)", fontsize=9)
    styles = {label: _style(i) for i, label in enumerate(sorted(lines))}
    points = [r for r in rows if r.value is not None and r.peak_kv_bytes]
    for r in points:
        label = line_label(r, chunks, codes)
        style = styles.get(label, {"color": "#555", "marker": "*", "linestyle": "none"})
        right.plot([r.peak_kv_bytes / 2**20], [r.value], linestyle="none", marker=style["marker"],
                   color=style["color"], ms=8 if r.policy == FULL else 6,
                   label=label if r.policy == FULL else None)
    if points:
        right.set_xscale("log")
        right.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        right.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else ""))
        right.margins(x=0.15)
    right.set_xlabel("peak KV-cache MiB (log)")
    right.set_title("score vs KV-cache bytes (up and left is better)", fontsize=9)
    for ax in (left, right):
        ax.set_ylim(-5, 105)
        ax.grid(alpha=0.3)
    handles = left.get_legend_handles_labels()
    if handles[0]:
        left.legend(fontsize=7, loc="best")
    if right.get_legend_handles_labels()[0]:
        right.legend(fontsize=7, loc="best")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _png(fig)
