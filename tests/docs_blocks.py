"""The fenced blocks of README.md and docs/*.md, as the docs test runs them.

A page's blocks run in order, in one temporary directory:

- ```yaml whose first line is a file-name comment (``# grid.yaml``) is written to that file, and so is a
  ```python block whose first line names a Python file (``# my_policies.py``: a plugin the page's commands load);
- ```python blocks run in one namespace (one interpreter per page);
- ```bash blocks run in bash (``set -e -o pipefail``) with ``kdeval`` being ``python -m kdeval.cli.app``;
  ```console blocks run their ``$ `` lines the same way.

A block that cannot run in a test says why in an HTML comment on the line before it:
``<!-- not run in tests: REASON -->``, or ``<!-- slow in tests: REASON -->`` for a block that a slow test runs
(the reason names that test, which reads the page).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN_KINDS = ("python", "bash", "console")
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
_MARK = re.compile(r"<!--\s*(not run|slow) in tests:\s*(.*?)\s*-->\s*$", re.S)
_FILE = re.compile(r"^#\s*([\w.-]+\.(?:ya?ml|txt|jsonl?))\s*$")
_PY_FILE = re.compile(r"^#\s*(\w+\.py)\s*$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    kind: str
    text: str
    mark: str | None  # "not run", "slow" or None
    reason: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def file_name(self) -> str | None:
        """The file a yaml block defines (its first line's comment), if any."""
        first = self.text.split("\n", 1)[0]
        m = _FILE.match(first) if self.kind in ("yaml", "yml") else _PY_FILE.match(first) if self.kind == "python" \
            else None
        return m.group(1) if m else None


def pages() -> list[Path]:
    """README.md and the hand-written docs pages (the generated reference pages hold no commands)."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, with the exemption written on the line before it."""
    text = path.read_text(encoding="utf-8")
    out = []
    for m in _FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.search(before)
        out.append(Block(page=str(path.relative_to(REPO)), line=text.count("\n", 0, m.start()) + 1,
                         kind=m.group(1).lower(), text=m.group(2), mark=mark.group(1) if mark else None,
                         reason=mark.group(2) if mark else ""))
    return out


def commands(block: Block) -> str:
    """The shell text a bash or console block runs (a console block: its ``$ `` lines and their continuations)."""
    if block.kind == "bash":
        return block.text
    lines, taking = [], False
    for line in block.text.splitlines():
        if line.startswith("$ "):
            lines.append(line[2:])
            taking = line.endswith("\\")
        elif taking:
            lines.append(line)
            taking = line.endswith("\\")
    return "\n".join(lines) + "\n"
