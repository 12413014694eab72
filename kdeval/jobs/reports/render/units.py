"""The one formatter of every report output: how each field is printed and titled.

Rows keep raw numbers (JSON and CSV write them as they are, the unit in the field name: ``*_s``,
``*_bytes``, ``*_tokens``, ``*_tok_s``; scores in points). The terminal, Markdown and HTML print the same
text for a value, through :func:`text`:

* points (scores, deltas, CIs): 2 decimals;
* seconds, tokens per second and ratios: 3 significant digits;
* token counts and sample counts: integers;
* bytes: MiB or GiB, the same unit for a whole column (:func:`bytes_unit`), named in its header.

Rows hold numbers unrounded (:func:`kdeval.jobs.reports.report_rows.stored`); JSON and CSV keep every digit, and
rounding happens only when a value is printed.
"""
from __future__ import annotations

import math
from typing import Any

#: The kind of each numeric field of the report's rows (fields not listed are text or plain integers).
KINDS: dict[str, str] = {
    **{f: "points" for f in ("value", "ref_value", "delta", "ci_low", "ci_high", "a_value", "b_value", "decay",
                             "decay_low", "decay_high")},
    "depth": "percent",
    **{f: "seconds" for f in ("ttft_median_s", "a_ttft_s", "b_ttft_s")},
    **{f: "rate" for f in ("decode_tok_s",)},
    **{f: "ratio" for f in ("ttft_ratio", "ttft_ratio_low", "ttft_ratio_high", "decode_ratio", "decode_ratio_low",
                            "decode_ratio_high", "kv_bytes_ratio", "kv_ratio")},
    **{f: "tokens" for f in ("prompt_tokens", "peak_kv_tokens")},
    **{f: "bytes" for f in ("peak_kv_bytes", "peak_memory_bytes", "model_weight_bytes", "a_kv_bytes", "b_kv_bytes",
                                  "kv_bytes")},
}

#: Fewer paired samples than this and a CI says little: every output marks it with :data:`FEW_MARK`.
MIN_CI_SAMPLES = 10
FEW_MARK = "†"

MIB, GIB = 2**20, 2**30


def significant(value: float, digits: int = 3) -> int:
    """Decimals that keep ``digits`` significant digits of ``value`` (0 for large numbers)."""
    if value == 0 or not math.isfinite(value):
        return 0
    return max(0, digits - 1 - math.floor(math.log10(abs(value))))


def number(value: float) -> str:
    """A float with 3 significant digits and no exponent: ``3.24``, ``22.7``, ``0.0625``, ``1234``."""
    return f"{value:.{significant(value)}f}"


def points(value: float | None, signed: bool = False) -> str:
    """A score or delta in points: ``75.00``, ``+1.50`` (signed), '' for None."""
    if value is None:
        return ""
    return f"{value:+.2f}" if signed and value != 0 else f"{value:.2f}"


def bytes_unit(values: list[int | None]) -> tuple[str, int]:
    """The unit a column of byte counts is printed in: GiB when its largest value reaches 1 GiB, else MiB."""
    present = [v for v in values if v is not None]
    return ("GiB", GIB) if present and max(present) >= GIB else ("MiB", MIB)


def text(value: Any, name: str = "", unit: int = MIB) -> str:
    """How the terminal, Markdown and HTML print ``value`` of field ``name`` ('' for None); bytes in ``unit``."""
    if value is None:
        return ""
    kind = KINDS.get(name)
    if kind == "points":
        return points(value)
    if kind == "percent":
        return f"{value:g}"
    if kind in ("seconds", "rate", "ratio"):
        return number(float(value))
    if kind == "tokens":
        return str(int(value))
    if kind == "bytes":
        return number(value / unit)
    if isinstance(value, float):
        return number(value)
    return str(value)


def interval(low: float | None, high: float | None, name: str, n: int | None = None) -> str:
    """``[low, high]`` in the field's format, marked ``†`` when it rests on fewer than
    :data:`MIN_CI_SAMPLES` paired samples (``n``); '' without an interval."""
    if low is None or high is None:
        return ""
    mark = FEW_MARK if n is not None and n < MIN_CI_SAMPLES else ""
    return f"[{text(low, name)}, {text(high, name)}]{mark}"


def few_samples_legend() -> str:
    """What the mark of :func:`interval` means (the caption of every table that shows one)."""
    return f"{FEW_MARK} CI from fewer than {MIN_CI_SAMPLES} paired samples: it says little"
