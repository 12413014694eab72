"""Plots a reader can trust: score vs budget with CI bars and policies that stay visible when they overlap,
needle heatmaps with the value and n in each cell on a colour-blind-safe map."""
from __future__ import annotations

from matplotlib.container import ErrorbarContainer

from kdeval.jobs.reports import ReportOptions, build_report
from kdeval.jobs.reports.render.plots import budget_figure, needle_figure, score_vs_budget
from kdeval.jobs.reports.render.views import headline_rows
from tests.jobs.reports.helpers import FakeCell, rows, store_run


def _report(store):
    idx, res = store
    cells = [FakeCell("full", None, task="ruler.vt", length=1024, rows=rows([1.0] * 12, task="ruler.vt"))]
    for policy in ("keydiff", "snapkv", "sink"):
        for budget in (64, 128):
            same = [1.0] * 6 + [0.0] * 6  # every policy scores the same: its points overlap exactly
            cells.append(FakeCell(policy, budget, task="ruler.vt", length=1024, rows=rows(same, task="ruler.vt")))
    store_run(idx, res, "r1", cells)
    return build_report(idx, ["r1"], ReportOptions(resamples=200))


def test_score_vs_budget_has_ci_bars_and_distinct_styles(store):
    rep = _report(store)
    rows_ = headline_rows(rep.scores)
    assert {r.metric for r in rows_} == {"ruler.vt"}  # one RULER task: its own score, no ruler.avg
    fig = budget_figure("t", rows_)
    [ax] = fig.axes
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 3  # one per policy with a budget
    lines = [c.lines[0] for c in bars]
    assert len({ln.get_marker() for ln in lines}) == 3 and len({str(ln.get_linestyle()) for ln in lines}) == 3
    assert len({ln.get_color() for ln in lines}) == 3
    xs = [tuple(ln.get_xdata()) for ln in lines]
    assert len(set(xs)) == 3  # dodged sideways: equal scores do not hide each other
    kd = next(r for r in rows_ if r.policy == "keydiff" and r.budget == 64)
    seg = bars[0].lines[2][0].get_segments()[0]  # the first policy's (keydiff) first bar
    assert (seg[0][1], seg[1][1]) == (kd.value + kd.ci_low - kd.delta, kd.value + kd.ci_high - kd.delta)
    assert any(ln.get_linestyle() == "--" and ln.get_label() == "full (reference)" for ln in ax.get_lines())
    assert [p.kind for p in score_vs_budget(rep)] == ["score_vs_budget"]


def test_needle_heatmap_titles_fit_their_panels():
    """Seven panels with long policy labels: every title line is at most the panel's share of characters (a
    28-character line ran into the neighbouring panels)."""
    grid = {(1024, 25.0): (100.0, 4)}
    names = ["full"] + [f"ada(inner=snapkv(pooling=avg{i})) N=64" for i in range(6)]
    fig = needle_figure("needle", [(n, grid) for n in names])
    widest = max(len(line) for ax in fig.axes if ax.images for line in ax.get_title().splitlines())
    assert widest <= int((13.0 - 1.0) / 7 * 11) < 28


def test_memory_markers_stop_growing_past_a_few_policies():
    from kdeval.jobs.reports.render.plots import NESTED, memory_figure

    lines = {f"p{i:02d} · needle": [(100.0, 1.0)] for i in range(13)}
    [ax] = memory_figure("t", lines).axes
    sizes = [ln.get_markersize() for ln in ax.get_lines()]
    assert max(sizes) == 4 + 2.5 * (NESTED - 1) and min(sizes) == 4 and len(set(sizes)) == NESTED


def test_needle_heatmap_prints_value_and_n_on_cividis():
    grid = {(1024, 25.0): (100.0, 4), (1024, 75.0): (50.0, 4), (2048, 25.0): (0.0, 3)}
    fig = needle_figure("needle", [("full", grid), ("keydiff N=64", grid)])
    heat = [ax for ax in fig.axes if ax.images]
    assert len(heat) == 2 and all(ax.images[0].get_cmap().name == "cividis" for ax in heat)
    texts = sorted(t.get_text() for t in heat[0].texts)
    assert texts == ["0\nn=3", "100\nn=4", "50\nn=4"]  # the empty cell (2048, 75) prints nothing


def test_on_a_model_with_windowed_layers_the_budget_is_said_per_full_attention_layer(store):
    """The rows of a hybrid model carry its ``layer_kinds``: its figure's axis, its headline title and the scores'
    title say N counts tokens per full-attention layer and KV head; a model of full layers keeps 'per layer'."""
    from kdeval.jobs.reports.render import views
    from kdeval.jobs.reports.render.formats import from_json, to_json

    idx, res = store
    kinds = "18 layers: 3 full, 15 sliding 512"
    windowed = {"layer_kinds": kinds, "windowed_kv_bytes": 4096}
    cells = []
    for model, extra in (("gemma", lambda i: windowed), ("llama", lambda i: {"layer_kinds": ""})):
        cells.append(FakeCell("full", None, task="ruler.vt", model=model, rows=rows([1.0] * 4, task="ruler.vt",
                                                                                   extra=extra)))
        cells += [FakeCell("keydiff", n, task="ruler.vt", model=model, rows=rows([1.0, 0.0] * 2, task="ruler.vt",
                                                                                 extra=extra)) for n in (64, 128)]
    store_run(idx, res, "r1", cells)
    rep = build_report(idx, ["r1"], ReportOptions(resamples=50))
    assert rep.meta.layer_kinds == {"gemma": kinds}
    assert from_json(to_json(rep)).meta.layer_kinds == {"gemma": kinds}
    labels = {}
    for model in ("gemma", "llama"):
        part = [r for r in headline_rows(rep.scores) if r.model == model]
        [ax] = budget_figure("t", part, rep.meta.layer_kinds.get(model, "")).axes
        labels[model] = ax.get_xlabel()
    assert labels["gemma"] == (f"KV budget N (tokens per full-attention layer and KV head)\n{kinds}; windowed "
                               f"layers keep their window")
    assert labels["llama"] == "KV budget N (tokens per layer and KV head)"
    titles = {h.title.split(",")[0]: h.title for h in views.headline_views(rep)}
    assert titles["gemma"].endswith(f"; N: tokens per full-attention layer and KV head ({kinds}; windowed layers "
                                    f"keep their window)")
    assert "N:" not in titles["llama"]
    scores_title = views.scores_view(rep).title
    assert f"; N on gemma: tokens per full-attention layer and KV head ({kinds}" in scores_title
    assert "N on llama" not in scores_title


def test_a_recurrent_hybrids_states_are_shown_beside_its_kv_cache(store):
    """Rows of a recurrent hybrid carry ``state_bytes``: the memory table shows the states beside the KV cache and
    the KV cache's share of the two; its layers' note says what each kind keeps (no window is claimed)."""
    from kdeval.jobs.reports.render import views

    idx, res = store
    kinds = "3 layers: 1 full, 2 recurrent"
    extra = lambda i: {"layer_kinds": kinds, "state_bytes": 3072, "peak_kv_bytes": 1024}  # noqa: E731
    cells = [FakeCell("full", None, task="ruler.vt", rows=rows([1.0] * 4, task="ruler.vt", extra=extra)),
             FakeCell("keydiff", 64, task="ruler.vt", rows=rows([1.0, 0.0] * 2, task="ruler.vt", extra=extra))]
    store_run(idx, res, "r1", cells)
    rep = build_report(idx, ["r1"], ReportOptions(resamples=50))
    view = views.memory_view(rep)
    heads = [c.header for c in view.columns]
    assert "policy's share" in heads and any(h.startswith("states ") for h in heads)
    share = view.rows[0][heads.index("policy's share")]
    assert share == "25%"  # 1024 KV bytes of 1024 + 3072
    assert "recurrent layers' conv and recurrent states" in view.title
    assert views.windowed_note(kinds) == f"{kinds}; recurrent layers keep their state whole, beside the KV cache"
