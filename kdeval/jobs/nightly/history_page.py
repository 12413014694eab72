"""The nightly history page: one self-contained HTML file drawn from ``history.jsonl`` (no index needed).

What a reader sees, top to bottom: the latest verdict; per tracked score a time series (the night's value,
the paired CI band against its baseline, the ``max_drop`` threshold under the baseline's value, a mark per
night: pass, fail, drift); TTFT, decode tokens/s and peak KV-cache bytes over nights (per policy × budget ×
chunk, the median over its cells); a table of nights with what changed from the night before. Figures are
PNG data URIs (matplotlib, Agg), so the file can be mailed or archived as it is.
"""
from __future__ import annotations

import base64
import html
import io
import os
from collections import defaultdict
from pathlib import Path
from statistics import median
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from kdeval.evals.task_run.chunking import chunk_text
from kdeval.jobs.nightly.attribution import night_changes
from kdeval.jobs.reports.render.figure_text import literal_text

PAGE = "history.html"
#: Okabe–Ito: readable with the common colour-vision deficiencies.
COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1100px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}table{border-collapse:collapse;font-size:.85em}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}.pass{color:#1a7f37;font-weight:bold}
.fail{color:#c62828;font-weight:bold}.drift{color:#b26a00;font-weight:bold}img{max-width:100%}
.figs{display:flex;flex-wrap:wrap;gap:8px}.figs img{width:520px}"""


@literal_text
def _uri(fig: Figure) -> str:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _label(entry: dict[str, Any], seconds: bool = False) -> str:
    """``MM-DD HH:MM`` of the night (``:SS`` too where nights share a minute)."""
    return str(entry.get("time", ""))[5:19 if seconds else 16].replace("T", " ")


def _ticks(entries: list[dict[str, Any]]) -> list[str]:
    labels = [_label(e) for e in entries]
    return labels if len(set(labels)) == len(labels) else [_label(e, seconds=True) for e in entries]


def _series(entries: list[dict[str, Any]]) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    out: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for i, e in enumerate(entries):
        for t in e.get("tracked") or []:
            out[t["key"]].append((i, t))
    return out


def _drifted(entry: dict[str, Any], key: str) -> bool:
    return any(d.get("key") == key for d in entry.get("drift") or [])


@literal_text
def score_figure(key: str, points: list[tuple[int, dict[str, Any]]], entries: list[dict[str, Any]]) -> str:
    """The time series of one tracked score (a data URI)."""
    fig = Figure(figsize=(6.5, 2.6))
    ax = fig.add_subplot()
    xs = [i for i, _ in points]
    ax.plot(xs, [t["value"] for _, t in points], color=COLOURS[0], lw=1.5, label="value")
    band = [(i, t) for i, t in points if t.get("low") is not None]
    if band:
        ax.fill_between([i for i, _ in band], [t["low"] for _, t in band], [t["high"] for _, t in band],
                        color=COLOURS[0], alpha=0.18, lw=0, label="95% CI vs baseline")
    thr = [(i, t["threshold"]) for i, t in points if t.get("threshold") is not None]
    if thr:
        ax.step([i for i, _ in thr], [v for _, v in thr], where="mid", color=COLOURS[5], ls="--", lw=1,
                label="baseline − max_drop")
    for i, t in points:
        e = entries[i]
        if t.get("regressed"):
            ax.plot(i, t["value"], "X", color="#c62828", ms=9)
        elif e.get("passed"):
            ax.plot(i, t["value"], "o", color="#1a7f37", ms=5)
        else:
            ax.plot(i, t["value"], "s", color="#c62828", ms=5, mfc="none")
        if _drifted(e, key):
            ax.plot(i, t["value"], "^", color="#b26a00", ms=11, mfc="none", mew=1.8)
    ax.set_xticks(range(len(entries)), _ticks(entries), rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("points")
    ax.set_title(key, fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    ax.grid(alpha=0.3)
    return _uri(fig)


@literal_text
def perf_figure(entries: list[dict[str, Any]]) -> str | None:
    """TTFT, decode tokens/s and peak KV bytes over nights, per configuration (a data URI; None: no timings)."""
    per: dict[str, dict[str, dict[int, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for i, e in enumerate(entries):
        for p in e.get("perf") or []:
            budget = "" if p.get("budget") is None else f" N={p['budget']}"
            config = f"{p['policy']}{budget} B={chunk_text(p['chunk'])}"
            for k in ("ttft_s", "decode_tok_s", "peak_kv_bytes"):
                if p.get(k) is not None:
                    per[k][config][i].append(float(p[k]))
    if not per:
        return None
    fig = Figure(figsize=(13, 3.2))
    titles = {"ttft_s": "TTFT (s, median)", "decode_tok_s": "decode tokens/s (median)",
              "peak_kv_bytes": "peak KV-cache bytes (median)"}
    configs = sorted({c for k in per for c in per[k]})
    for n, k in enumerate(titles, 1):
        ax = fig.add_subplot(1, 3, n)
        for j, config in enumerate(configs):
            pts = sorted(per[k].get(config, {}).items())
            if pts:
                ax.plot([i for i, _ in pts], [median(v) for _, v in pts], marker="o", ms=3,
                        color=COLOURS[j % len(COLOURS)], label=config)
        ax.set_title(titles[k], fontsize=9)
        ax.set_xticks(range(len(entries)), _ticks(entries), rotation=30, ha="right", fontsize=6)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    fig.axes[0].legend(fontsize=6)
    return _uri(fig)


def changes(prev: dict[str, Any] | None, entry: dict[str, Any]) -> list[str]:
    """What changed from the night before (environment, grid, data), one text each."""
    if prev is None:
        return ["first night"]
    text = {"env": lambda k, a, b: f"{k}: {a} → {b}",
            "grid": lambda k, a, b: f"grid {str(a)[:12]} → {str(b)[:12]}",
            "data": lambda k, a, b: f"data {k}: {str(a)[:12]} → {str(b)[:12]}"}
    return [text[kind](key, a, b) for kind, key, a, b in night_changes(prev, entry)]


def _verdict(e: dict[str, Any]) -> str:
    v = '<span class="pass">PASS</span>' if e.get("passed") else '<span class="fail">FAIL</span>'
    return v + (' <span class="drift">DRIFT</span>' if e.get("drift") else "")


def _nights_table(entries: list[dict[str, Any]]) -> list[str]:
    rows = ["<table><tr><th>night</th><th>run</th><th>verdict</th><th>baseline</th><th>kdeval</th>"
            "<th>torch / transformers / CUDA</th><th>device</th><th>changed from the night before</th></tr>"]
    for i in range(len(entries) - 1, -1, -1):
        e, env = entries[i], entries[i].get("env") or {}
        why = "".join(f"<li>{html.escape(x)}</li>" for x in e.get("regressions", []) + e.get("speed_regressions", []))
        commit = f" @{str(env['git_commit'])[:10]}" if env.get("git_commit") else ""
        cells = [_label(e), html.escape(str(e.get("run"))), _verdict(e) + (f"<ul>{why}</ul>" if why else ""),
                 html.escape(str(e.get("baseline") or "—")),
                 html.escape(f"{env.get('kdeval_version', '?')}+{env.get('source_hash', '?')}{commit}"),
                 html.escape(f"{env.get('torch')} / {env.get('transformers')} / {env.get('cuda')}"),
                 html.escape(f"{env.get('device')}" + (f" (driver {env['driver']})" if env.get("driver") else "")),
                 "<br>".join(html.escape(c) for c in changes(entries[i - 1] if i else None, e)) or "nothing recorded"]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return rows + ["</table>"]


def history_html(entries: list[dict[str, Any]], title: str, leaderboard: str | None = None) -> str:
    """The page for ``entries`` (``history.jsonl`` lines of one grid, oldest first); ``leaderboard``: the link to
    the leaderboard of the grid's models and tasks (relative to the page), None when there is none."""
    parts = ["<!doctype html><html><head><meta charset='utf-8'>", f"<title>{html.escape(title)}</title>",
             f"<style>{STYLE}</style></head><body>", f"<h1>{html.escape(title)}</h1>"]
    if leaderboard is not None:
        parts.append(f"<p><a id='leaderboard' href='{html.escape(leaderboard, quote=True)}'>Leaderboard</a>: every "
                     "done cell of the index for this grid's models and tasks, from any run, with Δ against the "
                     "full cache paired by sample id.</p>")
    if not entries:
        return "".join(parts) + "<p>No nights recorded yet.</p></body></html>"
    last = entries[-1]
    parts.append(f"<p>Latest night {html.escape(_label(last))} (run {html.escape(str(last.get('run')))}): "
                 f"{_verdict(last)} · {len(entries)} night(s). Marks: ● pass, ✖ this score regressed, □ night failed "
                 "for another reason, △ drift flagged (last K nights vs the K before).</p>")
    for d in last.get("drift") or []:
        parts.append(f"<p class='drift'>DRIFT {html.escape(d['text'])}</p>")
    parts.append("<h2>Tracked scores</h2><div class='figs'>")
    for key, points in sorted(_series(entries).items()):
        parts.append(f"<img alt='{html.escape(key, quote=True)}' src='{score_figure(key, points, entries)}'>")
    parts.append("</div>")
    perf = perf_figure(entries)
    if perf is not None:
        parts += ["<h2>Speed and memory</h2>", f"<img alt='TTFT, decode tokens/s and KV bytes' src='{perf}'>"]
    parts += ["<h2>Nights</h2>", *_nights_table(entries), "</body></html>"]
    return "\n".join(parts)


def write_history_page(entries: list[dict[str, Any]], out_dir: Path, title: str,
                       leaderboard: Path | None = None) -> Path:
    """Write :func:`history_html` to ``out_dir/history.html`` (through a temp file); returns its path.
    ``leaderboard``: the leaderboard page to link to, when it exists."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / PAGE
    tmp = out_dir / f".{PAGE}.tmp"
    link = (Path(os.path.relpath(Path(leaderboard).absolute(), out_dir.absolute())).as_posix()
            if leaderboard is not None and Path(leaderboard).is_file() else None)
    tmp.write_text(history_html(entries, title, link), encoding="utf-8")
    tmp.replace(path)
    return path
