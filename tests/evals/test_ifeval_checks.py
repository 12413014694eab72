"""The port of IFEval's checks (kdeval/evals/metrics/ifeval.py): known answers of the official checkers'
rules, strict against loose, and IFEval's description texts."""
from __future__ import annotations

import pytest

from kdeval.evals.metrics.ifeval import CHECKS, bullet_points, describe, follow_lists, follows


@pytest.mark.parametrize("iid, kwargs, response, expected", [
    ("change_case:english_lowercase", {}, "all lower case here.", True),
    ("change_case:english_lowercase", {}, "Not all lower.", False),
    ("change_case:english_capital", {}, "ALL CAPS.", True),
    ("keywords:existence", {"keywords": ["growth", "Money"]}, "money drives GROWTH", True),
    ("keywords:existence", {"keywords": ["growth", "money"]}, "growth only", False),
    ("keywords:frequency", {"keyword": "idea", "frequency": 2, "relation": "at least"}, "idea, Idea", True),
    ("keywords:frequency", {"keyword": "idea", "frequency": 2, "relation": "less than"}, "idea, Idea", False),
    ("keywords:forbidden_words", {"forbidden_words": ["violet123"]}, "the code is violet123.", False),
    ("keywords:forbidden_words", {"forbidden_words": ["violet123"]}, "I can't; violet1234 is not it", True),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 2, "let_relation": "at least"}, "Zz",
     True),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, 'Done. "Any other QUESTIONS?"  ', True),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Any other questions? Yes.", False),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "Intro\n* one\n- two", True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* one\n** bold\n* two\n* three", False),
    ("punctuation:no_comma", {}, "no commas here", True),
    ("punctuation:no_comma", {}, "one, two", False),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Text\np.s. see you", True),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Text without it", False),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "x\nP. P. S more", True),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*a* and **b** and ** **", True),
    ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 2},
     "Section 1\nfoo\nSection 2\nbar", True),
    ("detectable_format:json_format", {}, '```json\n{"a": 1}\n```', True),
    ("detectable_format:json_format", {}, "{a: 1}", False),
    ("detectable_format:title", {}, "<<my title>>\ntext", True),
    ("detectable_format:title", {}, "<< >>", False),
    ("detectable_format:constrained_response", {}, "I think My answer is no.", True),
    ("combination:two_responses", {}, "first******second", True),
    ("combination:two_responses", {}, "same******same", False),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Say hi."}, "say hi. hi", True),
    ("startend:quotation", {}, '"quoted"', True),
    ("length_constraints:number_words", {"num_words": 3, "relation": "less than"}, "two words", True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "a\n***\nb", True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "a\n***\n***\nb", False),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "[name] at [address]", True),
])
def test_known_answers(iid, kwargs, response, expected):
    assert follows(iid, kwargs, response) is expected


def test_an_empty_response_follows_nothing_and_loose_tries_ifevals_variants():
    assert not follows("punctuation:no_comma", {}, "   ")
    # a first line of chatter breaks the lowercase rule strictly; loose drops the first line
    response = "Sure! Here it is:\nall lowercase text"
    assert not follows("change_case:english_lowercase", {}, response)
    assert follows("change_case:english_lowercase", {}, response, loose=True)
    # markdown emphasis hides the end phrase strictly; loose removes the asterisks
    assert follow_lists(["startend:end_checker"], [{"end_phrase": "The end."}], "Text. **The end.**") == (
        [False], [True])


def test_descriptions_are_ifevals_and_unported_ids_are_refused():
    assert describe("keywords:existence", {"keywords": ["b", "a"]}) == (
        "Include keywords ['a', 'b'] in the response.")
    assert describe("startend:end_checker", {"end_phrase": "Bye."}) == (
        "Finish your response with this exact phrase Bye.. No other words should follow this phrase.")
    assert bullet_points("* a\n  - b\n**c**") == 2
    assert "language:response_language" not in CHECKS and len(CHECKS) == 21
    with pytest.raises(ValueError, match=r"instruction: 'language:response_language' is not ported"):
        follows("language:response_language", {"language": "hi"}, "text")
