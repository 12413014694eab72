"""A tokenizer that lost its merges or scores is refused when a model loads (before its weights), and one
that gives about one character a token on an English paragraph is warned about at submit, once, naming the
model."""
from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from typer.testing import CliRunner

from kdeval.cli.app import app as kdeval_app
from kdeval.zoo import loading, tokenizer_check
from kdeval.zoo.byte_tokenizer import byte_level_tokenizer
from kdeval.zoo.tokenizer_check import (PARAGRAPH, DegenerateTokenizerError, char_level_warning,
                                        chars_per_token, degenerate_reason)


def _fast(model) -> PreTrainedTokenizerFast:
    core = Tokenizer(model)
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="</s>")


def _words() -> dict[str, int]:
    words = ["<unk>", "</s>"] + sorted(set(PARAGRAPH.replace(".", " . ").replace(",", " , ").split()))
    return {w: i for i, w in enumerate(words)}


def test_a_bpe_without_merges_and_a_unigram_without_scores_are_named():
    vocab = {"<unk>": 0, "</s>": 1, "h": 2, "i": 3, "hi": 4}
    assert degenerate_reason(_fast(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))) == (
        "a BPE tokenizer with no merges: none of its 1 multi-character pieces is ever produced")
    assert degenerate_reason(_fast(models.BPE(vocab=vocab, merges=[("h", "i")], unk_token="<unk>"))) is None
    flat = [("<unk>", 0.0), ("</s>", 0.0), ("h", 0.0), ("i", 0.0), ("hi", 0.0)]
    assert degenerate_reason(_fast(models.Unigram(flat, unk_id=0))) == (
        "a Unigram tokenizer whose pieces all have the same score (no scores)")
    scored = [(p, -float(i)) for i, (p, _) in enumerate(flat)]
    assert degenerate_reason(_fast(models.Unigram(scored, unk_id=0))) is None
    assert degenerate_reason(byte_level_tokenizer()) is None  # single bytes by design: nothing lost


def _saved_model(tmp_path, tokenizer) -> str:
    lm = loading.load_model("random:llama-tiny", device="cpu")
    lm.model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return str(tmp_path)


def test_a_model_load_refuses_a_merge_less_tokenizer_before_its_weights(tmp_path, monkeypatch):
    words = _words()
    path = _saved_model(tmp_path, _fast(models.BPE(vocab={**words, **{c: len(words) + i for i, c in enumerate(
        sorted(set(PARAGRAPH) - set(words)))}}, merges=[], unk_token="<unk>")))

    def no_weights(*args, **kwargs):
        raise AssertionError("the weights loaded before the tokenizer was checked")

    monkeypatch.setattr(loading.AutoModelForCausalLM, "from_pretrained", no_weights)
    with pytest.raises(DegenerateTokenizerError) as refused:
        loading.load_model(path, device="cpu")
    assert str(refused.value).startswith(f"{path}: the tokenizer is a BPE tokenizer with no merges: none of ")
    assert str(refused.value).endswith("it would cut text into single characters, not the model's own tokens")


def test_characters_per_token_tell_a_character_level_tokenizer():
    assert chars_per_token(byte_level_tokenizer()) == 1.0
    assert char_level_warning(byte_level_tokenizer(), "my/model") == (
        "model my/model: its tokenizer gives 1.00 characters a token on an English paragraph (sub-word "
        "tokenizers give about 4): it looks character-level, so prompts hold a fraction of the text their "
        "token lengths say")
    words = _fast(models.WordLevel(vocab=_words(), unk_token="<unk>"))
    assert chars_per_token(words) > 4 and char_level_warning(words, "my/model") is None


GRID = ("name: w\nmodels: [{model}]\npolicies: [full]\nbudgets: [64]\nchunk_sizes: [32]\n"
        "tasks: [{{name: needle, lengths: [512], samples: 1}}]\ngeneration: {{max_new_tokens: 2}}\n")


def test_submit_warns_once_about_a_local_model_with_a_character_level_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setattr(tokenizer_check, "_warned", set())
    path = _saved_model(tmp_path / "m", byte_level_tokenizer())
    runner = CliRunner()
    for model, warned in ((path, True), ("random:llama-tiny", False)):
        grid = tmp_path / "g.yaml"
        grid.write_text(GRID.format(model=model))
        args = ["submit", str(grid), "--dry-run", "--db", str(tmp_path / "no" / "i.sqlite")]
        res = runner.invoke(kdeval_app, args, env={"COLUMNS": "200"})
        assert res.exit_code == 0, res.output
        lines = [line for line in res.stderr.splitlines() if line.startswith("warning: model")]
        assert lines == ([f"warning: {char_level_warning(byte_level_tokenizer(), path)}"] if warned else [])


def test_an_offline_model_that_lost_its_merges_is_refused_before_it_is_cached(tmp_path, monkeypatch):
    """What the Gemma GGUF gave before: transformers' GemmaTokenizer over the vocabulary, with no merges."""
    from transformers.models.gemma.tokenization_gemma import GemmaTokenizer

    from kdeval.zoo import offline

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4, "h": 5, "i": 6, "hi": 7, "▁": 8}
    monkeypatch.setenv("KDEVAL_CACHE_DIR", str(tmp_path))
    fake = offline.OfflineModel(lambda: tmp_path / "x.gguf",
                                tokenizer=lambda gguf: GemmaTokenizer(vocab=vocab))
    monkeypatch.setitem(offline.OFFLINE_MODELS, "fake-gemma", fake)
    with pytest.raises(DegenerateTokenizerError) as refused:
        offline.safetensors_dir("fake-gemma")
    assert str(refused.value) == ("fake-gemma: the tokenizer is a BPE tokenizer with no merges: none of its "
                                  "1 multi-character pieces is ever produced; it would cut text into single "
                                  "characters, not the model's own tokens")
    assert not (tmp_path / "tokenizers").exists() and not (tmp_path / "models").exists()
