"""Power of Method A's corrected TVD: how many prompts × images per prompt an audit needs to tell a generator
whose mean TVD to the benchmark is δ from one that matches it.

The declared simulation behind `biasaudit plan --tvd`. One audit: P prompts with benchmark shares
q ~ Dirichlet(5·BASE) over the five groups (benchmarks/calibration.py's BASE, a majority-White mix); the
generator's true shares are p = (1 − s)·q + s·SKEW, a pull toward a more homogeneous majority-White mix
(calibration.SKEW), with s set so that the population mean TVD(p, q) is δ (E over the Dirichlet, Monte Carlo);
n images per prompt, each image's apparent group drawn from p and read by the SIMULATED classifier's declared
confusion matrix (params.classify's DEFAULT_SIM_CONFUSION), which the analysis takes as known. The report's
own `debiased_tvd` (the corrected TVD every card and the front page lead with: classifier error and finite n
corrected, honest interval) reads the audit; power = the share of audits whose honest interval excludes 0
(low > 0: a distortion detected; at δ = 0 that share is the false-detection rate). The median interval width is kept too (how precisely δ is estimated).

Common random numbers: within a replication the smaller audits are the first P prompts and the first n
images of each prompt of the largest one, and every δ reuses the same uniform draws (only s moves).

    python benchmarks/tvd_power.py [--reps 60] [--n-boot 100]

writes data/reference/power/tvd.csv (read by biasaudit.report.power; about 10 minutes on one core).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration as cal  # the benchmark mix (BASE), the pull (SKEW) and the declared confusion

from biasaudit import GROUPS
from biasaudit.stats.correction import debiased_tvd
from biasaudit.stats.tvd import tvd

OUT = Path(__file__).resolve().parents[1] / "data" / "reference" / "power" / "tvd.csv"
PROMPTS = (5, 10, 20, 40, 80)
IMAGES = (12, 25, 50, 100, 200)  # images per prompt
TVDS = (0.0, 0.05, 0.1, 0.2)  # 0: a generator that matches the benchmark (the false-detection rate)
LEVEL = 0.95


def pull_for(delta: float, samples: int = 200_000, seed: int = 1) -> float:
    """s with E[TVD((1 − s)q + s·SKEW, q)] = δ: TVD is s·TVD(SKEW, q), so s = δ / E[TVD(SKEW, q)]."""
    q = np.random.default_rng(seed).dirichlet(5 * cal.BASE, size=samples)
    s = delta / float(tvd(np.broadcast_to(cal.SKEW, q.shape), q).mean())
    if not 0 <= s <= 1:
        raise ValueError(f"a mean TVD of {delta} is beyond this pull (largest: {delta / s:.3f})")
    return s


def powers(reps: int, n_boot: int, seed: int = 0, prompts=PROMPTS, images=IMAGES, tvds=TVDS) -> pd.DataFrame:
    M = cal.default_confusion()
    pulls = {d: pull_for(d) for d in tvds}
    hits = {(P, n, d): [] for P in prompts for n in images for d in tvds}
    for rep in range(reps):
        rng = np.random.default_rng([seed, rep])
        q = rng.dirichlet(5 * cal.BASE, size=max(prompts))
        u = rng.random(size=(max(prompts), max(images)))  # one uniform per image: its classified label
        for d, s in pulls.items():
            seen = ((1 - s) * q + s * cal.SKEW) @ M  # the classifier's shares of each prompt's images
            labels = (u[..., None] > np.cumsum(seen, axis=1)[:, None, :-1]).sum(axis=2)
            for n in images:
                counts = np.stack([np.bincount(row, minlength=len(GROUPS)) for row in labels[:, :n]]).astype(float)
                for P in prompts:
                    iv, _ = debiased_tvd(counts[:P], q[:P], None, GROUPS, n_boot=n_boot, level=LEVEL, seed=rep, M=M)
                    hits[P, n, d].append((bool(iv.low > 0), float(iv.high - iv.low)))
    rows = []
    for (P, n, d), got in hits.items():
        found = np.array([g[0] for g in got])
        pw = float(found.mean())
        rows.append({"prompts": P, "images_per_prompt": n, "true_tvd": d, "power": pw,
                     "median_width": float(np.median([g[1] for g in got])), "replications": reps,
                     "mc_se": float(np.sqrt(max(pw * (1 - pw), 1e-12) / reps)), "n_boot": n_boot, "level": LEVEL,
                     "pull": pulls[d]})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--n-boot", type=int, default=100)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    t = time.perf_counter()
    table = powers(args.reps, args.n_boot)
    print(table.pivot_table(index=["true_tvd", "prompts"], columns="images_per_prompt", values="power").round(2))
    print(f"({time.perf_counter() - t:.0f} s)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    return table


if __name__ == "__main__":
    main()
