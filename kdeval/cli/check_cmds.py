"""`kdeval check-policy NAME`: the engine's invariant matrix (:mod:`kdeval.baselines.checks`) on one policy, built-in
or a plugin's, on tiny random models; prints what holds and, for what fails, the first counterexample.

Exit codes: 0 every check holds (or the family refuses the policy, said in one line), 1 some check fails, 2 bad
input (an unknown policy or parameter, a bad plugin)."""
from __future__ import annotations

import json
import time

import typer
from rich.text import Text

from kdeval.cli.consoles import stdout
from kdeval.cli.errors import EXIT_FAILED, EXIT_OK, bad_input
from kdeval.cli.plugin_opts import load_cli_plugins, plugin_option

STATUS_STYLE = {"holds": "green", "refused": "yellow", "fails": "bold red", "error": "bold red"}


def check_policy(
    name: str = typer.Argument(..., help="Policy name (see `kdeval policies`)."),
    param: list[str] = typer.Option([], "--param", help="policy parameter key=value (repeatable)"),
    family: list[str] = typer.Option([], "--family", help="Only these families (repeatable; default: all)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per finding."),
    plugin: list[str] = plugin_option(),
) -> None:
    """Run the engine's invariant matrix on one policy (built-in or plugin) on tiny random models."""
    from kdeval.cli.generate_cmds import parse_params, third_party_quiet

    load_cli_plugins(plugin)
    with third_party_quiet():
        from kdeval.baselines import get_policy
        from kdeval.baselines.checks import CHECKS, FAMILIES, run_matrix
        from kdeval.cluster.plugins import policy_origin

        with bad_input():
            params = parse_params(param)
            get_policy(name, **params)  # an unknown name or parameter: one line, exit 2
            unknown = [f for f in family if f not in FAMILIES and f not in FAMILIES.values()]
            if unknown:
                raise ValueError(f"--family: unknown {unknown[0]!r} (known: {', '.join(FAMILIES)})")
        out = stdout(markup=False)
        if not as_json:
            out.print(Text(f"check-policy {name} ({policy_origin(name)}): {len(CHECKS)} checks on "
                           f"{len(family) or len(FAMILIES)} families", style="bold"))
        t0 = time.perf_counter()

        def show(f) -> None:
            if as_json:
                print(json.dumps({"check": f.check, "family": f.family, "dtype": f.dtype, "status": f.status,
                                  "detail": f.detail}), flush=True)
                return
            line = Text.assemble((f"{f.status:8}", STATUS_STYLE[f.status]), f"{f.check} [{f.family}, {f.dtype}]")
            if f.detail:
                line.append(f": {f.detail}")
            out.print(line, highlight=False, soft_wrap=True)

        findings = run_matrix(lambda: get_policy(name, **params), family or None, on_finding=show)
    bad = [f for f in findings if not f.ok]
    if not as_json:
        if not findings:
            out.print(f"policy '{name}' never evicts: nothing to check")
        else:
            verdict = (f"{len(bad)} of {len(findings)} failed" if bad else
                       f"all {len(findings)} hold" + (" (some families refuse it)" if any(
                           f.status == "refused" for f in findings) else ""))
            out.print(Text(f"{verdict} in {time.perf_counter() - t0:.0f} s", style="bold red" if bad else "bold green"))
    raise typer.Exit(EXIT_FAILED if bad else EXIT_OK)


def register(app: typer.Typer) -> None:
    app.command("check-policy")(check_policy)
