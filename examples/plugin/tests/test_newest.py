"""The plugin's own test: its rule on inputs whose answer is known, then the engine keeps N + B."""
import torch

from kdeval.keydiff import Engine, EngineConfig
from kdeval.keydiff.policy.interface import ScoreContext
from kdeval.zoo import load_model

from kdeval_newest.policy import Newest


def test_scores_are_the_positions():
    positions = torch.tensor([[[5, 1, 9]]])
    scores = Newest().score(torch.zeros(1, 1, 3, 4), ScoreContext(0, positions, seen=10, n_new=1))
    assert scores.tolist() == [[[5.0, 1.0, 9.0]]]


def test_the_engine_keeps_the_sinks_and_the_newest():
    lm = load_model("random:llama-tiny", device="cpu")
    engine = Engine(lm.model, Newest(n_sink_tokens=4), EngineConfig(budget=32, chunk_size=16))
    state = engine.prefill(torch.arange(3, 123).unsqueeze(0))  # 120 tokens
    kept = state.cache.layers[0].view()[1][0, 0].sort().values.tolist()
    assert kept == [0, 1, 2, 3] + list(range(120 - 28, 120))  # 4 sinks + the 28 newest: N = 32
