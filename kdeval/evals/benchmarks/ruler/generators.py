"""RULER's synthetic generators (niah, variable tracking, common words, frequent words).

Each ``make_*`` function builds one sample's text from a seeded ``random.Random`` and a haystack
size ``n`` (the unit the length fitting searches over) and returns a :class:`Generated`. The logic
follows RULER's scripts/data/synthetic/*.py; the random streams differ from RULER's (no numpy,
no wonderwords, no nltk), so items are RULER-like, not byte-identical to RULER's files.
"""
from __future__ import annotations

import math
import random
import string
import uuid
from dataclasses import dataclass
from typing import Sequence

from kdeval.evals.benchmarks.ruler.templates import DEPTHS, NEEDLE, TASKS
from kdeval.evals.benchmarks.ruler.words import ADJECTIVES, NOUNS, base_words, pronounceable_words
from kdeval.evals.tasks.prompting import split_at_context
from kdeval.evals.tasks.synthetic import NOISE_PARAGRAPH, split_sentences, take_words


@dataclass
class Generated:
    """One generated item: the user message split at the context, the answer prefix, the answers."""

    prefix: str
    suffix: str
    answer_prefix: str
    outputs: list[str]


def _random_value(rng: random.Random, kind: str) -> str:
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"needle type must be numbers, words or uuids, got {kind!r}")


def make_niah(rng: random.Random, n: int, cfg: dict, essay: Sequence[str] | None) -> Generated:
    """Needle(s) in a noise, essay or needle haystack of ``n`` units (sentences, words or needles)."""
    num_k = max(cfg["num_needle_k"], cfg["num_needle_q"])
    kind_k, kind_v = cfg["type_needle_k"], cfg["type_needle_v"]
    keys, values, needles = [], [], []
    for _ in range(num_k):
        keys.append(_random_value(rng, kind_k))
        values.append([_random_value(rng, kind_v) for _ in range(cfg["num_needle_v"])])
        needles += [NEEDLE.format(type_needle_v=kind_v, key=keys[-1], value=v) for v in values[-1]]
    rng.shuffle(needles)
    indices = rng.sample(range(num_k), cfg["num_needle_q"])
    queries = [keys[i] for i in indices]
    answers = [a for i in indices for a in values[i]]

    hay = cfg["type_haystack"]
    if hay == "essay":
        if essay is None:
            raise ValueError("the essay haystack needs the Paul Graham essays")
        sents = split_sentences(" ".join(take_words(essay, n)))
        cuts = [0] + sorted(int(len(sents) * d / 100) for d in rng.sample(DEPTHS, len(needles))) + [len(sents)]
        parts = []
        for i in range(1, len(cuts)):
            parts.append(" ".join(sents[cuts[i - 1]: cuts[i]]))
            if i - 1 < len(needles):
                parts.append(needles[i - 1])
        context = " ".join(parts)
    else:
        if hay == "noise":
            sentences = [NOISE_PARAGRAPH] * n
        else:  # "needle": distractor needles with random keys and values
            sentences = [NEEDLE.format(type_needle_v=kind_v, key=_random_value(rng, kind_k), value=_random_value(rng, kind_v)) for _ in range(n)]
        for index, needle in zip(sorted(rng.sample(range(n), len(needles)), reverse=True), needles):
            sentences.insert(index, needle)
        context = "\n".join(sentences)

    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    template, answer_prefix, type_v = TASKS["niah"]["template"], TASKS["niah"]["answer_prefix"], kind_v
    if cfg["num_needle_q"] * cfg["num_needle_v"] == 1:  # RULER's singular wording
        fixed = []
        for t in (template, answer_prefix):
            t = t.replace("Some", "A").replace("are all", "is").replace("are", "is").replace("answers", "answer")
            fixed.append(t)
        template, answer_prefix = fixed
        type_v = kind_v[:-1]
    prefix, suffix = split_at_context(template, context, type_needle_v=type_v, query=query)
    return Generated(prefix, suffix, answer_prefix.format(type_needle_v=type_v, query=query), answers)


def _vt_chain(rng: random.Random, num_chains: int, num_hops: int, icl: bool) -> tuple[list[list[str]], list[list[str]]]:
    k = 3 if icl else 5
    names: list[str] = []
    while len(names) < (num_hops + 1) * num_chains:
        name = "".join(rng.choices(string.ascii_uppercase, k=k))
        if name not in names:
            names.append(name)
    vars_, chains = [], []
    for i in range(0, len(names), num_hops + 1):
        v = names[i: i + num_hops + 1]
        vars_.append(v)
        value = "12345" if icl else str(rng.randint(10000, 99998))
        chains.append([f"VAR {v[0]} = {value}"] + [f"VAR {v[j + 1]} = VAR {v[j]} " for j in range(num_hops)])
    return vars_, chains


def _vt_text(rng: random.Random, n: int, cfg: dict, icl: bool) -> tuple[str, str, str, list[str]]:
    vars_, chains = _vt_chain(rng, cfg["num_chains"], cfg["num_hops"], icl)
    value = chains[0][0].split("=")[-1].strip()
    sentences = [NOISE_PARAGRAPH] * n
    for chain in chains:
        positions = sorted(rng.sample(range(len(sentences)), len(chain)))
        for j, pos in enumerate(positions):
            sentences.insert(pos + j, chain[j])
    context = "\n".join(sentences).replace(". \n", ".\n")
    t = TASKS["variable_tracking"]
    prefix, suffix = split_at_context(t["template"], context, query=value)
    return prefix, suffix, t["answer_prefix"].format(num_v=cfg["num_hops"] + 1, query=value), vars_[0]


def make_vt(rng: random.Random, n: int, cfg: dict, icl_units: int) -> Generated:
    """Variable tracking in a noise haystack, after one worked example (RULER's ICL example)."""
    # the worked example: 3-letter names and value 12345, then renamed and revalued like RULER's randomize_icl
    p, s, a, names = _vt_text(rng, icl_units, cfg, icl=True)
    example = p + s + a + " " + " ".join(names) + "\n"
    for old in names:
        example = example.replace(old, "".join(rng.choices(string.ascii_uppercase, k=len(old))))
    example = example.replace("12345", str(rng.randint(10000, 99998)))
    prefix, suffix, answer_prefix, answers = _vt_text(rng, n, cfg, icl=False)
    return Generated(example + "\n" + prefix, suffix, answer_prefix, answers)


def _cwe_vocab(needed: int, seed: int) -> list[str]:
    words = base_words()
    if needed > len(words):
        words = words + pronounceable_words(needed - len(words), seed, set(words))
    return words


def _cwe_example(rng: random.Random, num_words: int, common_reps: int, uncommon_reps: int, num_cw: int, seed: int) -> tuple[str, list[str]]:
    chosen = rng.sample(_cwe_vocab(num_words, seed), num_words)
    common, uncommon = chosen[:num_cw], chosen[num_cw:]
    word_list = common * common_reps + uncommon * uncommon_reps
    rng.shuffle(word_list)
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(word_list)), common


def make_cwe(rng: random.Random, n: int, cfg: dict, length: int, seed: int) -> Generated:
    """Common words extraction over ``n`` distinct words, after one worked example."""
    t, num_cw = TASKS["common_words_extraction"], cfg["num_cw"]
    if length < 4096:  # RULER's short-context setting
        ex_ctx, ex_ans = _cwe_example(rng, 20, 3, 1, num_cw, seed)
        ctx, answer = _cwe_example(rng, n, 6, 1, num_cw, seed)
    else:
        ex_ctx, ex_ans = _cwe_example(rng, 40, 10, 3, num_cw, seed)
        ctx, answer = _cwe_example(rng, n, cfg["freq_cw"], cfg["freq_ucw"], num_cw, seed)
    example = t["template"].format(context=ex_ctx, query="") + t["answer_prefix"] + " " + " ".join(
        f"{i + 1}. {w}" for i, w in enumerate(ex_ans))
    prefix, suffix = split_at_context(t["template"], ctx, query="")
    return Generated(example + "\n" + prefix, suffix, t["answer_prefix"], answer)


def _zeta(alpha: float) -> float:
    if alpha == 2.0:
        return math.pi ** 2 / 6
    import mpmath

    return float(mpmath.zeta(alpha))


def make_fwe(rng: random.Random, n: int, cfg: dict, length: int, tokens_to_generate: int) -> Generated:
    """Frequent words extraction: ``n`` coded words drawn from a Zipf(alpha) law; '...' is rank 1 (noise)."""
    vocab_size = max(8, (length - tokens_to_generate) // 50)
    vocab: set[str] = set()
    while len(vocab) < vocab_size:
        vocab.add("".join(rng.choices(string.ascii_lowercase, k=6)))
    words = sorted(vocab)
    rng.shuffle(words)
    words[0] = "..."
    alpha = cfg["alpha"]
    z = _zeta(alpha)
    sampled = [w for k, w in enumerate(words, 1) for _ in range(int(n * k ** -alpha / z))]
    rng.shuffle(sampled)
    t = TASKS["freq_words_extraction"]
    prefix, suffix = split_at_context(t["template"], " ".join(sampled), query="")
    return Generated(prefix, suffix, t["answer_prefix"], words[1:4])

