"""LongBench v1: the 21 tasks with their official prompts, generation lengths and metrics.

Data: ``<data dir>/longbench/<task>.jsonl`` (or ``<data dir>/longbench/data/<task>.jsonl``, the
layout of the official ``data.zip``), or, with ``source="hub"``, the official ``data.zip`` of the
hub dataset ``THUDM/LongBench``. Rows: ``input, context, answers, length, dataset, language,
all_classes, _id``.
"""
from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from kdeval.evals.metrics.longbench import DATASET2METRIC, classification_score, score_sample
from kdeval.evals.tasks.base import DataNotFoundError, EvalError, Sample, ScoreResult, Task, check_choice, check_positive
from kdeval.evals.tasks.data import find_data_file, read_jsonl, resolve_data_dir
from kdeval.evals.tasks.hub import hub_file
from kdeval.evals.tasks.prompting import split_at_context

#: official config/dataset2prompt.json (LongBench v1), verbatim
DATASET2PROMPT: dict[str, str] = {
    "narrativeqa": "You are given a story, which can be either a novel or a movie script, and a question. Answer the question asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\nStory: {context}\n\nNow, answer the question based on the story asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:",
    "qasper": 'You are given a scientific article and a question. Answer the question as concisely as you can, using a single phrase or sentence if possible. If the question cannot be answered based on the information in the article, write "unanswerable". If the question is a yes/no question, answer "yes", "no", or "unanswerable". Do not provide any explanation.\n\nArticle: {context}\n\n Answer the question based on the above article as concisely as you can, using a single phrase or sentence if possible. If the question cannot be answered based on the information in the article, write "unanswerable". If the question is a yes/no question, answer "yes", "no", or "unanswerable". Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:',
    "multifieldqa_en": "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following question based on the above text, only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:",
    "multifieldqa_zh": "阅读以下文字并用中文简短回答：\n\n{context}\n\n现在请基于上面的文章回答下面的问题，只告诉我答案，不要输出任何其他字词。\n\n问题：{input}\n回答：",
    "hotpotqa": "Answer the question based on the given passages. Only give me the answer and do not output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:",
    "2wikimqa": "Answer the question based on the given passages. Only give me the answer and do not output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:",
    "musique": "Answer the question based on the given passages. Only give me the answer and do not output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:",
    "dureader": "请基于给定的文章回答下述问题。\n\n文章：{context}\n\n请基于上述文章回答下面的问题。\n\n问题：{input}\n回答：",
    "gov_report": "You are given a report by a government agency. Write a one-page summary of the report.\n\nReport:\n{context}\n\nNow, write a one-page summary of the report.\n\nSummary:",
    "qmsum": "You are given a meeting transcript and a query containing a question or instruction. Answer the query in one or more sentences.\n\nTranscript:\n{context}\n\nNow, answer the query based on the above meeting transcript in one or more sentences.\n\nQuery: {input}\nAnswer:",
    "multi_news": "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{context}\n\nNow, write a one-page summary of all the news.\n\nSummary:",
    "vcsum": "下面有一段会议记录，请你阅读后，写一段总结，总结会议的内容。\n会议记录：\n{context}\n\n会议总结：",
    "trec": "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n{input}",
    "triviaqa": "Answer the question based on the given passage. Only give me the answer and do not output any other words. The following are some examples.\n\n{context}\n\n{input}",
    "samsum": "Summarize the dialogue into a few short sentences. The following are some examples.\n\n{context}\n\n{input}",
    "lsht": "请判断给定新闻的类别，下面是一些例子。\n\n{context}\n{input}",
    "passage_count": "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please carefully read these paragraphs and determine how many unique paragraphs there are after removing duplicates. In other words, how many non-repeating paragraphs are there in total?\n\n{context}\n\nPlease enter the final count of unique paragraphs after removing duplicates. The output format should only contain the number, such as 1, 2, 3, and so on.\n\nThe final answer is: ",
    "passage_retrieval_en": 'Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which paragraph the abstract is from.\n\n{context}\n\nThe following is an abstract.\n\n{input}\n\nPlease enter the number of the paragraph that the abstract is from. The answer format must be like "Paragraph 1", "Paragraph 2", etc.\n\nThe answer is: ',
    "passage_retrieval_zh": '以下是若干段落文字，以及其中一个段落的摘要。请确定给定的摘要出自哪一段。\n\n{context}\n\n下面是一个摘要\n\n{input}\n\n请输入摘要所属段落的编号。答案格式必须是"段落1"，"段落2"等格式\n\n答案是：',
    "lcc": "Please complete the code given below. \n{context}Next line of code:\n",
    "repobench-p": "Please complete the code given below. \n{context}{input}Next line of code:\n",
}

#: official config/dataset2maxlen.json (LongBench v1)
DATASET2MAXLEN: dict[str, int] = {
    "narrativeqa": 128, "qasper": 128, "multifieldqa_en": 64, "multifieldqa_zh": 64,
    "hotpotqa": 32, "2wikimqa": 32, "musique": 32, "dureader": 128,
    "gov_report": 512, "qmsum": 512, "multi_news": 512, "vcsum": 512,
    "trec": 64, "triviaqa": 32, "samsum": 128, "lsht": 64,
    "passage_count": 32, "passage_retrieval_en": 32, "passage_retrieval_zh": 32,
    "lcc": 64, "repobench-p": 64,
}

#: tasks the official pred.py runs without the chat template (few-shot / code completion)
NO_CHAT_TASKS = frozenset({"trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"})

LONGBENCH_TASKS: tuple[str, ...] = tuple(DATASET2PROMPT)

_HOW_TO_GET = (
    "Get LongBench v1's data.zip from the hub dataset THUDM/LongBench and unpack its data/<task>.jsonl "
    "files into <data dir>/longbench/, or set the task's `params: {source: hub}` to download it when online."
)


def render_prompt(dataset: str, context: str, input_: str) -> tuple[str, str]:
    """The official prompt of ``dataset`` split into (prefix ending with the context, suffix)."""
    return split_at_context(DATASET2PROMPT[dataset], context, input=input_)


@dataclass
class LongBenchTask(Task):
    """One LongBench v1 task (headline: :meth:`Task.aggregate`, ``round(100 * mean, 2)`` as the official scorer).

    Args:
        subset: the LongBench dataset name (``hotpotqa``, ``lcc``...).
        data_dir: data directory (else ``$KDEVAL_DATA_DIR``).
        source: ``"local"`` (JSONL files in the data directory) or ``"hub"`` (download data.zip).
        limit: keep only the first ``limit`` samples.
    """

    subset: str
    data_dir: str | None = None
    source: str = "local"
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.subset not in DATASET2PROMPT:
            raise EvalError(f"subset: unknown LongBench task {self.subset!r}; expected one of {', '.join(LONGBENCH_TASKS)}")
        check_choice("source", self.source, ("local", "hub"))
        check_positive("limit", self.limit, allow_none=True)
        self.name = f"longbench.{self.subset}"
        if self.source == "local":
            self._local_path()  # fail before any model loads

    def _local_path(self) -> Path:
        for rel in (f"longbench/{self.subset}.jsonl", f"longbench/data/{self.subset}.jsonl"):
            path = find_data_file(self.data_dir, rel)
            if path is not None:
                return path
        root = resolve_data_dir(self.data_dir)
        where = f"{root}/longbench/{self.subset}.jsonl" if root else f"<data dir>/longbench/{self.subset}.jsonl (no data directory: set KDEVAL_DATA_DIR)"
        raise DataNotFoundError(f"LongBench data file not found: {where}. {_HOW_TO_GET}")

    def _rows(self) -> list[dict[str, Any]]:
        if self.source == "local":
            return list(read_jsonl(self._local_path()))
        zpath = hub_file("THUDM/LongBench", "data.zip", f"task {self.name}")
        with zipfile.ZipFile(zpath) as zf:
            member = f"data/{self.subset}.jsonl"
            if member not in zf.namelist():
                raise DataNotFoundError(f"{zpath} has no member {member}")
            return [json.loads(line) for line in zf.read(member).decode("utf-8").splitlines() if line.strip()]

    def generation_length(self) -> int:
        return DATASET2MAXLEN[self.subset]

    def sample_ids(self) -> list[str] | None:
        return None if self.source == "hub" else super().sample_ids()

    def data_files(self) -> list[tuple[str, Any]]:
        if self.source == "hub":
            return []
        path = self._local_path()
        return [(f"longbench/{path.name}", path)]

    def data_source(self) -> str:
        return "hub THUDM/LongBench (data.zip)" if self.source == "hub" else f"longbench/{self.subset}.jsonl"

    def samples(self, builder: Any = None) -> list[Sample]:
        """Samples in file order, each with the official prompt split at the context."""
        rows = self._rows()
        if self.limit is not None:
            rows = rows[: self.limit]
        out = []
        for i, row in enumerate(rows):
            for key in ("context", "input", "answers"):
                if key not in row:
                    raise DataNotFoundError(f"{self.name}: row {i} has no field {key!r} (expected LongBench JSONL rows)")
            prefix, suffix = render_prompt(self.subset, row["context"], row["input"] or "")
            out.append(Sample(
                id=f"{self.name}/{row.get('_id') or i}",
                prefix=prefix,
                suffix=suffix,
                references=tuple(row["answers"]),
                max_new_tokens=DATASET2MAXLEN[self.subset],
                use_chat_template=self.subset not in NO_CHAT_TASKS,
                meta={"all_classes": row.get("all_classes"), "length": row.get("length")},
            ))
        return out

    def score(self, prediction: str, references: Sequence[str], meta: Mapping[str, Any]) -> ScoreResult:
        """The official per-sample score (first-line rule, max over references)."""
        all_classes = meta.get("all_classes")
        if DATASET2METRIC[self.subset] is classification_score and not all_classes:
            raise EvalError(f"{self.name}: field 'all_classes' is required (a list of class names)")
        return ScoreResult(score=score_sample(self.subset, prediction, list(references), all_classes))
