"""The generated reference pages in docs/reference/ are what the code generates now (``make docs``)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from kdeval.cli import reference

DOCS = Path(__file__).resolve().parents[1] / "docs" / "reference"


def stale(root: Path, name: str, generated: str) -> str | None:
    """Why ``root/name`` is not the generated page (naming the command that regenerates it), or None."""
    page = root / name
    if not page.exists():
        return f"docs/reference/{name} is missing; run `{reference.REGENERATE}`"
    if page.read_text(encoding="utf-8") != generated:
        return f"docs/reference/{name} differs from what the code generates; run `{reference.REGENERATE}`"
    return None


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """The pages as ``make docs`` writes them: its command, in a fresh interpreter (tests register policies of
    their own into this one)."""
    out = tmp_path_factory.mktemp("reference")
    res = subprocess.run([sys.executable, "-m", "kdeval.cli.reference", str(out)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    return out


@pytest.mark.parametrize("name", ["grid.md", "policies.md", "tasks.md", "models.md"])
def test_committed_page_is_up_to_date(name, generated):
    problem = stale(DOCS, name, (generated / name).read_text(encoding="utf-8"))
    assert problem is None, problem


def test_a_stale_or_missing_page_names_the_command(tmp_path):
    (tmp_path / "grid.md").write_text("old\n", encoding="utf-8")
    assert stale(tmp_path, "grid.md", "new\n") == (
        "docs/reference/grid.md differs from what the code generates; run `make docs`")
    assert "is missing; run `make docs`" in stale(tmp_path, "tasks.md", "x")
    assert stale(tmp_path, "grid.md", "old\n") is None


def test_pages_have_no_double_blank_lines_and_every_grid_field_a_meaning():
    pages = reference.pages()
    assert sorted(pages) == ["grid.md", "models.md", "policies.md", "tasks.md"]
    for name, text in pages.items():
        assert "\n\n\n" not in text, name
    rows = [r for r in pages["grid.md"].splitlines() if r.startswith("| `")]
    assert len(rows) > 40
    empty = [r.split("|")[1].strip() for r in rows if not r.rstrip().rstrip("|").split(" | ")[-1].strip()]
    assert not empty, f"grid fields without a description: {empty}"


def test_grid_sections_say_where_they_live_and_links_resolve():
    grid = reference.pages()["grid.md"]
    headings = re.findall(r"^## (.+)$", grid, flags=re.M)
    assert {"`models[]`", "`generation`", "`protocol`", "`nightly`", "`nightly.tracked[]`"} <= set(headings)
    assert not any("Spec" in h for h in headings), headings
    anchors = {reference._anchor(h) for h in headings}
    for target in re.findall(r"\]\(#([^)]+)\)", grid):
        assert target in anchors, target
