"""Power of the audit card's impact-ratio reading, per table: how low a ratio must be for the card to read it
"below 0.8", in the gender (2 categories), race (5) and race × gender (10) tables.

The declared simulation behind each Method B card's power lines and `biasaudit plan --ratio`. One audit: P
source photos, K categories (the table's); photo u and category c have a true rate

    π_uc = logistic(a_c + σ·z_u + τ·w_uc),   z_u, w_uc ~ N(0, 1) independent,

a photo effect the categories share (σ = PHOTO_SD) and one that differs by category (τ = CATEGORY_SD: a photo
may flatter one group's edit more than another's), with a_c solved so that E[π_uc] is 0.5 for K − 1
categories and 0.5·r for the last (its true impact ratio r). Each photo and category has 1 + Poisson(m − 1)
comparisons or answers (mean m), each won when a uniform draw is under π. The card's own `impact_table` (the
same cluster bootstrap and pairwise-ratio interval) reads the last category; power = the share of audits in
which its whole interval lies under 0.8 (`below_four_fifths`).

Common random numbers: within a replication, the smaller audits are the first P photos of the largest one, and
every true ratio reuses the same draws (only a_c of the last category moves), so power is monotone in the ratio
draw by draw and the curves along P carry no independent Monte-Carlo noise between sizes. The grid starts at
reflect_analysis.min_clusters (12): fewer photos are "no valid audit" on the card, so no power is stated.

    python benchmarks/power.py [--reps 80] [--n-boot 100] [--tables race]

writes data/reference/power/impact_ratio.csv (read by biasaudit.report.power; about 10 minutes on one core).
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
TABLES = {"gender": 2, "race": 5, "race × gender": 10}  # the card's tables and their categories
PHOTOS = (12, 24, 48, 96, 192, 384)
PER_PHOTO = (2, 8, 32)  # mean comparisons (2AFC) or answers (scores) per photo and category of the table
RATIOS = (0.5, 0.6, 0.7, 0.8)
BASE_RATE, PHOTO_SD, CATEGORY_SD, LEVEL = 0.5, 0.5, 0.5, 0.95
_X, _W = np.polynomial.hermite_e.hermegauss(80)


def intercept(mu: float, sd: float) -> float:
    """a with E[logistic(a + sd·Z)] = mu (Gauss–Hermite)."""
    return optimize.brentq(lambda a: float(_W @ (1 / (1 + np.exp(-(a + sd * _X)))) / _W.sum()) - mu, -30, 30)


def powers(categories: int, per_photo: int, reps: int, n_boot: int, seed: int = 0,
           photos: tuple[int, ...] = PHOTOS, ratios: tuple[float, ...] = RATIOS) -> dict[tuple[int, float], float]:
    """(photos, true ratio) → the share of `reps` audits whose last category is read below 0.8."""
    sd = float(np.hypot(PHOTO_SD, CATEGORY_SD))  # the marginal sd of the logit around a_c
    base = intercept(BASE_RATE, sd)
    targets = {r: intercept(BASE_RATE * r, sd) for r in ratios}
    cats = [f"g{j}" for j in range(categories)]
    top = max(photos)
    hits = dict.fromkeys(((p, r) for p in photos for r in ratios), 0)
    for rep in range(reps):
        rng = np.random.default_rng([seed, categories, per_photo, rep])
        eta = PHOTO_SD * rng.normal(size=(top, 1)) + CATEGORY_SD * rng.normal(size=(top, categories))
        n = 1 + rng.poisson(per_photo - 1, size=(top, categories))
        u = rng.random(size=(top, categories, int(n.max())))
        live = np.arange(u.shape[2]) < n[..., None]  # the draws of each photo and category's n trials
        for r, a_last in targets.items():
            a = np.full(categories, base)
            a[-1] = a_last
            pi = 1 / (1 + np.exp(-(a + eta)))
            won = ((u < pi[..., None]) & live).sum(axis=2)
            for p in photos:
                t = impact_table(cats, won[:p].astype(float), n[:p].astype(float),
                                 Resampling(n_boot, LEVEL, "percentile", rep))
                hits[p, r] += bool(t["below_four_fifths"].iloc[-1])
    return {k: v / reps for k, v in hits.items()}


def main(argv: list[str] | None = None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=80)
    ap.add_argument("--n-boot", type=int, default=100)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--tables", nargs="+", default=list(TABLES), choices=list(TABLES),
                    help="only these tables (each is seeded on its own: runs of single tables concatenate to the whole)")
    args = ap.parse_args(argv)
    rows = []
    for table, k in ((t, TABLES[t]) for t in args.tables):
        for m in PER_PHOTO:
            t = time.perf_counter()
            got = powers(k, m, args.reps, args.n_boot)
            for (p, r), pw in sorted(got.items()):
                rows.append({"table": table, "categories": k, "photos": p, "per_photo": m, "true_ratio": r,
                             "power": pw, "replications": args.reps,
                             "mc_se": float(np.sqrt(max(pw * (1 - pw), 1e-12) / args.reps)), "n_boot": args.n_boot,
                             "base_rate": BASE_RATE, "photo_sd": PHOTO_SD, "category_sd": CATEGORY_SD, "level": LEVEL})
            print(f"{table} × {m} per photo: " + ", ".join(f"{p}/{r}: {got[p, r]:.2f}" for p in PHOTOS
                                                          for r in (0.7,) if (p, r) in got)
                  + f" ({time.perf_counter() - t:.0f} s)", flush=True)
    table = pd.DataFrame(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    return table


if __name__ == "__main__":
    main()
