"""Every command and Python block in README.md and docs/*.md runs as written (tests/docs_blocks.py says how),
and every block that does not run says why on the line before it."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.docs_blocks import REPO, RUN_KINDS, Block, blocks, commands, pages

# Runs the steps of one page in order, in the current directory: files, python (one namespace), shell.
DRIVER = r'''
import json, subprocess, sys, traceback
steps = json.load(open(sys.argv[1], encoding="utf-8"))
# Shell variables carry from one block of a page to the next (RUN=... then kdeval export $RUN), as in one terminal.
prelude = ('set -e -o pipefail -a\n[ -f .docs_env ] && . ./.docs_env\ntrap \'export -p > .docs_env\' EXIT\n'
           'kdeval() { "$DOCS_PYTHON" -m kdeval.cli.app "$@"; }\npython() { "$DOCS_PYTHON" "$@"; }\n')
namespace = {"__name__": "__docs__"}
for step in steps:
    if step["kind"] == "file":
        open(step["name"], "w", encoding="utf-8").write(step["text"])
    elif step["kind"] == "python":
        try:
            exec(compile(step["text"], step["where"], "exec"), namespace)
        except BaseException:
            traceback.print_exc()
            sys.exit(f"FAILED: the python block at {step['where']}")
    else:
        rc = subprocess.run(["bash", "-c", prelude + step["text"]]).returncode
        if rc != 0:
            sys.exit(f"FAILED (exit {rc}): the shell block at {step['where']}")
'''

EXEMPT_WORDS = ("make ", "ray job submit", "systemctl", "--address")


def steps(page_blocks: list[Block]) -> list[dict]:
    out = []
    for b in page_blocks:
        if b.file_name:
            out.append({"kind": "file", "name": b.file_name, "text": b.text})
        elif b.kind in RUN_KINDS and b.mark is None:
            out.append({"kind": "python" if b.kind == "python" else "shell", "where": b.where,
                        "text": b.text if b.kind == "python" else commands(b)})
    return out


def run_page(page: Path, tmp_path: Path, data_dir: Path) -> subprocess.CompletedProcess:
    (tmp_path / "examples").symlink_to(REPO / "examples")
    (tmp_path / "steps.json").write_text(json.dumps(steps(blocks(page))), encoding="utf-8")
    (tmp_path / "driver.py").write_text(DRIVER, encoding="utf-8")
    env = dict(os.environ, DOCS_PYTHON=sys.executable, KDEVAL_DATA_DIR=str(data_dir),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env.pop("KDEVAL_DB", None)
    return subprocess.run([sys.executable, "driver.py", "steps.json"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)


def _runnable(page: Path) -> bool:
    return any(b.kind in RUN_KINDS and b.mark is None for b in blocks(page))


#: Pages run side by side: a page spends most of its time starting interpreters, Ray and workers, one core each.
AT_ONCE = 3


def _work(page: Path) -> int:
    """How many runs and processes a page starts, roughly: its longest pages first keep the side-by-side runs even."""
    text = " ".join(b.text for b in blocks(page) if b.kind in RUN_KINDS and b.mark is None)
    return sum(text.count(w) for w in ("submit", "nightly", "run_grid", "kdeval "))


@pytest.fixture(scope="module")
def page_runs(request, tmp_path_factory, data_dir):
    """The pages this session's tests ask for, each run in its own directory, ``AT_ONCE`` at a time, by name."""
    asked = {item.callspec.params["page"] for item in request.session.items
             if getattr(item, "originalname", "") == "test_page_blocks_run_as_written"}
    with ThreadPoolExecutor(max_workers=AT_ONCE) as pool:
        yield {p.name: pool.submit(run_page, p, tmp_path_factory.mktemp(p.stem.replace(".", "_")), data_dir)
               for p in sorted(asked, key=_work, reverse=True)}


@pytest.mark.parametrize("page", [p for p in pages() if _runnable(p)], ids=lambda p: p.name)
def test_page_blocks_run_as_written(page, page_runs):
    done = page_runs[page.name].result()
    assert done.returncode == 0, f"{page.name}:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"


def test_every_block_runs_or_says_why_not():
    found = {p.name: blocks(p) for p in pages()}
    assert {"README.md", "grids.md", "policies.md", "tasks.md", "protocols.md", "service.md", "reports.md",
            "nightly.md", "python-api.md", "engine.md", "contributing.md"} <= set(found)
    for page_blocks in found.values():
        for b in page_blocks:
            if b.mark is not None:
                assert b.kind in RUN_KINDS, f"{b.where}: an exemption on a {b.kind or 'plain'} block, which never runs"
                assert len(b.reason) >= 10, f"{b.where}: the exemption must say why the block cannot run in a test"
            elif b.kind in RUN_KINDS:
                text = b.text if b.kind == "python" else commands(b)
                bad = [w for w in EXEMPT_WORDS if w in text]
                assert not bad, f"{b.where}: runs {bad[0]!r}, which a test cannot; mark it <!-- not run in tests: why -->"
            assert b.kind or not b.text.lstrip().startswith(("kdeval ", "$ ")), \
                f"{b.where}: a command in a block without a language; use ```bash"
    runnable = sum(b.kind in RUN_KINDS and b.mark is None for bs in found.values() for b in bs)
    assert runnable >= 15


def test_slow_blocks_name_the_test_that_runs_them():
    for page in pages():
        for b in blocks(page):
            if b.mark == "slow":
                named = [w for w in b.reason.replace("(", " ").replace(")", " ").split() if w.startswith("tests/")]
                assert named and all((REPO / w).is_file() for w in named), b.where
                page_name = Path(b.page).name
                assert any(page_name in (REPO / w).read_text(encoding="utf-8") for w in named), \
                    f"{b.where}: {named} does not read {page_name}"


def test_the_marks_are_found(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("<!-- not run in tests: needs a Ray cluster -->\n```bash\nkdeval submit g.yaml --address auto\n```\n"
                    "\n```console\n$ kdeval ls \\\n  --db x\nrun output\n$ kdeval status\n```\n"
                    "```yaml\n# g.yaml\nname: g\n```\n", encoding="utf-8")
    import tests.docs_blocks as db
    old = db.REPO
    db.REPO = tmp_path
    try:
        a, c, y = blocks(page)
    finally:
        db.REPO = old
    assert (a.mark, a.reason, a.kind) == ("not run", "needs a Ray cluster", "bash")
    assert c.mark is None and commands(c) == "kdeval ls \\\n  --db x\nkdeval status\n"
    assert y.file_name == "g.yaml" and y.text.startswith("# g.yaml\n")


def test_relative_links_point_at_files_in_the_repository():
    for page in [*pages(), *sorted((REPO / "docs" / "reference").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(REPO)}: link to missing {target}"
