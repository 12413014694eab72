"""End to end on the real offline SmolLM2-135M: the full cache retrieves a needle at ~2K tokens."""
import json

import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig
from kdeval.zoo import load_model

NEEDLE = "The special magic number for Kyoto is 4817263."
QUESTION = "What is the special magic number for Kyoto mentioned in the text above?"
ANSWER_PREFIX = "The special magic number for Kyoto mentioned in the text is"


def needle_prompt(tokenizer, data_dir, context_tokens: int, depth: float) -> torch.Tensor:
    """``[1, L]``: the essays cut to ``context_tokens`` with the needle at ``depth``, chat-formatted."""
    text = json.loads((data_dir / "haystack" / "PaulGrahamEssays.json").read_text())["text"]
    hay = tokenizer.decode(tokenizer(text[: context_tokens * 8]).input_ids[:context_tokens])
    cut = hay.rfind(". ", 0, int(len(hay) * depth)) + 2
    messages = [{"role": "user", "content": f"{hay[:cut]}{NEEDLE} {hay[cut:]}\n\n{QUESTION}"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    return torch.cat([ids, tokenizer(ANSWER_PREFIX, return_tensors="pt").input_ids], dim=1)


@pytest.mark.slow
def test_full_cache_retrieves_needle_at_2k(data_dir):
    lm = load_model("smollm2-135m", device="cpu")
    ids = needle_prompt(lm.tokenizer, data_dir, context_tokens=2000, depth=0.5)
    assert 1900 < ids.shape[1] < 2300
    res = Engine(lm.model, get_policy("full"), EngineConfig(chunk_size=256)).generate(
        ids, max_new_tokens=8, eos_token_id=lm.eos_token_ids)
    answer = lm.tokenizer.decode(res.tokens[0], skip_special_tokens=True)
    assert "4817263" in answer
    assert res.stats.kept_tokens == ids.shape[1] + len(res.tokens[0]) - 1
