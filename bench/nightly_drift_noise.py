"""False alarms and power of the nightly change-point rule (kdeval.jobs.nightly.drift.window_test).

Noise-only histories: n samples with success rates drawn once per history (uniform 0.2..0.95); every night
re-draws every sample's score (Bernoulli): the worst case, a fully nondeterministic stack. Slides: the same,
with every rate lowered by ``slide`` points a night. Prints the share of histories the rule flags.

    python bench/nightly_drift_noise.py --histories 2000
"""
from __future__ import annotations

import argparse

import numpy as np

from kdeval.jobs.nightly.drift import window_test


def flagged_share(histories: int, n: int, k: int, max_drop: float, slide: float, seed: int) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for h in range(histories):
        p = rng.uniform(0.2, 0.95, size=n)
        nights = np.stack([rng.random(n) < np.clip(p - slide / 100.0 * night, 0, 1) for night in range(2 * k)])
        _, flag = window_test(nights[k:].astype(float), nights[:k].astype(float), None, max_drop,
                              resamples=1000, seed=h, confidence=0.95)
        hits += flag
    return hits / histories


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--histories", type=int, default=2000)
    ap.add_argument("--samples", type=int, default=60)
    ap.add_argument("--nights", type=int, default=3, help="K")
    ap.add_argument("--max-drop", type=float, default=2.0)
    a = ap.parse_args()
    for slide in (0.0, 1.0, 2.0):
        share = flagged_share(a.histories, a.samples, a.nights, a.max_drop, slide, seed=0)
        kind = "noise only" if slide == 0 else f"slide {slide:g} points/night"
        print(f"K={a.nights} n={a.samples} max_drop={a.max_drop:g} {kind}: flagged {share:.2%} of {a.histories}")


if __name__ == "__main__":
    main()
