"""The Python API page's "The engine from Python" runs as written: its python blocks, read from
docs/python-api.md, executed in order in one namespace, with nothing substituted (the real offline SmolLM2-135M,
as the page loads it)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"
SECTION = "## The engine from Python"


def python_blocks(text: str, section: str) -> list[str]:
    """The fenced ```python blocks of ``section`` (from its heading to the next ``## `` heading)."""
    start = text.index(f"\n{section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end != -1 else len(text)]
    return re.findall(r"^```python\n(.*?)^```$", body, flags=re.S | re.M)


def test_python_blocks_are_found():
    blocks = python_blocks(PAGE.read_text(encoding="utf-8"), SECTION)
    assert blocks and all("load_model" in b or "engine" in b for b in blocks)


@pytest.mark.slow
def test_engine_from_python_runs_as_written(capsys):
    namespace: dict = {"__name__": "readme"}
    for block in python_blocks(PAGE.read_text(encoding="utf-8"), SECTION):
        exec(compile(block, f"{PAGE.name}: {SECTION}", "exec"), namespace)
    printed = capsys.readouterr().out
    assert printed.strip(), "the example printed nothing"
    res = namespace.get("res")
    if res is not None:  # the example's first run: it really generated and reported its stats
        assert res.tokens and res.stats.prompt_tokens > 0
