"""Homogeneity gap, its cluster bootstrap and its permutation test: ours (biasaudit.stats.homogeneity)
against the baseline — the pre-issue-17 implementation frozen in benchmarks/baseline_homogeneity_v0.py
(float64 copies, sparse permutations across all images) — and against the floor, one pass over X
(X.sum(axis=0) on the float32 matrix).

Fair by construction: the same float32 X, labels and prompts for both sides; imports and data
generation outside the timing; every function warmed once; repetitions interleaved (baseline, ours,
floor, baseline, ours, …) and the median reported; peak memory measured in a separate untimed call
(tracemalloc, bytes allocated beyond X). Both sides do the same work: the point estimate, a
bootstrap of `--n-boot` replicates over `--prompts` prompts, and `--n-perm` permutations; ours also
reports its default within-prompt design (the baseline has none).

    python benchmarks/bench_homogeneity.py [--sizes 2000 10000 45000] [--dim 1024] [--reps 3]
        [--n-boot 1000] [--n-perm 1000] [--prompts 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import baseline_homogeneity_v0 as base

from biasaudit.stats import homogeneity as ours

GROUPS = np.array(["white", "black", "asian", "hispanic", "other"])


def peak_mb(fn) -> float:
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 1e6


def interleaved(fns: dict, reps: int) -> dict[str, float]:
    for fn in fns.values():  # warm every side once
        fn()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[2000, 10000, 45000])
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--n-perm", type=int, default=1000)
    ap.add_argument("--prompts", type=int, default=50)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"d = {args.dim}, float32; bootstrap {args.n_boot} × {args.prompts} prompts; {args.n_perm} permutations; "
          f"median of {args.reps} interleaved repetitions\n")
    head = f"{'N':>6} {'part':<22} {'base s':>8} {'ours s':>8} {'base/ours':>9} {'ours/floor':>10} " \
           f"{'base MB':>8} {'ours MB':>8} {'ours/X':>7}"
    print(head)
    for n in args.sizes:
        X = (rng.normal(size=(n, args.dim)) + 0.3).astype(np.float32)
        labels = rng.choice(GROUPS, size=n, p=[0.5, 0.15, 0.15, 0.15, 0.05])
        prompts = rng.integers(0, args.prompts, n)
        x_mb = X.nbytes / 1e6
        parts = {
            "gap (point)": (lambda: base.homogeneity_gap(X, labels),
                            lambda: ours.homogeneity_gap(X, labels, small_group=30), 1),
            "bootstrap": (lambda: base.bootstrap_gap(X, labels, prompts, n_boot=args.n_boot),
                          lambda: ours.bootstrap_gap(X, labels, prompts, n_boot=args.n_boot), 1),
            "permutation across": (lambda: base.permutation_pvalue(X, labels, n_perm=args.n_perm),
                                   lambda: ours.permutation_pvalue(X, labels, n_perm=args.n_perm, design="across"),
                                   args.n_perm),
            "permutation within": (None, lambda: ours.permutation_pvalue(X, labels, n_perm=args.n_perm,
                                                                         clusters=prompts, design="within"), args.n_perm),
        }
        got, ref = ours.homogeneity_gap(X, labels, small_group=30), base.homogeneity_gap(X, labels)
        diff = float(np.nanmax(np.abs(got["gap"].to_numpy() - ref["gap"].to_numpy())))
        for name, (b, o, per) in parts.items():
            fns = {"floor": lambda: X.sum(axis=0), "ours": o}
            if b is not None:
                fns["base"] = b
            t = interleaved(fns, args.reps)
            mem_o = peak_mb(o)
            mem_b = peak_mb(b) if b is not None else float("nan")
            tb = t.get("base", float("nan"))
            print(f"{n:>6} {name:<22} {tb:>8.3f} {t['ours']:>8.3f} {tb / t['ours']:>9.1f} "
                  f"{t['ours'] / per / t['floor']:>10.2f} {mem_b:>8.0f} {mem_o:>8.0f} {mem_o / x_mb:>7.2f}", flush=True)
        print(f"{n:>6} X = {x_mb:.0f} MB; floor (one pass) = {t['floor'] * 1e3:.1f} ms; max |Δgap| ours vs base {diff:.1e}"
              "; ours/floor of a permutation test is per permutation")


if __name__ == "__main__":
    main()
