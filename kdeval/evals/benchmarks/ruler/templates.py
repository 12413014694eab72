"""RULER's task templates (scripts/data/synthetic/constants.py) and task configs (synthetic.yaml)."""
from __future__ import annotations

#: template (with {context} and {query}), answer prefix, tokens to generate; verbatim from RULER
TASKS: dict[str, dict] = {
    "niah": {
        "tokens_to_generate": 128,
        "template": "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for {query} mentioned in the provided text?",
        "answer_prefix": " The special magic {type_needle_v} for {query} mentioned in the provided text are",
    },
    "variable_tracking": {
        "tokens_to_generate": 30,
        "template": "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\nQuestion: Find all variables that are assigned the value {query} in the text above.",
        "answer_prefix": " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are assigned the value {query}, they are: ",
    },
    "common_words_extraction": {
        "tokens_to_generate": 120,
        "template": "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?",
        "answer_prefix": " Answer: The top 10 words that appear most often in the list are:",
    },
    "freq_words_extraction": {
        "tokens_to_generate": 50,
        "template": "Read the following coded text and track the frequency of each coded word. Find the three most frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three most frequently appeared words in the above coded text?",
        "answer_prefix": " Answer: According to the coded text above, the three most frequently appeared words are:",
    },
    "qa": {
        "tokens_to_generate": 32,
        "template": "Answer the question based on the given documents. Only give me the answer and do not output any other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}",
        "answer_prefix": " Answer:",
    },
}

#: RULER's scripts/synthetic.yaml: the 13 tasks
CONFIGS: dict[str, dict] = {
    "niah_single_1": {"task": "niah", "type_haystack": "noise", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 1},
    "niah_single_2": {"task": "niah", "type_haystack": "essay", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 1},
    "niah_single_3": {"task": "niah", "type_haystack": "essay", "type_needle_k": "words", "type_needle_v": "uuids", "num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 1},
    "niah_multikey_1": {"task": "niah", "type_haystack": "essay", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 4, "num_needle_v": 1, "num_needle_q": 1},
    "niah_multikey_2": {"task": "niah", "type_haystack": "needle", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 1},
    "niah_multikey_3": {"task": "niah", "type_haystack": "needle", "type_needle_k": "uuids", "type_needle_v": "uuids", "num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 1},
    "niah_multivalue": {"task": "niah", "type_haystack": "essay", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 1, "num_needle_v": 4, "num_needle_q": 1},
    "niah_multiquery": {"task": "niah", "type_haystack": "essay", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 4},
    "vt": {"task": "variable_tracking", "type_haystack": "noise", "num_chains": 1, "num_hops": 4},
    "cwe": {"task": "common_words_extraction", "freq_cw": 30, "freq_ucw": 3, "num_cw": 10},
    "fwe": {"task": "freq_words_extraction", "alpha": 2.0},
    "qa_1": {"task": "qa", "dataset": "squad"},
    "qa_2": {"task": "qa", "dataset": "hotpotqa"},
}

SYNTHETIC_TASKS = tuple(k for k in CONFIGS if not k.startswith("qa_"))
QA_TASKS = ("qa_1", "qa_2")

#: the needle sentence
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
#: the QA document format
DOCUMENT_PROMPT = "Document {i}:\n{document}"
#: the 40 candidate depths (percent) of needles in essay haystacks: round(linspace(0, 100, 40))
DEPTHS = tuple(int(round(100 * i / 39)) for i in range(40))
