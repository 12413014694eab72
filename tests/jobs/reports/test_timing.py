"""Fair timing: a worker warms a freshly loaded model up before it times a cell; speed ratios come with a CI
over samples, and a ratio whose CI spans 1.0 is marked "too noisy to rank" (and warned about once)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from rich.console import Console

from kdeval.cluster.stub import StubWorkload
from kdeval.cluster.worker import CellWorker
from kdeval.cluster.workload import CellResult, CellTask
from kdeval.jobs.reports import ReportOptions, build_report
from kdeval.jobs.reports.perf import TOO_NOISY
from kdeval.jobs.reports.render.terminal import speed_table
from kdeval.jobs.reports.stats import median_ratio_bootstrap
from tests.jobs.reports.helpers import FakeCell, rows, store_run


def test_median_ratio_bootstrap_known_answers():
    ref = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    exact = median_ratio_bootstrap(2 * ref, ref, resamples=500, seed=0)
    assert (exact.estimate, exact.low, exact.high) == (2.0, 2.0, 2.0)  # every resample has the same ratio
    rng = np.random.default_rng(0)
    own, base = rng.lognormal(0.0, 0.3, 200), rng.lognormal(0.0, 0.3, 200)
    a = median_ratio_bootstrap(own, base, resamples=400, seed=3)
    assert a == median_ratio_bootstrap(own, base, resamples=400, seed=3)  # seeded
    assert a.estimate == pytest.approx(np.median(own) / np.median(base)) and a.low < a.estimate < a.high
    assert median_ratio_bootstrap(own, base, resamples=0).low == a.estimate
    assert median_ratio_bootstrap(np.array([]), np.array([])) is None
    assert median_ratio_bootstrap(np.ones(3), np.zeros(3)) is None
    with pytest.raises(ValueError, match="3 own values vs"):
        median_ratio_bootstrap(np.ones(3), np.ones(2))


def _timed(ttft: list[float]):
    return lambda i: {"ttft_s": ttft[i % len(ttft)]}


def test_speed_ratios_have_cis_and_noise_is_marked(store):
    idx, res = store
    base = [0.2 + 0.05 * i for i in range(12)]
    store_run(idx, res, "r1", [
        FakeCell("full", None, rows=rows([1.0] * 12, extra=_timed(base))),
        FakeCell("keydiff", 256, rows=rows([1.0] * 12, extra=_timed([2 * t for t in base]))),  # 2x, every sample
        FakeCell("sink", 256, rows=rows([1.0] * 12, extra=_timed([t * (0.5 if i % 2 else 2.0) for i, t in
                                                                   enumerate(base)]))),        # half 2x, half 0.5x
        FakeCell("keydiff", 256, task="phonebook", length=512,
                 rows=rows([1.0], task="phonebook", length=512, extra=_timed([0.9]))),        # one sample
        FakeCell("full", None, task="phonebook", length=512,
                 rows=rows([1.0], task="phonebook", length=512, extra=_timed([0.3]))),
    ])
    rep = build_report(idx, ["r1"], ReportOptions(resamples=500, seed=0))
    perf = {(p.policy, p.task.split("@")[0]): p for p in rep.perf}
    kd = perf[("keydiff", "needle")]
    assert (kd.ttft_ratio, kd.ttft_ratio_low, kd.ttft_ratio_high, kd.n_paired) == (2.0, 2.0, 2.0, 12)
    assert kd.decode_ratio == 1.0 and kd.speed_note == ""  # equal decode rates: a tie, not noise
    sink = perf[("sink", "needle")]
    assert sink.ttft_ratio_low < 1.0 < sink.ttft_ratio_high and sink.speed_note == TOO_NOISY
    one = perf[("keydiff", "phonebook")]
    assert one.n_paired == 1 and one.ttft_ratio == 3.0 and one.speed_note == f"{TOO_NOISY} (1 sample)"
    assert perf[("full", "needle")].speed_note == "" and perf[("full", "needle")].ttft_ratio is None
    [warning] = [w for w in rep.meta.warnings if w.startswith("timing:")]
    assert "2 of 3 cells' speed ratios are too noisy to rank" in warning
    console = Console(record=True, width=160)
    console.print(speed_table(rep, console.width))
    text = console.export_text()
    assert "2.00 [2.00, 2.00]" in text and TOO_NOISY in text and "3.00 [3.00, 3.00]†" in text


@dataclass
class _Handle:
    model: object


class _TorchWorkload:
    """Loads a tiny torch module (as a LoadedModel's ``.model``) and records every call in order."""

    def __init__(self) -> None:
        import torch

        self.events: list[str] = []
        events = self.events

        class Tiny(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.emb = torch.nn.Embedding(16, 4)

            def forward(self, input_ids, use_cache=True):
                events.append(f"forward {tuple(input_ids.shape)} use_cache={use_cache}")
                return self.emb(input_ids)

        self.cls = Tiny

    def load(self, task: CellTask) -> _Handle:
        self.events.append(f"load {task.model_id}")
        return _Handle(self.cls())

    def run(self, handle: _Handle, task: CellTask) -> CellResult:
        self.events.append(f"run {task.cell_id}")
        return CellResult(rows=[], summary={}, peak_memory_bytes=None)


def _task(cell: str, model: str = "m1") -> CellTask:
    return CellTask(cell_id=cell, model_id=model, dtype="float32", attn_implementation="sdpa", revision=None,
                    policy="full", policy_params={}, budget=None, chunk_size=32, task="needle", length=256,
                    samples=1, seed=0)


def test_a_fresh_model_is_warmed_up_once_before_its_first_cell():
    pytest.importorskip("torch")
    load = _TorchWorkload()
    worker = CellWorker(load, "w0")
    for cell, model in (("c1", "m1"), ("c2", "m1"), ("c3", "m2")):
        assert worker.run_cell(_task(cell, model)).ok
    warm = "forward (1, 8) use_cache=False"
    assert load.events == ["load m1", warm, "run c1", "run c2", "load m2", warm, "run c3"]


def test_stub_models_need_no_warm_up():
    import ray

    was = ray.is_initialized()
    worker = CellWorker(StubWorkload(), "w0")
    assert ray.is_initialized() == was  # a worker made outside Ray starts none (it auto-started one before)
    out = worker.run_cell(CellTask(cell_id="c", model_id="stub:0", dtype="float32", attn_implementation="sdpa",
                                   revision=None, policy="full", policy_params={}, budget=None, chunk_size=32,
                                   task="needle", length=256, samples=1, seed=0))
    assert out.ok and worker.model_loads == 1


def _batched(ttft: list[float], size: int | None):
    """Rows timed ``size`` at a time: each batch's rows carry the batch's TTFT (and, unless ``size`` is None
    — files written before rows named their batch — its ``timing_batch``)."""
    def extra(i: int) -> dict:
        b = i // (size or 4)
        return {"ttft_s": ttft[b], "timing_batch": None if size is None else b}
    return extra


def test_rows_of_one_batch_count_as_one_ttft_timing(store):
    """A 4-sample cell run as one batch has one TTFT measurement: no CI, marked too noisy (it used to read
    ``0.729 [0.729, 0.729]``, four copies of one timing taken for four samples)."""
    idx, res = store
    store_run(idx, res, "r1", [
        FakeCell("full", None, rows=rows([1.0] * 4, extra=_batched([0.4], None))),
        FakeCell("keydiff", 256, rows=rows([1.0] * 4, extra=_batched([0.2916], None))),
        FakeCell("full", None, task="phonebook", length=512,
                 rows=rows([1.0] * 8, task="phonebook", length=512, extra=_batched([0.4, 0.5], 4))),
        FakeCell("keydiff", 256, task="phonebook", length=512,   # two batches, each 0.5x its reference's
                 rows=rows([1.0] * 8, task="phonebook", length=512, extra=_batched([0.2, 0.25], 4))),
        FakeCell("sink", 256, task="phonebook", length=512,     # batched in 2s: timings resampled apart
                 rows=rows([1.0] * 8, task="phonebook", length=512, extra=_batched([0.2, 0.21, 0.22, 0.23], 2))),
    ])
    rep = build_report(idx, ["r1"], ReportOptions(resamples=500, seed=0))
    perf = {(p.policy, p.task.split("@")[0]): p for p in rep.perf}
    one = perf[("keydiff", "needle")]
    assert one.ttft_ratio == pytest.approx(0.729) and one.n_paired == 4
    assert one.speed_note == f"{TOO_NOISY} (TTFT: 1 batch timing)"
    two = perf[("keydiff", "phonebook")]
    assert (two.ttft_ratio, two.ttft_ratio_low, two.ttft_ratio_high) == (0.5, 0.5, 0.5) and two.speed_note == ""
    assert two.ttft_median_s == pytest.approx(0.225)  # the median of 2 timings, not of 8 copies
    apart = perf[("sink", "phonebook")]
    assert apart.ttft_ratio == pytest.approx(0.215 / 0.45)
    assert apart.ttft_ratio_low < apart.ttft_ratio_high  # 4 vs 2 timings, each side resampled


def _shared_after(timed: int):
    """Rows of a cell run in a group: the first ``timed`` samples timed alone, the others without a TTFT."""
    return lambda i: {"ttft_s": 0.5 if i < timed else None, "execution": "alone" if i < timed else "shared"}


def test_which_samples_were_timed_is_said_per_cell_or_once_for_all(store):
    from kdeval.jobs.reports.render.views import speed_view

    idx, res = store
    note = "TTFT of 1/4 samples, timed alone (the others ran with shared steps)"
    store_run(idx, res, "same", [FakeCell("full", None, rows=rows([1.0] * 4, extra=_shared_after(1))),
                                 FakeCell("keydiff", 256, rows=rows([1.0] * 4, extra=_shared_after(1)))])
    view = speed_view(build_report(idx, ["same"], ReportOptions(resamples=0)))
    assert view.title.endswith(f"; every cell: {note}") and not any(note in r[-1] for r in view.rows)

    store_run(idx, res, "mixed", [FakeCell("full", None, rows=rows([1.0] * 4), model="m2"),
                                  FakeCell("keydiff", 256, rows=rows([1.0] * 4, extra=_shared_after(1)), model="m2")])
    view = speed_view(build_report(idx, ["mixed"], ReportOptions(resamples=0)))
    notes = {raw.policy: r[-1] for r, raw in zip(view.rows, view.raw)}
    assert note not in view.title and note in notes["keydiff"] and note not in notes["full"]


def test_a_note_most_cells_share_is_numbered_and_said_once_under_the_table(store):
    """Three shared cells and one run alone (a head pool never shares): the shared cells' timing note is "[1]" in
    their rows and said whole in the caption; the alone cell has none."""
    from kdeval.jobs.reports.render.views import speed_view

    idx, res = store
    note = "TTFT of 1/4 samples, timed alone (the others ran with shared steps)"
    store_run(idx, res, "most", [FakeCell(p, b, rows=rows([1.0] * 4, extra=_shared_after(1)))
                                 for p, b in (("full", None), ("keydiff", 256), ("snapkv", 256))]
              + [FakeCell("ada", 256, rows=rows([1.0] * 4))])
    view = speed_view(build_report(idx, ["most"], ReportOptions(resamples=0)))
    notes = {raw.policy: r[-1] for r, raw in zip(view.rows, view.raw)}
    assert notes["keydiff"] == notes["snapkv"] == "[1]" and notes["full"] == "reference; [1]", notes
    assert notes["ada"] == "" and f"[1] {note}" in view.caption and note not in view.title


def test_a_cell_decoded_in_batches_says_which_samples_its_decode_speed_comes_from(store):
    from kdeval.jobs.reports.render.views import speed_view

    idx, res = store

    def batched(i):
        return {**_shared_after(2)(i), "decode_s": 0.3 if i < 2 else None}

    store_run(idx, res, "dec", [FakeCell("full", None, rows=rows([1.0] * 4)),
                                FakeCell("keydiff", 256, rows=rows([1.0] * 4, extra=batched))])
    view = speed_view(build_report(idx, ["dec"], ReportOptions(resamples=0)))
    notes = {raw.policy: r[-1] for r, raw in zip(view.rows, view.raw)}
    assert ("TTFT of 2/4 and decode speed of 2/4 samples, timed alone (the others ran with shared steps, decoded "
            "in a batch with other cells)") in notes["keydiff"]


def test_a_repeat_pass_is_said_beside_the_ttft_it_is_part_of(store):
    """KVzip's rows count the repeat pass's extra forward tokens; the speed table says what its TTFT holds (the
    median over the rows that count them), and says nothing for cells without one."""
    from kdeval.jobs.reports.render.views import speed_view

    idx, res = store
    repeat = lambda i: {"ttft_s": 0.9, "extra_forward_tokens": [1880, 1900, 1884][i]}  # noqa: E731
    store_run(idx, res, "kvz", [FakeCell("full", None, rows=rows([1.0] * 3)),
                                FakeCell("kvzip", 256, rows=rows([1.0] * 3, extra=repeat)),
                                FakeCell("keydiff", 256, rows=rows([1.0] * 3, extra=lambda i: {
                                    "extra_forward_tokens": 0}))])
    view = speed_view(build_report(idx, ["kvz"], ReportOptions(resamples=0)))
    notes = {raw.policy: r[-1] for r, raw in zip(view.rows, view.raw)}
    assert "TTFT includes 1,884 extra forward tokens a sample (median, from a repeat pass)" in notes["kvzip"]
    assert "extra forward" not in notes["keydiff"] + notes["full"] + view.title
