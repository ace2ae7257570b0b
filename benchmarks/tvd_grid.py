"""Which TVD point estimate earns its place: every candidate against the raw TVD on the random grid.

The grid (benchmarks/data/tvd_grid.json, drawn once from GRID_SEED by `--write`; its definition is in
benchmarks/calibration.py) holds random distortions and confusion matrices around the benchmark's. Each
replication simulates one audit at one grid point (calibration.distortion_audit: true shares known,
classified counts, M estimated from a 300-image reliability sample) and scores, against the true mean
TVD over its prompts:

- raw: the mean TVD of the classified shares (what the paper reports);
- linear plug-in: mean ½Σ|M̂⁻ᵀπ̂ − q| (classifier error corrected, finite-n bias left);
- bootstrap bias-corrected: mean ½Σ(2|d| − E|N(d, sd²)|), the infinite-B bootstrap correction per cell;
- EB, prior at 0: each |d| shrunk under δ ~ N(0, τ²) (stats.correction.eb_abs_deviation, the previous estimate);
- EB, prior at the pooled deviation: stats.correction.eb_tvd, the estimate debiased_tvd reports;
- MSE-weighted: (1 − w)·raw + w·EB with w from bootstrap MSEs (M re-estimated per replicate; debiased_tvd);
- read by the report: point_rule's choice (the MSE-weighted estimate from MIN_PROMPTS_POINT prompts, else raw).

A replication whose M̂ is not identifiable has no corrected estimate (counted as `undefined`, not closer;
the report then reads raw).

Per scale and estimator: the share of replications closer to the truth than raw, the mean absolute
error (over the defined ones), the mean error, the lowest closer share over the grid's points, and (for
debiased_tvd) the honest interval's coverage and mean width.

    python benchmarks/tvd_grid.py [--reps 600] [--n-boot 199] [--write]

writes benchmarks/results/tvd_grid.csv and prints it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration as cal  # the grid's definition and data-generating process

from biasaudit import GROUPS

OUT = Path(__file__).resolve().parent / "results" / "tvd_grid.csv"
# (scale, prompts, images per prompt, replications × --reps): more at the small scales, which are cheap
# and where the point rule's threshold is decided (0.60 must be told apart from the measured share)
SCALES = (("paper", 50, 100, 1), ("demo, all prompts", 15, 12, 1), ("below the rule", 8, 12, 2),
          ("demo, per category", 5, 12, 4), ("below the rule", 3, 12, 2))
ESTIMATORS = ("raw", "linear plug-in", "bootstrap bias-corrected", "EB, prior at 0", "EB, prior at the pooled deviation",
              "MSE-weighted", "read by the report (point_rule)")


def write_grid(path: Path = cal.GRID_FILE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    head = {"seed": cal.GRID_SEED, "distortion_concentration": cal.DISTORTION_CONCENTRATION,
            "confusion_concentration": cal.CONFUSION_CONCENTRATION, "groups": list(GROUPS)}
    points = ",\n  ".join(json.dumps(p) for p in cal.draw_grid())  # one point a line
    path.write_text(json.dumps(head)[:-1] + f', "points": [\n  {points}\n]}}\n')


def estimates(counts: np.ndarray, q: np.ndarray, E: np.ndarray | None, M: np.ndarray, n_boot: int, seed: int
              ) -> tuple[dict, object]:
    """Every candidate on one audit, and debiased_tvd's interval (whose estimate must equal eb_tvd's)."""
    from biasaudit.stats.correction import (
        _share_sd,
        debiased_tvd,
        eb_abs_deviation,
        eb_tvd,
        folded_normal_mean,
        matrix_from_counts,
        point_rule,
    )
    from biasaudit.stats.tvd import tvd

    n = counts.sum(axis=1)
    pi = counts / n[:, None]
    Mhat = matrix_from_counts(E.sum(axis=0), len(GROUPS)) if E is not None else M
    W = np.linalg.inv(Mhat.T)
    d, sd = pi @ W.T - q, _share_sd(pi, n, W)
    out = {"raw": float(tvd(pi, q).mean()), "linear plug-in": float(0.5 * np.abs(d).sum(axis=1).mean()),
           "bootstrap bias-corrected": float(0.5 * (2 * np.abs(d) - folded_normal_mean(d, sd)).sum(axis=1).mean()),
           "EB, prior at 0": float(0.5 * eb_abs_deviation(d, sd).sum(axis=1).mean()),
           "EB, prior at the pooled deviation": eb_tvd(d, sd)}
    iv, info = debiased_tvd(counts, q, E, GROUPS, n_boot=n_boot, seed=seed, M=None if E is not None else M)
    if not np.isfinite(iv.estimate):  # M̂ not identifiable (NaN with its reason): every candidate is undefined
        out = dict.fromkeys(out, np.nan) | {"raw": out["raw"]}
    else:
        assert abs(iv.estimate - out["EB, prior at the pooled deviation"]) < 1e-12
    out["MSE-weighted"] = info["mse_weighted"]
    out["read by the report (point_rule)"] = point_rule(len(counts), info["mse_weighted"], out["raw"], info["weight"])[0]
    return out, iv


def evaluate(P: int, n: int, points: list[dict], reps: int, n_boot: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng([seed, P, n])
    err, covered, width, where = {k: [] for k in ESTIMATORS}, [], [], []
    for rep in range(reps):
        point = points[rep % len(points)]
        counts, q, E, M, truth = cal.distortion_audit(rng, P, n, point, declared=False)
        est, iv = estimates(counts, q, E, M, n_boot, rep)
        for k in ESTIMATORS:
            err[k].append(est[k] - truth)
        covered.append(iv.low <= truth <= iv.high)
        width.append(iv.high - iv.low)
        where.append(point["name"])
    raw = np.abs(np.array(err["raw"]))
    rows = []
    for k in ESTIMATORS:
        e = np.array(err[k])
        row = {"estimator": k, "closer_than_raw": float(np.mean(np.abs(e) < raw)) if k != "raw" else np.nan,
               "mae": float(np.nanmean(np.abs(e))), "mean_error": float(np.nanmean(e)), "raw_mae": float(raw.mean()),
               "undefined": int(np.isnan(e).sum())}
        if k.startswith("EB, prior at the pooled"):
            row |= {"interval_coverage": float(np.mean(covered)), "interval_mean_width": float(np.mean(width))}
        per = {name: float(np.mean(np.abs(e[[w == name for w in where]]) < raw[[w == name for w in where]]))
               for name in dict.fromkeys(where)}
        row["closer_min_over_points"] = min(per.values()) if k != "raw" else np.nan  # undefined: not closer
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=600)
    ap.add_argument("--n-boot", type=int, default=199)
    ap.add_argument("--write", action="store_true", help="redraw the grid file from its seed first")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    if args.write:
        write_grid()
    points, fail = cal.load_grid(), [cal.failing_case()]
    tables = []
    for scale, P, n, times in SCALES:
        tables.append(evaluate(P, n, points, times * args.reps, args.n_boot).assign(
            grid=f"random grid of {len(points)}", scale=scale, setting=f"{P} prompts × {n} images",
            replications=times * args.reps))
    tables.append(evaluate(50, 100, fail, args.reps, args.n_boot).assign(
        grid=fail[0]["name"], scale="paper", setting="50 prompts × 100 images", replications=args.reps))
    table = pd.concat(tables, ignore_index=True)
    table["closer_mc_se"] = np.sqrt(table["closer_than_raw"] * (1 - table["closer_than_raw"]) / table["replications"])
    table = table[["grid", "scale", "setting", "replications", "estimator", "closer_than_raw", "closer_mc_se",
                   "closer_min_over_points", "mae", "raw_mae", "mean_error", "undefined", "interval_coverage",
                   "interval_mean_width"]]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.round(4).to_csv(args.out, index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.round(4).to_string(index=False))
    return table


if __name__ == "__main__":
    main()
