"""How the homogeneity inference grows with images per prompt (issue #39 item 4): CPU seconds at 1× and 4×
images per prompt (50 prompts, float32 embeddings), 1 BLAS thread, repetitions interleaved (1×, 4×, 1×, …),
medians. Parts timed separately:

    floor        one pass over X: the per-(prompt, group) sums (stats.homogeneity.cell_sums_many)
    inference    within_prompt_table without permutations or near-duplicates: point, prompt-cluster
                 bootstrap of the within-prompt gap and the localising test (pairwise gaps, t tests)
    near-dup     per-prompt Gram matrices and the near-duplicate-free pair sums (pairs: quadratic in n_p)
    permutation  the within-prompt permutation test (per-prompt Grams and one-hot GEMMs)

    python benchmarks/bench_homogeneity_scaling.py [--per-prompt 100] [--dim 512] [--reps 3] [--n-boot 1000]
        [--n-perm 100]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_limits

from biasaudit.stats import homogeneity as H

GROUPS = np.array(["white", "black", "asian", "hispanic", "other"])


def data(P: int, m: int, d: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    prompts = np.repeat(np.arange(P), m)
    X = (rng.normal(size=(P, d))[prompts] + rng.normal(size=(P * m, d))).astype(np.float32)
    return X, prompts, GROUPS[rng.integers(0, 5, size=P * m)]


def parts(X, prompts, labels, n_boot, n_perm):
    codes = H._codes(labels)[0]

    def floor():
        H.cell_sums_many(X, [codes], prompts, [5], int(prompts.max()) + 1)

    def inference():
        H.within_prompt_table(X, prompts, {"race": labels}, n_boot=n_boot, n_perm=0, paper=False)

    def near_dup():
        H.pair_sums_dedup(H.prompt_blocks(X, prompts), codes, 5, 0.95)

    blocks = H.prompt_blocks(X, prompts)

    def permutation():
        H.within_prompt_permutations(blocks, [(codes, 5)], n_perm, seed=0)

    return {"floor": floor, "inference": inference, "near-dup": near_dup, "permutation": permutation}


def cpu(fn) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--per-prompt", type=int, default=100)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--n-perm", type=int, default=100)
    a = ap.parse_args()
    sizes = (a.per_prompt, 4 * a.per_prompt)
    jobs = {m: parts(*data(a.prompts, m, a.dim), a.n_boot, a.n_perm) for m in sizes}
    times = {(m, k): [] for m in sizes for k in jobs[sizes[0]]}
    with threadpool_limits(1):
        for m in sizes:  # warm (numba compile, BLAS)
            for fn in jobs[m].values():
                fn()
        for _ in range(a.reps):
            for k in jobs[sizes[0]]:
                for m in sizes:
                    times[(m, k)].append(cpu(jobs[m][k]))
    print(f"{a.prompts} prompts, d = {a.dim}, CPU seconds (median of {a.reps}, 1 BLAS thread); "
          f"ratio at 4× images per prompt ({sizes[0]} → {sizes[1]})")
    for k in jobs[sizes[0]]:
        t1, t4 = statistics.median(times[(sizes[0], k)]), statistics.median(times[(sizes[1], k)])
        print(f"  {k:12s} {t1:8.3f} s  {t4:8.3f} s  ratio {t4 / t1:5.2f}×")


if __name__ == "__main__":
    main()
