"""IFEval's verifiable-instruction checks (Zhou et al. 2023, arXiv 2311.07911), strict and loose, ported.

A port of Google Research's ``instruction_following_eval`` checkers (Apache-2.0; the copy
lm-evaluation-harness 0.4.13 ships as ``lm_eval/tasks/ifeval/instructions.py``): each instruction id's
``check_following`` and its description text, with the same regular expressions and comparisons. The official
code does not run offline here: importing it downloads NLTK's ``punkt_tab`` and it needs ``langdetect``, so
its checks are ported, not imported.

Differences, on purpose and only these: ``change_case:english_lowercase`` / ``english_capital`` check the case
only (the official check also asks ``langdetect`` whether the text is English, which needs a package and makes
a score depend on a language model's guess); the ids that need NLTK's sentence or word tokenizer or
``langdetect`` (``language:response_language``, ``length_constraints:number_sentences`` and
``nth_paragraph_first_word``, ``change_case:capital_word_frequency``) are not ported: :data:`CHECKS` lists
what is.

Strict: the response as it is. Loose (IFEval's upper bound): an instruction counts as followed when any of
eight variants follows it (the response; without its first line, its last line, or both; each also without
``*``). An empty response follows nothing.
"""
from __future__ import annotations

import collections
import json
import re
from typing import Any, Callable, Mapping, Sequence

#: IFEval's comparison words
LESS, AT_LEAST = "less than", "at least"


def _compare(count: int, relation: str, threshold: int) -> bool:
    if relation not in (LESS, AT_LEAST):
        raise ValueError(f"relation: expected {LESS!r} or {AT_LEAST!r}, got {relation!r}")
    return count < threshold if relation == LESS else count >= threshold


def _existence(value: str, keywords: Sequence[str]) -> bool:
    return all(re.search(k, value, flags=re.IGNORECASE) for k in keywords)


def _frequency(value: str, keyword: str, frequency: int, relation: str) -> bool:
    return _compare(len(re.findall(keyword.strip(), value, flags=re.IGNORECASE)), relation, frequency)


def _forbidden(value: str, forbidden_words: Sequence[str]) -> bool:
    return not any(re.search(r"\b" + w + r"\b", value, flags=re.IGNORECASE) for w in set(forbidden_words))


def _letter_frequency(value: str, letter: str, let_frequency: int, let_relation: str) -> bool:
    return _compare(collections.Counter(value.lower())[letter.strip().lower()], let_relation, let_frequency)


def _paragraphs(value: str, num_paragraphs: int) -> bool:
    paragraphs = re.split(r"\s?\*\*\*\s?", value)
    count = len(paragraphs)
    for i, p in enumerate(paragraphs):
        if not p.strip():
            if i == 0 or i == len(paragraphs) - 1:
                count -= 1
            else:
                return False
    return count == num_paragraphs


def _words(value: str, num_words: int, relation: str) -> bool:
    return _compare(len(re.findall(r"\w+", value)), relation, num_words)  # NLTK's RegexpTokenizer(r"\w+")


def _placeholders(value: str, num_placeholders: int) -> bool:
    return len(re.findall(r"\[.*?\]", value)) >= num_placeholders


def _postscript(value: str, postscript_marker: str) -> bool:
    marker = postscript_marker.strip()
    pattern = (r"\s*p\.\s?p\.\s?s.*$" if marker == "P.P.S" else r"\s*p\.\s?s\..*$" if marker == "P.S."
               else r"\s*" + marker.lower() + r".*$")
    return bool(re.findall(pattern, value.lower(), flags=re.MULTILINE))


def bullet_points(value: str) -> int:
    """Markdown bullet points as IFEval counts them: lines starting ``*`` (not ``**``) or ``-``."""
    return (len(re.findall(r"^\s*\*[^\*].*$", value, flags=re.MULTILINE))
            + len(re.findall(r"^\s*-.*$", value, flags=re.MULTILINE)))


def _bullets(value: str, num_bullets: int) -> bool:
    return bullet_points(value) == num_bullets


#: IFEval's options of ``detectable_format:constrained_response``
CONSTRAINED = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


def _constrained(value: str) -> bool:
    return any(c in value.strip() for c in CONSTRAINED)


def _highlighted(value: str, num_highlights: int) -> bool:
    single = [h for h in re.findall(r"\*[^\n\*]*\*", value) if h.strip("*").strip()]
    double = [h for h in re.findall(r"\*\*[^\n\*]*\*\*", value)
              if h.removeprefix("**").removesuffix("**").strip()]
    return len(single) + len(double) >= num_highlights


def _sections(value: str, section_spliter: str, num_sections: int) -> bool:
    return len(re.split(r"\s?" + section_spliter.strip() + r"\s?\d+\s?", value)) - 1 >= num_sections


def _json(value: str) -> bool:
    value = (value.strip().removeprefix("```json").removeprefix("```Json").removeprefix("```JSON")
             .removeprefix("```").removesuffix("```").strip())
    try:
        json.loads(value)
    except ValueError:
        return False
    return True


def _title(value: str) -> bool:
    return any(t.lstrip("<").rstrip(">").strip() for t in re.findall(r"<<[^\n]+>>", value))


def _two_responses(value: str) -> bool:
    valid = []
    parts = value.split("******")
    for i, part in enumerate(parts):
        if not part.strip():
            if i != 0 and i != len(parts) - 1:
                return False
        else:
            valid.append(part)
    return len(valid) == 2 and valid[0].strip() != valid[1].strip()


def _repeat_prompt(value: str, prompt_to_repeat: str) -> bool:
    return value.strip().lower().startswith(prompt_to_repeat.strip().lower())


def _end(value: str, end_phrase: str) -> bool:
    return value.strip().strip('"').lower().endswith(end_phrase.strip().lower())


def _quotation(value: str) -> bool:
    value = value.strip()
    return len(value) > 1 and value[0] == '"' and value[-1] == '"'


#: instruction id -> (check of a response with the instruction's kwargs, IFEval's description template)
CHECKS: dict[str, tuple[Callable[..., bool], str]] = {
    "keywords:existence": (
        _existence,
        "Include keywords {keywords} in the response."),
    "keywords:frequency": (
        _frequency,
        "In your response, the word {keyword} should appear {relation} {frequency} times."),
    "keywords:forbidden_words": (
        _forbidden,
        "Do not include keywords {forbidden_words} in the response."),
    "keywords:letter_frequency": (
        _letter_frequency,
        "In your response, the letter {letter} should appear {let_relation} {let_frequency} times."),
    "length_constraints:number_paragraphs": (
        _paragraphs,
        "There should be {num_paragraphs} paragraphs. Paragraphs are separated with the markdown "
        "divider: ***"),
    "length_constraints:number_words": (
        _words,
        "Answer with {relation} {num_words} words."),
    "detectable_content:number_placeholders": (
        _placeholders,
        "The response must contain at least {num_placeholders} placeholders represented by square "
        "brackets, such as [address]."),
    "detectable_content:postscript": (
        _postscript,
        "At the end of your response, please explicitly add a postscript starting with "
        "{postscript_marker}"),
    "detectable_format:number_bullet_lists": (
        _bullets,
        "Your answer must contain exactly {num_bullets} bullet points. Use the markdown bullet points "
        "such as:\n* This is point 1. \n* This is point 2"),
    "detectable_format:constrained_response": (
        _constrained,
        "Answer with one of the following options: ('My answer is yes.', 'My answer is no.', 'My answer "
        "is maybe.')"),
    "detectable_format:number_highlighted_sections": (
        _highlighted,
        "Highlight at least {num_highlights} sections in your answer with markdown, i.e. *highlighted "
        "section*."),
    "detectable_format:multiple_sections": (
        _sections,
        "Your response must have {num_sections} sections. Mark the beginning of each section with "
        "{section_spliter} X, such as:\n{section_spliter} 1\n[content of section 1]\n{section_spliter} "
        "2\n[content of section 2]"),
    "detectable_format:json_format": (
        _json,
        "Entire output should be wrapped in JSON format. You can use markdown ticks such as ```."),
    "detectable_format:title": (
        _title,
        "Your answer must contain a title, wrapped in double angular brackets, such as <<poem of joy>>."),
    "combination:two_responses": (
        _two_responses,
        "Give two different responses. Responses and only responses should be separated by 6 asterisk "
        "symbols: ******."),
    "combination:repeat_prompt": (
        _repeat_prompt,
        "First repeat the request word for word without change, then give your answer (1. do not say any "
        "words or characters before repeating the request; 2. the request you need to repeat does not "
        "include this sentence) {prompt_to_repeat}"),
    "startend:end_checker": (
        _end,
        "Finish your response with this exact phrase {end_phrase}. No other words should follow this "
        "phrase."),
    "startend:quotation": (
        _quotation,
        "Wrap your entire response with double quotation marks."),
    "change_case:english_lowercase": (
        lambda v: v.islower(),
        "Your entire response should be in English, and in all lowercase letters. No capital letters are "
        "allowed."),
    "change_case:english_capital": (
        lambda v: v.isupper(),
        "Your entire response should be in English, and in all capital letters."),
    "punctuation:no_comma": (
        lambda v: not re.search('\\,', v),
        "In your entire response, refrain from the use of any commas."),
}


def describe(instruction_id: str, kwargs: Mapping[str, Any]) -> str:
    """IFEval's text of instruction ``instruction_id`` with ``kwargs`` (keyword lists as IFEval prints
    them)."""
    if instruction_id not in CHECKS:
        raise ValueError(f"instruction: {instruction_id!r} is not ported; expected one of {sorted(CHECKS)}")
    fields = {k: sorted(v) if isinstance(v, (list, tuple)) else v for k, v in kwargs.items()}
    return CHECKS[instruction_id][1].format(**fields)


def _loose_variants(response: str) -> list[str]:
    """IFEval's eight variants of a response for the loose score."""
    lines = response.split("\n")
    first, last, both = ("\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(),
                         "\n".join(lines[1:-1]).strip())
    return [response, response.replace("*", ""), first, last, both, first.replace("*", ""),
            last.replace("*", ""), both.replace("*", "")]


def follows(instruction_id: str, kwargs: Mapping[str, Any], response: str, loose: bool = False) -> bool:
    """Whether ``response`` follows the instruction (strict, or ``loose``: any of IFEval's variants)."""
    if instruction_id not in CHECKS:
        raise ValueError(f"instruction: {instruction_id!r} is not ported; expected one of {sorted(CHECKS)}")
    check = CHECKS[instruction_id][0]
    args = {k: v for k, v in kwargs.items() if v is not None}  # IFEval drops None kwargs
    return any(r.strip() and check(r, **args) for r in (_loose_variants(response) if loose else [response]))


def follow_lists(ids: Sequence[str], kwargs: Sequence[Mapping[str, Any]], response: str
                 ) -> tuple[list[bool], list[bool]]:
    """(strict, loose): for each instruction, whether ``response`` follows it."""
    return ([follows(i, k, response) for i, k in zip(ids, kwargs)],
            [follows(i, k, response, loose=True) for i, k in zip(ids, kwargs)])
