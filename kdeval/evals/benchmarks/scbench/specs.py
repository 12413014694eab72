"""SCBench's tasks as kdeval runs them: each task's prompt templates, turn fields, generation length and score
(facts from microsoft/MInference ``scbench/eval_utils.py`` and ``compute_scores.py``).

Templates: ``multiturn_templates`` for the first turn (the task's instruction, the context, the first
question) and ``multiturn_follow_up_templates_in_chat_tempate`` for the later turns (the question alone;
``Question: ...`` for QA and choice, ``问题：...`` for Chinese QA, ``What is ...?`` and the question for math
find). Lengths: ``DATA_NAME_TO_MAX_NEW_TOKENS`` (the mixed tasks: one per sub-task). Scores:
:mod:`kdeval.evals.benchmarks.scbench.metrics`, :mod:`kdeval.evals.benchmarks.scbench.repoqa`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from kdeval.evals.benchmarks.scbench.metrics import any_upper_match, math_find, qa_f1_chars, rouge_lsum, share_match
from kdeval.evals.benchmarks.scbench.metrics import substring_match
from kdeval.evals.benchmarks.scbench.repoqa import FUNCTION_QUERY, repoqa_score
from kdeval.evals.metrics.infinitebench import choice_match, digits_match

_KV = "Extract the value corresponding to the specified key in the JSON object below.\n\n{context}"
_PASSKEY = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz "
            "you about the important information.\n\n{context}")
_QA = "Read the book and answer the question. Be very concise in your answer.\n\n{context}"
_QA_CHN = "阅读以下书籍然后回答问题。\n\n{context}"
_CHOICE = "Read the book and answer the question.\n\n{context}"
_REPOQA = ("Based on the function description and code context, please retrieve and repeat the exact described "
           "function from the code context in a code block wrapped by ```:\n\n{context}")
_QUESTION = "Question: {input}\nAnswer:"
_QUESTION_CHN = "问题：{input}\n答案："
#: SCBench's first-turn template, spelling kept ("The the")
_OPTIONS = "Question: {input}\nA. {a}\nB. {b}\nC. {c}\nD. {d}\n\nThe the correct answer is"
#: math find's target ("the largest number of the list") in a question "... The largest number of the list is"
_TARGET = re.compile(r"The .+ is")

Turn = Mapping[str, Any]


def _plain(turn: Turn) -> str:
    return str(turn["input"])


def _qa(turn: Turn) -> str:
    return _QUESTION.format(input=turn["input"])


def _qa_chn(turn: Turn) -> str:
    return _QUESTION_CHN.format(input=turn["input"])


def _choice(turn: Turn) -> str:
    a, b, c, d = (str(o) for o in turn["options"])
    return _OPTIONS.format(input=turn["input"], a=a, b=b, c=c, d=d)


def mf_prefix(turn: Turn) -> str:
    """Math find's ``What is <target>?`` (SCBench: the first ``The ... is`` of the question, lower-cased, less
    its `` is``)."""
    return f"What is {_TARGET.findall(str(turn['input']))[0].lower()[:-3]}?"


def _mf_followup(turn: Turn) -> str:
    return f"{mf_prefix(turn)}\n\n{turn['input']}"


def labels(value: Any) -> list[str]:
    """A turn's answer as reference strings (one string, or a list's items)."""
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _choice_labels(turn: Turn) -> list[str]:
    """The answer's text and its letter (what InfiniteBench's En.MC metric matches against)."""
    refs = labels(turn["answer"])
    letters = [("ABCD"[turn["options"].index(x)]) for x in refs if x in turn["options"]]
    return refs + [x for x in letters if x not in refs]


def _options_problem(turn: Turn) -> str | None:
    if not isinstance(turn["options"], list) or len(turn["options"]) != 4:
        return "options: expected a list of 4 options"
    return None


def _mf_problem(turn: Turn) -> str | None:
    if not _TARGET.search(str(turn["input"])):
        return "input: expected a math-find question naming its target as 'The ... is'"
    try:
        float(labels(turn["answer"])[0])
    except ValueError:
        return f"answer: expected a number (an int or a float), got {turn['answer']!r}"
    return None


def _score_repoqa(prediction: str, refs: list[str], meta: Mapping[str, Any]) -> float:
    return repoqa_score(prediction, str(meta["func_name"]), [tuple(n) for n in meta["needles"]], str(meta["lang"]))


def _score_passkey(prediction: str, refs: list[str], meta: Mapping[str, Any]) -> float:
    return float(digits_match(prediction, refs[0]))


def _score_summary(prediction: str, refs: list[str], meta: Mapping[str, Any]) -> float:
    return max(rouge_lsum(prediction, r) for r in refs)  # evaluate's rouge keeps the best of several references


def _by(scores: Mapping[str, Callable]) -> Callable[[str, list[str], Mapping[str, Any]], float]:
    """A mixed task's score: the turn's own sub-task's (``meta["subtask"]``)."""
    return lambda prediction, refs, meta: scores[meta["subtask"]](prediction, refs, meta)


def _refs(fn: Callable[[str, list[str]], Any]) -> Callable[[str, list[str], Mapping[str, Any]], float]:
    return lambda prediction, refs, meta: float(fn(prediction, refs))


@dataclass(frozen=True)
class Spec:
    """One SCBench task.

    Attributes:
        head: what precedes the first question (``{context}``; math find also ``{prefix}``, ``What is ...?``).
        question: turn 1's question; ``followup``: a later turn's (default: ``question``'s).
        score: ``(prediction, references, meta) -> [0, 1]``.
        max_new: generation length; the mixed tasks: one per sub-task (a turn's ``task`` field).
        fields: the fields every turn has; ``sample_fields``: the fields every line has besides ``context``.
        problem: what is wrong with a turn beyond missing fields (None: nothing).
        references: a turn's reference answers.
        metric: the score's name in the task listing.
    """

    head: str
    question: Callable[[Turn], str]
    score: Callable[[str, list[str], Mapping[str, Any]], float]
    max_new: int | Mapping[str, int]
    metric: str
    fields: tuple[str, ...] = ("input", "answer")
    sample_fields: tuple[str, ...] = ()
    followup: Callable[[Turn], str] | None = None
    problem: Callable[[Turn], str | None] = lambda turn: None
    references: Callable[[Turn], list[str]] = lambda turn: labels(turn["answer"])

    @property
    def code(self) -> bool:
        """Lines of a repository's code (``repo``, ``lang``) whose turns ask for its functions (repoqa)."""
        return "lang" in self.sample_fields

    @property
    def mixed(self) -> bool:
        """Turns of several sub-tasks, each scored and sized by its own."""
        return not isinstance(self.max_new, int)

    def turn_question(self, turn: Turn, first: bool) -> str:
        return (self.question if first or self.followup is None else self.followup)(turn)


_SUMMARY_SCORES = {"scbench_summary": _score_summary, "scbench_passkey": _score_passkey}
_REPOQA_KV_SCORES = {"scbench_repoqa": _score_repoqa, "scbench_kv": _refs(substring_match)}

#: task -> its spec (scbench_<task>.jsonl)
TASKS: dict[str, Spec] = {
    "kv": Spec(_KV, _plain, _refs(substring_match), 150, "substring_match"),
    "prefix_suffix": Spec("{context}", _plain, _refs(substring_match), 150, "substring_match"),
    "vt": Spec("{context}", _plain, _refs(share_match), 30, "share_match"),
    "passkey": Spec(_PASSKEY, _plain, _score_passkey, 15, "first_int_match"),
    "qa_eng": Spec(_QA, _qa, _refs(any_upper_match), 40, "any_upper_match"),
    "qa_chn": Spec(_QA_CHN, _qa_chn, _refs(qa_f1_chars), 40, "qa_f1_chars"),
    "many_shot": Spec("{context}", _plain, _refs(any_upper_match), 10, "any_upper_match"),
    "choice_eng": Spec(_CHOICE, _choice, _refs(choice_match), 40, "choice_match (letter or option text)",
                       fields=("input", "answer", "options"), problem=_options_problem, references=_choice_labels),
    "mf": Spec("{prefix}\n\n{context}", _plain, lambda p, refs, meta: math_find(p, refs[0]), 5,
               "math_find", followup=_mf_followup, problem=_mf_problem),
    "summary": Spec("{context}", _plain, _score_summary, 200, "rouge_lsum"),
    "repoqa": Spec(_REPOQA, _plain, _score_repoqa, 1024, "repoqa_bleu_match",
                   fields=("input", "answer", "name"), sample_fields=("repo", "lang")),
    "summary_with_needles": Spec("{context}", _plain, _by(_SUMMARY_SCORES),
                                 {"scbench_summary": 800, "scbench_passkey": 15},
                                 "rouge_lsum | first_int_match by sub-task", fields=("input", "answer", "task")),
    "repoqa_and_kv": Spec("{context}", _plain, _by(_REPOQA_KV_SCORES), {"scbench_repoqa": 1024, "scbench_kv": 80},
                          "repoqa_bleu_match | substring_match by sub-task", fields=("input", "answer", "task"),
                          sample_fields=("repo", "lang")),
}

#: the languages a repoqa line's ``lang`` may name
LANGUAGES = tuple(FUNCTION_QUERY)
