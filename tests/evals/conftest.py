"""Tiny tokenizers for the evaluation tests (no model download, no engine)."""
from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


class ByteTokenizer:
    """One token per UTF-8 byte (ids 3..258), BOS=1 added by default, no chat template."""

    chat_template = None
    bos_token_id = 1
    eos_token_id = 2

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [b + 3 for b in text.encode("utf-8")]
        return ([self.bos_token_id] + ids) if add_special_tokens else ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return bytes(i - 3 for i in ids if i >= 3).decode("utf-8", errors="replace")


class ChatByteTokenizer(ByteTokenizer):
    """ByteTokenizer with a simple chat template."""

    chat_template = "<user>{content}</user><assistant>"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


@pytest.fixture
def byte_tok() -> ByteTokenizer:
    return ByteTokenizer()


@pytest.fixture
def chat_tok() -> ChatByteTokenizer:
    return ChatByteTokenizer()


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def emulated_graphs(monkeypatch) -> None:
    """Every engine built while the test runs takes the graph path emulated (``Engine(**EMULATED)``:
    the static layout run with plain calls on a CPU), so ``RunSettings(engine={"cuda_graphs": True})`` runs it:
    the engine's test hooks are no ``run_task`` options."""
    import functools

    from kdeval.keydiff import engine

    from ..keydiff.oracles import EMULATED

    monkeypatch.setattr(engine.Engine, "__init__", functools.partialmethod(engine.Engine.__init__, **EMULATED))


@pytest.fixture
def captured_steps(monkeypatch) -> list:
    """The arguments of every graph step made while the test runs (its static inputs: a CUDA graph, or the emulated
    graphs' plain calls on CPU)."""
    from kdeval.keydiff.step import graphs

    made: list = []
    init = graphs.StepInputs.__init__

    def counted(self, *args, **kwargs):
        made.append(args)
        init(self, *args, **kwargs)

    monkeypatch.setattr(graphs.StepInputs, "__init__", counted)
    return made


@pytest.fixture(scope="session")
def smollm2():
    """The offline SmolLM2-135M (skips where its package is missing)."""
    from kdeval.zoo.loading import load_model

    try:
        return load_model("smollm2-135m")
    except Exception as e:  # noqa: BLE001 - the offline package is missing on this machine
        pytest.skip(f"smollm2-135m not loadable here: {e}")
