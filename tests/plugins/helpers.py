"""Plugin sources the plugin tests write into temporary folders (never on the workers' path)."""
from __future__ import annotations

import textwrap
from pathlib import Path

NEWEST = '''
"""A policy of one's own: keep the newest tokens (a sliding window of N)."""
from dataclasses import dataclass

import torch

from kdeval.keydiff.policy.interface import Policy, ScoreContext


@dataclass
class {cls}(Policy):
    name = "{name}"
    rule = "keep the N most recent tokens"
    n_sink_tokens: int = 0

    def validate(self) -> None:
        if self.n_sink_tokens < 0:
            raise ValueError(f"n_sink_tokens: expected >= 0, got {{self.n_sink_tokens}}")

    def n_sink(self) -> int:
        return self.n_sink_tokens

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        return ctx.positions.float(){tail}
'''


def write_newest(folder: Path, module: str = "my_newest", name: str = "newest", tail: str = "",
                 cls: str = "Newest") -> Path:
    """A plugin file ``<folder>/<module>.py`` defining policy ``name`` (``tail``: code appended to its score
    line, e.g. `` * 1.0`` for an edit that changes nothing it computes)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{module}.py"
    path.write_text(textwrap.dedent(NEWEST.format(cls=cls, name=name, tail=tail)))
    return path
