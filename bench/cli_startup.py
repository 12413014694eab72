"""CLI start-up time: ``kdeval --help`` (and a few commands that only read) next to ``python -c "import typer"``,
the floor any Typer CLI pays.

Each command runs in a fresh interpreter ``--repeat`` times; the table gives the median and the fastest
wall time, and which of torch, matplotlib, Ray, SQLAlchemy and pyarrow the command imported.

    python bench/cli_startup.py                  # ~20 s; prints a Markdown table
    python bench/cli_startup.py --repeat 15 --out bench/out/cli_startup.md
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("torch", "matplotlib", "ray", "sqlalchemy", "pyarrow")


def _kdeval(args: list[str]) -> str:
    """Python code that runs ``kdeval ARGS`` in-process and prints the heavy modules it imported."""
    return ("import sys\nfrom kdeval.cli.app import main\n"
            f"sys.argv = ['kdeval', *{args!r}]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            f"print('IMPORTED', ','.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)")


def measure(code: str, repeat: int) -> tuple[float, float, str]:
    """(median s, fastest s, heavy modules imported) of ``python -c code`` in fresh interpreters."""
    times, imported = [], ""
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        times.append(time.perf_counter() - t0)
        imported = next((ln.split(" ", 1)[1] if " " in ln else "" for ln in out.stderr.splitlines()
                         if ln.startswith("IMPORTED")), imported)
    return statistics.median(times), min(times), imported


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=9, help="fresh interpreters per command (default 9)")
    ap.add_argument("--out", type=Path, help="also write the table to this file")
    args = ap.parse_args()
    db = str(Path(tempfile.mkdtemp(prefix="kdeval-bench-")) / "none.sqlite")  # status: a missing index, exit 2
    cases = [
        ('python -c "import typer"', "import typer\nprint('IMPORTED', file=__import__('sys').stderr)"),
        ("kdeval --help", _kdeval(["--help"])),
        ("kdeval tasks", _kdeval(["tasks"])),
        ("kdeval report --help", _kdeval(["report", "--help"])),
        ("kdeval generate --help", _kdeval(["generate", "--help"])),
        ("kdeval status (no index)", _kdeval(["status", "--db", db])),
    ]
    lines = [f"Python {sys.version.split()[0]}, {args.repeat} fresh interpreters per row", "",
             "| command | median s | fastest s | imports (of torch, matplotlib, ray, sqlalchemy, pyarrow) |",
             "|---|---:|---:|---|"]
    for name, code in cases:
        med, best, imported = measure(code, args.repeat)
        lines.append(f"| `{name}` | {med:.3f} | {best:.3f} | {imported or 'none'} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
