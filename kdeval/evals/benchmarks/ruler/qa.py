"""RULER's QA tasks: qa_1 (SQuAD v2 dev) and qa_2 (HotpotQA dev, distractor) with distractor documents.

Data: the official files RULER downloads, ``<data dir>/ruler/squad.json`` (SQuAD v2.0 dev JSON)
and ``<data dir>/ruler/hotpotqa.json`` (``hotpot_dev_distractor_v1.json``), or with
``source="hub"`` the hub datasets ``rajpurkar/squad_v2`` / ``hotpotqa/hotpot_qa`` (distractor).
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass

from kdeval.evals.benchmarks.ruler.generators import Generated
from kdeval.evals.benchmarks.ruler.templates import DOCUMENT_PROMPT, TASKS
from kdeval.evals.tasks.base import TaskUnavailableError
from kdeval.evals.tasks.data import find_data_file, resolve_data_dir
from kdeval.evals.tasks.hub import hub_rows
from kdeval.evals.tasks.prompting import split_at_context

LOCAL_FILES = {"squad": "ruler/squad.json", "hotpotqa": "ruler/hotpotqa.json"}
HUB_IDS = {"squad": "rajpurkar/squad_v2", "hotpotqa": "hotpotqa/hotpot_qa"}
_HOW = {
    "squad": "RULER's qa_1 uses the SQuAD v2.0 dev set (dev-v2.0.json); save it as <data dir>/ruler/squad.json or set the task's `params: {source: hub}` when online",
    "hotpotqa": "RULER's qa_2 uses HotpotQA dev distractor (hotpot_dev_distractor_v1.json); save it as <data dir>/ruler/hotpotqa.json or set the task's `params: {source: hub}` when online",
}


@dataclass
class QAPool:
    """Questions (query, answers, gold document ids, same-article document ids) and all documents."""

    qas: list[dict]
    docs: list[str]


def _pool(qas_raw: list[tuple[str, list[str], list[str], list[str]]]) -> QAPool:
    docs = sorted({d for _, _, gold, more in qas_raw for d in gold + more})
    index = {d: i for i, d in enumerate(docs)}
    qas = [{"query": q, "outputs": a, "context": [index[d] for d in gold],
            "more_context": [index[d] for d in more if d not in gold]} for q, a, gold, more in qas_raw]
    return QAPool(qas, docs)


def _squad_official(data: dict) -> QAPool:
    raw = []
    for art in data["data"]:
        paragraphs = [p["context"] for p in art["paragraphs"]]
        for p in art["paragraphs"]:
            for qa in p["qas"]:
                if not qa.get("is_impossible", False):
                    raw.append((qa["question"], [a["text"] for a in qa["answers"]], [p["context"]], paragraphs))
    return _pool(raw)


def _hotpot_official(data: list) -> QAPool:
    raw = []
    for d in data:
        docs = [f"{t}\n{''.join(p)}" for t, p in d["context"]]
        raw.append((d["question"], [d["answer"]], docs, []))
    return _pool(raw)


def load_pool(dataset: str, data_dir: str | None, source: str) -> QAPool:
    """The question pool of ``dataset`` (``squad`` or ``hotpotqa``) from the data dir or the hub."""
    what = f"ruler {'qa_1' if dataset == 'squad' else 'qa_2'} skipped"
    if source == "local":
        path = find_data_file(data_dir, LOCAL_FILES[dataset])
        if path is None:
            root = resolve_data_dir(data_dir)
            raise TaskUnavailableError(f"{what}: {root or '<data dir>'}/{LOCAL_FILES[dataset]} not found. {_HOW[dataset]}.")
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return _squad_official(data) if dataset == "squad" else _hotpot_official(data)
    if dataset == "squad":
        rows = hub_rows(HUB_IDS["squad"], None, "validation", what)
        by_title: dict[str, list[str]] = {}
        for r in rows:
            by_title.setdefault(r["title"], [])
            if r["context"] not in by_title[r["title"]]:
                by_title[r["title"]].append(r["context"])
        raw = [(r["question"], list(r["answers"]["text"]), [r["context"]], by_title[r["title"]])
               for r in rows if r["answers"]["text"]]
        return _pool(raw)
    rows = hub_rows(HUB_IDS["hotpotqa"], "distractor", "validation", what)
    raw = [(r["question"], [r["answer"]], [f"{t}\n{''.join(s)}" for t, s in zip(r["context"]["title"], r["context"]["sentences"])], [])
           for r in rows]
    return _pool(raw)


def make_qa(rng: random.Random, n: int, pool: QAPool, index: int) -> Generated:
    """Question ``index`` with its gold documents among ``n`` documents in total."""
    qa = pool.qas[index % len(pool.qas)]
    gold, more = list(qa["context"]), list(qa["more_context"])
    if n < len(pool.docs):
        if n - len(gold) > len(more):
            others = [i for i in range(len(pool.docs)) if i not in set(gold + more)]
            chosen = gold + more + rng.sample(others, max(0, n - len(gold) - len(more)))
        else:
            chosen = gold + rng.sample(more, max(0, n - len(gold)))
        docs = [pool.docs[i] for i in chosen]
    else:
        docs = (pool.docs * -(-n // len(pool.docs)))[:n]
    rng.shuffle(docs)
    context = "\n\n".join(DOCUMENT_PROMPT.format(i=i + 1, document=d) for i, d in enumerate(docs))
    t = TASKS["qa"]
    prefix, suffix = split_at_context(t["template"], context, query=qa["query"])
    return Generated(prefix, suffix, t["answer_prefix"], list(qa["outputs"]))
