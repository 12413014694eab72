"""SCBench's code-function retrieval score (``scbench/repo_qa_utils.py``, after evalplus/repoqa), re-implemented.

A turn asks the model to repeat one function of a repository's code, described in words. Its answer is scored
against every function asked about in that repository (the *needles*):

1. **sanitize**: the answer, stripped; if it holds fenced code blocks (```` ```lang ... ``` ````), the first
   function definition tree-sitter finds in the first block that has one, else the first block; with no block,
   the answer itself;
2. **similarity**: BLEU (nltk ``sentence_bleu``, smoothing ``method4``) of the sanitized answer against each
   needle, both split on whitespace;
3. **score**: 1 when the most similar needle (the first of equals; none when every similarity is 0) is the asked
   one and its similarity is at least 0.8 (SCBench reports pass@1 at threshold 0.8, which for one answer per
   question is this 0/1 mean).

Comments are kept (SCBench scores with ``ignore_comments=False``). Function definitions are found with the
``tree-sitter-languages`` grammars and SCBench's queries; languages: :data:`FUNCTION_QUERY`.
"""
from __future__ import annotations

import re
import warnings
from typing import Sequence

#: tree-sitter query of a function definition, by language (SCBench's)
FUNCTION_QUERY = {
    "python": "(function_definition name: (_)) @fdef",
    "java": "(method_declaration name: (_)) @fdef",
    "typescript": "(function_declaration name: (_)) @fdef",
    "rust": "(function_item name: (_)) @fdef",
    "cpp": "(function_definition declarator: (function_declarator declarator: (identifier))) @fdef",
    "go": "(function_declaration name: (_)) @fdef",
}
THRESHOLD = 0.8

_BLOCK = re.compile(r"^```(?:\w+)?\s*\n(.*?)(?=^```)```", re.DOTALL | re.MULTILINE)
_SPACE = re.compile(r"\s+")


def _first_function(block: str, lang: str) -> str | None:
    """The source of the first function definition tree-sitter finds in ``block`` (None: none, or no parse)."""
    with warnings.catch_warnings():  # tree-sitter 0.21 warns that the grammars' loader is deprecated
        warnings.simplefilter("ignore", FutureWarning)
        from tree_sitter_languages import get_language, get_parser

        try:
            data = block.encode("utf8")
            captures = get_language(lang).query(FUNCTION_QUERY[lang]).captures(get_parser(lang).parse(data).root_node)
        except Exception:  # noqa: BLE001 — SCBench falls back to the block on any parser failure
            return None
    for node, _ in captures:
        return data[node.start_byte : node.end_byte].decode("utf8")
    return None


def sanitize(answer: str, lang: str) -> str:
    """What of ``answer`` is compared with the needles (step 1 above)."""
    answer = answer.strip()
    blocks = _BLOCK.findall(answer)
    if not blocks:
        return answer
    for block in blocks:
        found = _first_function(block, lang)
        if found is not None:
            return found
    return blocks[0]


def similarity(candidate: str, reference: str) -> float:
    """BLEU of ``candidate`` against ``reference`` on whitespace-split words, smoothing method 4."""
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    with warnings.catch_warnings():  # nltk warns on candidates without some n-gram order; the smoothing handles it
        warnings.simplefilter("ignore")
        return float(sentence_bleu([_SPACE.split(reference.strip())], _SPACE.split(candidate.strip()),
                                   smoothing_function=SmoothingFunction().method4))


def best_needle(answer: str, needles: Sequence[tuple[str, str]], lang: str) -> tuple[str | None, float]:
    """The name of the needle (``(name, code)``) most similar to ``answer`` and that similarity."""
    text = sanitize(answer, lang)
    best, best_sim = None, 0.0
    for name, code in needles:
        sim = similarity(text, code)
        if sim > best_sim:
            best, best_sim = name, sim
    return best, best_sim


def repoqa_score(answer: str, name: str, needles: Sequence[tuple[str, str]], lang: str) -> float:
    """1 when ``answer`` retrieves the function ``name`` among ``needles`` with similarity >= 0.8, else 0."""
    if lang not in FUNCTION_QUERY:
        raise ValueError(f"lang: expected one of {', '.join(FUNCTION_QUERY)}, got {lang!r}")
    best, sim = best_needle(answer, needles, lang)
    return 1.0 if best == name and sim >= THRESHOLD else 0.0
