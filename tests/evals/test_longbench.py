"""LongBench v1: official metrics on hand-computed cases, prompts, loader, scorer rules."""
from __future__ import annotations

import pytest

from kdeval.evals.benchmarks.longbench import (
    DATASET2MAXLEN, DATASET2PROMPT, NO_CHAT_TASKS, LongBenchTask, render_prompt,
)
from kdeval.evals.metrics import longbench as m
from kdeval.evals.tasks.base import DataNotFoundError, EvalError

EXPECTED_MAXLEN = {
    "narrativeqa": 128, "qasper": 128, "multifieldqa_en": 64, "multifieldqa_zh": 64, "hotpotqa": 32,
    "2wikimqa": 32, "musique": 32, "dureader": 128, "gov_report": 512, "qmsum": 512, "multi_news": 512,
    "vcsum": 512, "trec": 64, "triviaqa": 32, "samsum": 128, "lsht": 64, "passage_count": 32,
    "passage_retrieval_en": 32, "passage_retrieval_zh": 32, "lcc": 64, "repobench-p": 64,
}


def test_21_tasks_with_official_max_lengths():
    assert DATASET2MAXLEN == EXPECTED_MAXLEN
    assert set(DATASET2PROMPT) == set(EXPECTED_MAXLEN) == set(m.DATASET2METRIC)
    assert NO_CHAT_TASKS == {"trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"}


@pytest.mark.parametrize("task", sorted(EXPECTED_MAXLEN))
def test_prompt_split_reassembles_the_official_template(task):
    prefix, suffix = render_prompt(task, "CTX{x}", "INP")
    assert prefix + suffix == DATASET2PROMPT[task].replace("{context}", "CTX{x}").replace("{input}", "INP")
    assert prefix.endswith("CTX{x}")


def test_official_template_text_verbatim():
    assert "".join(render_prompt("hotpotqa", "C", "Q")) == (
        "Answer the question based on the given passages. Only give me the answer and do not output any other words."
        "\n\nThe following are given passages.\nC\n\nAnswer the question based on the given passages. Only give me "
        "the answer and do not output any other words.\n\nQuestion: Q\nAnswer:")
    assert "".join(render_prompt("lcc", "def f():\n", "")) == "Please complete the code given below. \ndef f():\nNext line of code:\n"
    assert "".join(render_prompt("repobench-p", "A\n", "B\n")) == "Please complete the code given below. \nA\nB\nNext line of code:\n"
    assert "".join(render_prompt("trec", "EX", "Q")) == "Please determine the type of the question below. Here are some examples of questions.\n\nEX\nQ"
    assert render_prompt("narrativeqa", "S", "Q")[0].startswith(
        "You are given a story, which can be either a novel or a movie script, and a question. Answer the question asconcisely")
    assert "".join(render_prompt("passage_retrieval_zh", "C", "I")).endswith('请输入摘要所属段落的编号。答案格式必须是"段落1"，"段落2"等格式\n\n答案是：')


def test_qa_f1_with_english_normalization():
    # "the eiffel tower paris" -> [eiffel, tower, paris] vs [eiffel, tower]: P=2/3 R=1 F1=0.8
    assert m.qa_f1_score("The Eiffel Tower, Paris.", "Eiffel Tower") == pytest.approx(0.8, abs=1e-12)
    assert m.normalize_answer("An  Apple, the PIE!") == "apple pie"
    assert m.qa_f1_score("nothing", "Paris") == 0.0


def test_qa_f1_zh_uses_jieba_words():
    assert m._jieba_tokens("我爱北京") == ["我", "爱", "北京"]
    # pred words [我, 爱, 北京] vs [北京]: P=1/3 R=1 -> F1 = 0.5; punctuation-only tokens dropped
    assert m.qa_f1_zh_score("我爱北京。", "北京") == pytest.approx(0.5, abs=1e-12)


def test_rouge_l_is_the_rouge_package_f():
    # LCS=3, r=3/6, p=3/3; rouge 1.0.1's F: 2*p*r/(p+r+1e-8) (the 1e-8 makes it differ from 2/3 at 1e-9)
    assert m.rouge_score("alpha beta gamma", "alpha beta gamma delta epsilon zeta") == pytest.approx(
        2 * 0.5 / (1.5 + 1e-8), abs=1e-15)
    assert m.rouge_score("", "anything") == 0.0


def test_rouge_zh_segments_with_jieba():
    assert m.rouge_zh_score("我爱北京", "我爱北京") == pytest.approx(1.0, abs=1e-6)


def test_classification_keeps_the_official_iteration_quirk():
    classes = ["Abbreviation", "Entity", "Human being", "Location", "Numeric value"]
    assert m.classification_score("Type: Human being", "Human being", all_classes=classes) == 1.0
    assert m.classification_score("Entity or Location", "Location", all_classes=classes) == 0.5
    # matches [value, numeric, numeric value]; "value" is removed, which skips "numeric": 1/2
    quirk = ["value", "numeric", "numeric value", "date"]
    assert m.classification_score("value numeric numeric value", "numeric value", all_classes=quirk) == 0.5
    assert m.classification_score("nothing", "Location", all_classes=classes) == 0.0


def test_retrieval_count_and_code_sim():
    assert m.retrieval_score("Paragraph 3, not Paragraph 12", "Paragraph 3") == 0.5
    assert m.retrieval_zh_score("段落5", "段落5") == 1.0
    assert m.count_score("There are 7 unique paragraphs out of 9", "7") == 0.5
    assert m.count_score("no digits", "7") == 0.0
    # first line without '#': "return x + 1"; SequenceMatcher matches 10 of 22 chars -> 91/100
    assert m.code_sim_score("\n# comment\nreturn x + 1\n", "return x+1") == 0.91


def test_first_line_rule_and_100x_mean_of_max():
    assert m.score_sample("triviaqa", "Paris\nLondon is big", ["Paris"], None) == 1.0
    assert m.score_sample("hotpotqa", "Paris\nLondon", ["Paris"], None) == pytest.approx(2 / 3)
    # sample 1: max(0, 1) = 1 ; sample 2: count 0.5 -> 75.0
    assert m.scorer("hotpotqa", ["london"], [["Paris", "London"]], None) == 100.0
    assert m.scorer("passage_count", ["3", "3 or 4"], [["3"], ["3"]], None) == 75.0


def test_loader_reads_local_jsonl_and_builds_samples(fixtures_dir):
    task = LongBenchTask("hotpotqa", data_dir=str(fixtures_dir))
    samples = task.samples()
    assert [s.id for s in samples] == ["longbench.hotpotqa/hp-0001", "longbench.hotpotqa/hp-0002"]
    s = samples[1]
    assert s.references == ("London", "Westminster, London") and s.max_new_tokens == 32 and s.use_chat_template
    assert s.suffix.endswith("Question: Where is Big Ben?\nAnswer:")
    # [it, is, in, london] vs [london]: P=1/4 R=1 -> 0.4; vs [westminster, london]: 1/3 -> max 0.4
    assert task.score("It is in London", s.references, s.meta).score == pytest.approx(0.4, abs=1e-12)
    assert task.aggregate([{"score": 1.0}, {"score": 0.25}]) == {"score": 62.5, "n": 2}
    trec = LongBenchTask("trec", data_dir=str(fixtures_dir)).samples()[0]
    assert not trec.use_chat_template and trec.meta["all_classes"][3] == "Human being"


def test_missing_data_names_the_file(tmp_path):
    with pytest.raises(DataNotFoundError, match=r"longbench/qasper\.jsonl.*THUDM/LongBench"):
        LongBenchTask("qasper", data_dir=str(tmp_path))
    with pytest.raises(EvalError, match="subset: unknown LongBench task 'hotpot'"):
        LongBenchTask("hotpot", data_dir=str(tmp_path))


def test_classification_without_all_classes_is_a_clear_error(fixtures_dir):
    task = LongBenchTask("trec", data_dir=str(fixtures_dir))
    with pytest.raises(EvalError, match="all_classes"):
        task.score("Location", ["Location"], {})


def test_hub_source_offline_is_a_clear_skip(monkeypatch):
    from kdeval.evals.tasks.base import TaskUnavailableError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    task = LongBenchTask("qasper", source="hub")  # no data check, no network at construction
    with pytest.raises(TaskUnavailableError, match=r"longbench\.qasper.*hub access is disabled.*THUDM/LongBench"):
        task.samples()
