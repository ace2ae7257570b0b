"""Power of the audit card's impact-ratio reading: how low a ratio must be for the card to read it "below 0.8".

The declared simulation behind each Method B card's power line and `biasaudit plan`. One audit: P source
photos, 5 categories; photo u and category c have a true rate π_uc = logistic(a_c + σ·z_u) (z ~ N(0, 1), a
photo effect the categories share, σ = PHOTO_SD), with a_c solved so that E[π_uc] is 0.5 for four categories
and 0.5·r for the fifth (its true impact ratio r). Each photo and category has 1 + Poisson(m − 1) comparisons
(mean m), won ~ Binomial(n, π). The card's own `impact_table` (the same cluster bootstrap and pairwise-ratio
interval) reads the fifth category; power = the share of audits in which its whole interval lies under 0.8
(`below_four_fifths`). The grid: photos × mean comparisons per photo and category × true ratio.

    python benchmarks/power.py [--reps 200] [--n-boot 400]

writes data/reference/power/impact_ratio.csv (read by biasaudit.report.power).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import optimize

from biasaudit.report.audit_card import Resampling, impact_table

OUT = Path(__file__).resolve().parents[1] / "data" / "reference" / "power" / "impact_ratio.csv"
PHOTOS = (6, 12, 24, 48, 96)
PER_PHOTO = (2, 8, 32)  # mean comparisons (2AFC) or answers (scores) per photo and category
RATIOS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8)
BASE_RATE, PHOTO_SD, CATEGORIES, LEVEL = 0.5, 0.5, 5, 0.95
_X, _W = np.polynomial.hermite_e.hermegauss(80)


def intercept(mu: float, sd: float = PHOTO_SD) -> float:
    """a with E[logistic(a + sd·Z)] = mu (Gauss–Hermite)."""
    return optimize.brentq(lambda a: float(_W @ (1 / (1 + np.exp(-(a + sd * _X)))) / _W.sum()) - mu, -30, 30)


def power(photos: int, per_photo: int, ratio: float, reps: int, n_boot: int, seed: int = 0) -> float:
    rng = np.random.default_rng([seed, photos, per_photo, int(round(ratio * 1000))])
    mus = np.array([BASE_RATE] * (CATEGORIES - 1) + [BASE_RATE * ratio])
    a = np.array([intercept(mu) for mu in mus])
    cats = [f"g{j}" for j in range(CATEGORIES)]
    hits = 0
    for rep in range(reps):
        eta = a + PHOTO_SD * rng.normal(size=(photos, 1))
        n = 1 + rng.poisson(per_photo - 1, size=(photos, CATEGORIES))
        won = rng.binomial(n, 1 / (1 + np.exp(-eta)))
        t = impact_table(cats, won.astype(float), n.astype(float), Resampling(n_boot, LEVEL, "percentile", rep))
        hits += bool(t["below_four_fifths"].iloc[-1])
    return hits / reps


def main(argv: list[str] | None = None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--n-boot", type=int, default=400)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    rows = []
    for P in PHOTOS:
        for m in PER_PHOTO:
            t = time.perf_counter()
            for r in RATIOS:
                p = power(P, m, r, args.reps, args.n_boot)
                rows.append({"photos": P, "per_photo": m, "true_ratio": r, "power": p, "replications": args.reps,
                             "mc_se": float(np.sqrt(max(p * (1 - p), 1e-12) / args.reps)), "n_boot": args.n_boot,
                             "categories": CATEGORIES, "base_rate": BASE_RATE, "photo_sd": PHOTO_SD, "level": LEVEL})
            print(f"{P} photos × {m} per photo: " + ", ".join(f"{x['true_ratio']}: {x['power']:.2f}"
                                                           for x in rows[-len(RATIOS):])
                  + f" ({time.perf_counter() - t:.0f} s)", flush=True)
    table = pd.DataFrame(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    return table


if __name__ == "__main__":
    main()
