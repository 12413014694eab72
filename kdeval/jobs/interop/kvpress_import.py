"""``kdeval import kvpress DIR``: a kvpress evaluation result as an external run of the index.

``DIR`` is one kvpress result directory (``predictions.csv``, ``metrics.json``, ``config.yaml``, as kvpress's
``evaluation/evaluate.py`` writes them) or a directory of them. Each directory × ``task`` value becomes a done
cell of one new run whose grid text says ``external: {computed_by: kvpress, ...}`` and whose cells record
``computed_by: kvpress`` in their spec and provenance, so reports and ``kdeval ls`` tell it from kdeval's own.

A cell sits where the kdeval cell of the same experiment sits, so ``kdeval report RUN --compare IMPORTED``
pairs them: the model (kvpress's model id, or ``--model``), the policy of the press (``no_press`` -> ``full``;
a press kdeval lacks keeps its kvpress name as ``kvpress:<press>``), the budget as the share ``1 − ratio``,
chunk size ``whole`` (kvpress compresses once), protocol ``{compress: context or prompt (query_aware),
decode: keep}`` (kvpress does not evict while decoding), the task instance (RULER: ``ruler.<task>@<data_dir>#s0``).
Sample ``i`` of a RULER task gets the id of the ``i``-th row of that task in kvpress's set
(:mod:`kdeval.evals.benchmarks.ruler.kvpress_set`), so a kdeval run on that set (``params: {source: kvpress}``) pairs by
sample; a LongBench row keeps LongBench's ``_id`` (kvpress's set is LongBench's rows), so a kdeval LongBench run
pairs with it as it is; kvpress runs on a ``fraction`` of the RULER set shuffle it, so their rows keep
unpairable ids. Per-sample
scores are kdeval's metric of the task on kvpress's predictions (RULER's string match is kvpress's), and each
cell's summary keeps kvpress's own ``metrics.json``.
"""
from __future__ import annotations

import ast
import hashlib
import json
import math
import re
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from kdeval.evals.benchmarks.ruler.kvpress_set import sample_id
from kdeval.evals.task_run.budget import budget_share, budget_tokens, parse_budget
from kdeval.evals.task_run.chunking import WHOLE, chunk_code
from kdeval.jobs.grid.cells import TaskRef
from kdeval.jobs.interop import kvpress_format as kv
from kdeval.jobs.run.recovery import imported_metadata, remove_manifest, write_manifest
from kdeval.shown import first_hidden
from kdeval.untrusted import UntrustedFileError, load_json, load_yaml, non_finite, read_head
from kdeval.storage import (
    CellRecord, CellState, RunIndex, RunState, cell_dir_relpath, part_relpath, with_identity, write_part,
)

COMPUTED_BY = "kvpress evaluation/evaluate.py"
_QUOTED = re.compile(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"")


@dataclass
class ImportedCell:
    """One cell to store: its spec (id = hash of it), rows and kvpress's metrics."""

    spec: dict[str, Any]
    rows: list[dict[str, Any]]
    metrics: Any

    @property
    def id(self) -> str:
        return hashlib.sha256(json.dumps(self.spec, sort_keys=True).encode()).hexdigest()[:24]


def result_dirs(root: str | Path) -> list[Path]:
    """``root`` when it holds kvpress's three files, else its subdirectories that do (sorted); ValueError naming
    ``DIR`` when there is none."""
    root = Path(root).expanduser().absolute()
    if not root.is_dir():
        raise ValueError(f"DIR: {root} is not a directory; expected a kvpress result directory (predictions.csv, "
                         f"metrics.json, config.yaml) or a directory of them")
    def holds(d: Path) -> bool:
        return all((d / f).exists() for f in kv.FILES)  # what is not a regular file: refused when read
    dirs = [root] if holds(root) else sorted(d for d in root.iterdir() if d.is_dir() and holds(d))
    if not dirs:
        raise ValueError(f"DIR: {root} holds no kvpress result: expected predictions.csv, metrics.json and "
                         f"config.yaml in it or in its subdirectories")
    for d in dirs:
        for f in kv.FILES:
            _inside(root, d / f)
    return dirs


def _inside(root: Path, path: Path) -> None:
    """ValueError when ``path`` (a symlink, or in a symlinked directory) resolves outside ``root``: an import
    reads what DIR holds, not what a link in it points at."""
    real, top = path.resolve(), root.resolve()
    if real != top and top not in real.parents:
        raise ValueError(f"DIR: {path} resolves to {real}, outside {root}: refusing to import a file from "
                         "outside DIR (copy it in instead of linking it)")


def parse_answer(value: Any) -> list[str]:
    """kvpress's ``answer`` cell as a list: a list's text (``['a', 'b']``), a numpy array's (``['a' 'b']``), or
    one plain answer."""
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    text = "" if value is None or (isinstance(value, float) and value != value) else str(value)
    if text.startswith("[") and text.endswith("]"):
        # each quoted item on its own: a numpy array's text has no commas, and Python would join its strings
        quoted = [m.group(0) for m in _QUOTED.finditer(text)]
        try:
            return [str(ast.literal_eval(q)) for q in quoted] if quoted else [text]
        except (ValueError, SyntaxError):
            return [q[1:-1] for q in quoted]
    return [text]


#: The most predictions one import reads (over all its directories): a grid's cells hold at most this many samples.
MAX_IMPORT_ROWS = 100_000
#: The largest ``predictions.csv`` read (checked before it is read): 100,000 rows of long predictions fit.
MAX_PREDICTIONS_BYTES = 256 << 20
#: The largest ``config.yaml`` or ``metrics.json`` read (kvpress writes a few kB).
MAX_CONFIG_BYTES = 1 << 20
#: The config fields that become names in the index, reports and status (checked for hidden characters).
_NAMED = ("dataset", "model", "press_name", "data_dir")


def _config(d: Path) -> dict[str, Any]:
    """``d``'s ``config.yaml``, read as untrusted input (:func:`kdeval.untrusted.load_yaml`: a regular file of
    at most :data:`MAX_CONFIG_BYTES`, no aliases, bounded nesting) and checked: kvpress's keys, names without
    hidden characters, a finite ``compression_ratio`` in [0, 1) and ``fraction`` in (0, 1]."""
    path = d / "config.yaml"
    try:
        cfg = load_yaml(path, MAX_CONFIG_BYTES)
    except UntrustedFileError as e:
        raise ValueError(f"DIR: {e}") from None
    if not isinstance(cfg, dict) or not all(k in cfg for k in ("dataset", "model", "press_name")):
        raise ValueError(f"DIR: {path} is not a kvpress evaluation config (expected dataset, model, "
                         f"press_name, compression_ratio)")
    for key in _NAMED:
        if not isinstance(cfg.get(key), (str, int, float, type(None))):
            raise ValueError(f"DIR: {path}: {key}: expected a name, got a {type(cfg[key]).__name__}")
        bad = first_hidden(str(cfg.get(key) or ""))
        if bad is not None:
            raise ValueError(f"DIR: {path}: {key} must not contain control, bidi or invisible "
                             f"characters (found '{bad}')")
    for key, low, high in (("compression_ratio", 0.0, 1.0), ("fraction", 0.0, 1.0)):
        value = cfg.get(key)
        ok = value is None or (type(value) in (int, float) and math.isfinite(value)
                               and (low <= value < high if key == "compression_ratio"
                                    else low < value <= high))
        if not ok:
            span = "from 0 up to (not including) 1" if key == "compression_ratio" else "above 0, at most 1"
            raise ValueError(f"DIR: {path}: {key}: expected a finite number {span}, got {_quoted(value)}")
    return cfg


def _quoted(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:60]}… ({len(text)} characters)"


def _metrics(d: Path) -> Any:
    """``d``'s ``metrics.json`` (untrusted: a regular file of at most :data:`MAX_CONFIG_BYTES`, bounded
    nesting, finite numbers), ValueError naming the file and the field."""
    path = d / "metrics.json"
    try:
        metrics = load_json(path, MAX_CONFIG_BYTES)
    except UntrustedFileError as e:
        raise ValueError(f"DIR: {e}") from None
    bad = non_finite(metrics)
    if bad is not None:
        raise ValueError(f"DIR: {path}: {bad[0] or 'the value'}: expected a finite number, got {bad[1]}")
    return metrics


class TooLarge(Exception):
    """A predictions file beyond the import's bounds (its message names the file, the size and the limit)."""


def _predictions(d: Path, room: int) -> pd.DataFrame:
    """``d``'s predictions.csv, refused (:class:`TooLarge` naming the file, its size and the limit) when it is larger
    than :data:`MAX_PREDICTIONS_BYTES` or holds more than ``room`` rows (what :data:`MAX_IMPORT_ROWS` leaves);
    no more than ``room + 1`` rows are ever parsed."""
    path = d / "predictions.csv"
    try:
        _, size = read_head(path, 1 << 62, 0)  # a regular file (a FIFO is refused, not waited on)
    except UntrustedFileError as e:
        raise TooLarge(f"DIR: {e}") from None
    if size > MAX_PREDICTIONS_BYTES:
        raise TooLarge(f"DIR: {path} is {size} bytes; at most {MAX_PREDICTIONS_BYTES} bytes "
                         f"({MAX_PREDICTIONS_BYTES >> 20} MiB) are imported")
    df = pd.read_csv(path, keep_default_na=False, nrows=room + 1)
    if len(df) > room:
        raise TooLarge(f"DIR: {path} holds more than {room} rows; an import takes at most {MAX_IMPORT_ROWS} "
                         f"predictions (as a grid's cells hold at most {MAX_IMPORT_ROWS} samples)")
    return df


def _budget(press: str, ratio: float) -> str | None:
    if press == "no_press" or ratio == 0:
        return None
    share = (Decimal(1) - Decimal(repr(float(ratio)))) * 100
    return parse_budget(f"{share.normalize():f}%")


def _score(task: str, prediction: str, refs: list[str], meta: dict[str, Any]) -> float:
    """kdeval's metric of ``task`` on one prediction (its task object built without reading any data)."""
    from kdeval.evals import get_task

    extra = {"verify_data": False} if task.startswith("ruler.") else {"source": "hub"} if task.startswith(
        "longbench.") else {}
    return float(get_task(task, **extra).score(prediction, refs, meta).score)


def _sample_id(dataset: str, data_dir: str, task: str, task_col: str, length: int | None, i: int,
               row: Any, fraction: float) -> str:
    """The id kdeval gives the same sample: RULER's ``i``-th row of the task in kvpress's set; LongBench's
    ``_id`` (kvpress's set keeps LongBench's rows and their ids); otherwise one kdeval has no twin for."""
    if dataset.startswith("longbench") and str(row.get("_id") or ""):
        return f"{task}/{row['_id']}"
    if fraction == 1.0 and dataset == "ruler":
        return sample_id(task_col, length, i)
    return f"kvpress/{dataset}/{data_dir}/{task_col}/{i}" + ("" if fraction == 1.0 else f"@fraction{fraction}")


def _row_ratio(d: Path, value: Any, row: int) -> float:
    """A row's ``compression_ratio`` as a finite number in [0, 1); ValueError naming file, row and column."""
    try:
        ratio = float(value or 0.0)
    except (TypeError, ValueError):
        ratio = math.nan
    if not (math.isfinite(ratio) and 0 <= ratio < 1):
        raise ValueError(f"DIR: {d / 'predictions.csv'}: row {row + 1}: compression_ratio: expected a finite "
                         f"number from 0 up to (not including) 1, got {_quoted(value)}")
    return ratio


def read_result(d: Path, model: str | None, seed: int, room: int = MAX_IMPORT_ROWS) -> list[ImportedCell]:
    """The cells of one kvpress result directory (one per ``task`` value), of at most ``room`` rows; ValueError
    naming the file."""
    cfg = _config(d)
    try:
        df = _predictions(d, room)
    except TooLarge as e:
        raise ValueError(str(e)) from None
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise ValueError(f"DIR: {d} has an unreadable predictions.csv ({type(e).__name__})") from None
    metrics = _metrics(d)
    answers = "answer" if "answer" in df.columns else "answers"  # RULER's column / LongBench's
    missing = {"predicted_answer", answers} - set(df.columns)
    if missing:
        raise ValueError(f"DIR: {d / 'predictions.csv'} lacks kvpress's columns {sorted(missing)}")
    dataset, data_dir = str(cfg["dataset"]), str(cfg.get("data_dir") or "")
    press, ratio = str(cfg["press_name"]), float(cfg.get("compression_ratio") or 0.0)
    policy = kv.POLICIES.get(press, f"kvpress:{press}")
    budget = _budget(press, ratio)
    fraction = float(cfg.get("fraction") or 1.0)
    protocol = {"compress": "prompt" if cfg.get("query_aware") else "context", "decode": "keep"}
    length = int(data_dir) if dataset == "ruler" and data_dir.isdigit() else None
    cells = []
    groups = df.groupby("task", sort=False) if "task" in df.columns else [(data_dir or dataset, df)]
    for task_col, part in groups:
        task = kv.task_of(dataset, str(task_col))
        rows = []
        for i, (row_no, r) in enumerate(part.iterrows()):
            refs = parse_answer(r[answers])
            pred = str(r["predicted_answer"])
            sid = _sample_id(dataset, data_dir, task, str(task_col), length, i, r, fraction)
            meta = {"all_classes": parse_answer(r["all_classes"])} if "all_classes" in r and r["all_classes"] else {}
            rows.append({"task": task, "id": sid, "prediction": pred, "references": refs,
                         "score": _score(task, pred, refs, meta),
                         "compression_ratio": _row_ratio(d, r.get("compression_ratio", ratio), int(row_no)),
                         "length": length, "meta_json": json.dumps({"kvpress_row": i}),
                         "peak_kv_bytes": None, "ttft_s": None})
        ref = TaskRef(name=task, length=length, samples=len(rows), seed=seed, data_source=f"kvpress {dataset}")
        free = budget is None
        spec = {"model": {"id": model or str(cfg["model"]), "dtype": str((cfg.get("model_kwargs") or {}).get(
                    "dtype", "auto"))},
                "policy": "full" if free else policy, "policy_params": {}, "budget": budget,
                "chunk_size": WHOLE, "task": ref.model_dump(mode="json"),
                "protocol": {"compress": "prompt", "decode": "evict"} if free else protocol,
                "kdeval_version": f"external:{COMPUTED_BY}",
                "external": {"computed_by": COMPUTED_BY, "source": str(d), "config": cfg, "fraction": fraction}}
        cells.append(ImportedCell(spec, rows, metrics.get(str(task_col), metrics) if isinstance(metrics, dict)
                                  else metrics))
    return cells


def read_import(root: str | Path, model: str | None = None, seed: int = 0) -> list[ImportedCell]:
    """Every kvpress result under ``root`` as cells (nothing written), at most :data:`MAX_IMPORT_ROWS` rows in
    all; ValueError naming ``DIR``."""
    cells: list[ImportedCell] = []
    for d in result_dirs(root):
        cells += read_result(d, model, seed, MAX_IMPORT_ROWS - sum(len(c.rows) for c in cells))
    return cells


def import_kvpress(index: RunIndex, root: str | Path, results_dir: str | Path, model: str | None = None,
                   seed: int = 0, cells: list[ImportedCell] | None = None) -> tuple[str, list[ImportedCell]]:
    """Read every kvpress result under ``root`` (all checked before anything is written; ``cells``: already
    read by :func:`read_import`), then record them as one done external run; returns (run id, its cells).

    All or nothing: every cell's Parquet part (which describes the cell, as a computed cell's does) and the
    run's manifest ``runs/<run>.json`` are written first, so ``index rebuild`` makes the run again from the
    results directory; a write that fails (a full disk) removes what this import wrote and raises OSError with
    the index untouched. Only then is the run recorded; a run an earlier import left unfinished is finished.
    ValueError naming ``DIR`` for a bad directory, or when the same results were imported already."""
    dirs = result_dirs(root)
    cells = read_import(root, model, seed) if cells is None else cells
    digest = hashlib.sha256("".join(sorted(c.id for c in cells)).encode()).hexdigest()[:12]
    run_id = f"kvpress-{digest}"
    before = index.get_run(run_id)
    if before is not None and before.state == RunState.DONE.value:
        raise ValueError(f"DIR: {Path(root).absolute()} is already imported as run {run_id}")
    name = f"kvpress import of {Path(root).name}"
    grid = yaml.safe_dump({"name": name, "external": {"computed_by": COMPUTED_BY, "source": str(Path(root).absolute()),
                                                      "results": [str(d) for d in dirs]}}, sort_keys=False)
    records = [CellRecord(id=c.id, spec=c.spec, model=c.spec["model"]["id"], policy=c.spec["policy"],
                          budget=budget_tokens(c.spec["budget"]), budget_share=budget_share(c.spec["budget"]),
                          chunk_size=chunk_code(WHOLE), task=TaskRef(**c.spec["task"]).label) for c in cells]
    where = str(Path(results_dir).expanduser().resolve())
    provenance = {"computed_by": COMPUTED_BY, "external": True, "source": str(root)}
    summaries = [{"kvpress_metrics": c.metrics, "score": sum(r["score"] for r in c.rows) / len(c.rows)}
                 for c in cells]
    _write_files(where, run_id, name, grid, digest, cells, records, summaries, provenance, seed)
    if before is None:
        index.create_run(run_id, name=name, grid_yaml=grid, grid_hash=digest, results_dir=where,
                         kdeval_version=f"external:{COMPUTED_BY}", cells=records)
    done = index.get_cells([c.id for c in cells], states=[CellState.DONE])
    for c, summary in zip(cells, summaries):
        if c.id in done:
            continue
        att = index.start_attempt(run_id, c.id, "import", None)
        index.finish_attempt_done(att, results_dir=where, result_path=cell_dir_relpath(c.id), n_rows=len(c.rows),
                                  summary=summary, duration_s=0.0, peak_memory_bytes=None, worker="import",
                                  node=None, provenance=provenance)
    index.set_run_state(run_id, RunState.DONE)
    return run_id, cells


def _write_files(where: str, run_id: str, name: str, grid: str, digest: str, cells: list[ImportedCell],
                 records: list[CellRecord], summaries: list[dict[str, Any]], provenance: dict[str, Any],
                 seed: int) -> None:
    """Every cell's one part and the run's manifest into ``where``; on any failure what was written is removed
    (parts this import made, not those it found) and the error raised."""
    made: list[Path] = []
    try:
        for c, rec, summary in zip(cells, records, summaries):
            identity = {"run_id": run_id, "cell_id": c.id, "model": rec.model, "policy": rec.policy, "params": "{}",
                        "budget": rec.budget, "budget_share": rec.budget_share, "chunk_size": rec.chunk_size,
                        "task": c.spec["task"]["name"], "length": c.spec["task"]["length"], "seed": seed,
                        "dtype": c.spec["model"]["dtype"],
                        "protocol": f"{c.spec['protocol']['compress']}/{c.spec['protocol']['decode']}"}
            cell_dir = Path(where) / cell_dir_relpath(c.id)
            new_dir = not cell_dir.exists()
            write_part(where, c.id, 0, with_identity(c.rows, identity),
                       metadata=imported_metadata(c.spec, summary, provenance))
            made.append(cell_dir if new_dir else Path(where) / part_relpath(c.id, 0))
        write_manifest(where, run_id, name=name, grid_yaml=grid, grid_hash=digest,
                       kdeval_version=f"external:{COMPUTED_BY}", created_at=datetime.now(timezone.utc), cells=records)
    except BaseException:
        for path in made:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        remove_manifest(where, run_id)
        raise
