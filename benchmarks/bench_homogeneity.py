"""Homogeneity gap: our O(N·d) group-sum implementation vs a straightforward pairwise one
(scikit-learn cosine_similarity with boolean group masks), at N = 2,000 / 10,000 / 45,000, d = 1024.

Prints time and peak memory of each and their ratios. The pairwise side needs an N×N float64 matrix
(45,000² × 8 B = 16 GB); it is skipped (and said so) when that exceeds --max-pairwise-gb.

    python benchmarks/bench_homogeneity.py [--sizes 2000 10000 45000] [--dim 1024] [--max-pairwise-gb 4]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

from biasaudit.stats.homogeneity import homogeneity_gap

GROUPS = np.array(["white", "black", "asian", "hispanic", "other"])


def pairwise(X: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    from sklearn.metrics.pairwise import cosine_similarity

    K = cosine_similarity(X)
    out = {}
    for g in np.unique(labels):
        m = labels == g
        n = m.sum()
        intra = (K[np.ix_(m, m)].sum() - np.trace(K[np.ix_(m, m)])) / (n * (n - 1))
        out[g] = intra - K[np.ix_(m, ~m)].mean()
    return out


def measure(fn, *args):
    tracemalloc.start()
    t = time.perf_counter()
    result = fn(*args)
    elapsed = time.perf_counter() - t
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return result, elapsed, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[2000, 10000, 45000])
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--max-pairwise-gb", type=float, default=4.0)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'N':>7} {'ours s':>8} {'ours MB':>8} {'pairwise s':>10} {'pairwise MB':>11} {'speed×':>8} {'memory×':>8}  max|Δgap|")
    for n in args.sizes:
        X = (rng.normal(size=(n, args.dim)) + 0.3).astype(np.float32)
        labels = rng.choice(GROUPS, size=n, p=[0.5, 0.15, 0.15, 0.15, 0.05])
        ours, t_ours, m_ours = measure(homogeneity_gap, X, labels)
        need_gb = n * n * 8 / 1e9 * 2  # K plus the masked copies
        if need_gb > args.max_pairwise_gb:
            print(f"{n:>7} {t_ours:>8.3f} {m_ours / 1e6:>8.1f} {'skipped':>10} {f'≥{need_gb:.0f} GB':>11} "
                  f"{'—':>8} {'—':>8}  (pairwise N×N would need ≈{need_gb:.0f} GB > --max-pairwise-gb)")
            continue
        ref, t_ref, m_ref = measure(pairwise, X, labels)
        diff = max(abs(ours.set_index("group").loc[g, "gap"] - v) for g, v in ref.items())
        print(f"{n:>7} {t_ours:>8.3f} {m_ours / 1e6:>8.1f} {t_ref:>10.3f} {m_ref / 1e6:>11.1f} "
              f"{t_ref / t_ours:>8.1f} {m_ref / m_ours:>8.1f}  {diff:.1e}")


if __name__ == "__main__":
    main()
