"""End to end on the real offline SmolLM2-135M: the full cache retrieves a needle at ~2K tokens."""
import pytest

from kdeval.demo import EXPECTED, needle_prompt
from kdeval.keydiff import Engine, EngineConfig, get_policy, load_model


@pytest.mark.slow
def test_full_cache_retrieves_needle_at_2k(data_dir):
    lm = load_model("smollm2-135m", device="cpu")
    ids = needle_prompt(lm.tokenizer, data_dir, context_tokens=2000, depth=0.5)
    assert 1900 < ids.shape[1] < 2300
    res = Engine(lm.model, get_policy("full"), EngineConfig(chunk_size=256)).generate(
        ids, max_new_tokens=8, eos_token_id=lm.eos_token_ids)
    answer = lm.tokenizer.decode(res.tokens[0], skip_special_tokens=True)
    assert EXPECTED in answer
    assert res.stats.kept_tokens == ids.shape[1] + len(res.tokens[0]) - 1
