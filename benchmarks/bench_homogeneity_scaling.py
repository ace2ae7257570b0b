"""How the homogeneity inference grows with images per prompt (issue #39 item 4): CPU seconds at 1× and 4×
images per prompt (50 prompts, float32 embeddings), 1 BLAS thread, repetitions interleaved (1×, 4×, 1×, …),
medians. Parts timed separately:

    floor        one pass over X: the per-(prompt, group) sums (stats.homogeneity.cell_sums_many)
    inference    within_prompt_table without permutations or near-duplicates: point, prompt-cluster
                 bootstrap of the within-prompt gap and the localising test (pairwise gaps, t tests)
    near-dup     the near-duplicate flags and copy-pair sums (stats.homogeneity.near_duplicate_pairs): each
                 prompt's Gram matrix in row blocks below LSH_MIN_ROWS images (quadratic, exact), the
                 random-hyperplane LSH screen with exact cosines on its candidates from there on (linear in
                 n_p but for the candidates, about n_p² · L · 2^−r)
    near-dup Gram  the same by the Gram pass at every size (the screen's baseline)
    permutation  the within-prompt permutation test on the unit rows by prompt (group sums per draw:
                 O(n_p · d) per prompt and draw, linear; the unit rows themselves are built once, outside)
    draws        its shuffles alone (one batch of uniforms, Fisher–Yates per prompt)
    section      what the homogeneity section runs per model and embedding space, all of the above at once:
                 unit rows by prompt, then within_prompt_table with the bootstrap, the permutation test (no early
                 stop, so every size does all its draws) and the near-duplicates (issue #39's ≤ 4.2× bar)

    python benchmarks/bench_homogeneity_scaling.py [--per-prompt 100] [--dim 512] [--reps 3] [--n-boot 1000]
        [--n-perm 100]

With --recall K (and --seeds S) it measures the LSH screen's recall instead, at 4× images per prompt: K pairs
per prompt planted at cosines uniformly in [0.95, 0.951] (a row set at that angle to another) in each of S data
sets, the pairs near_duplicate_pairs finds against the Gram pass's (exact).
"""

from __future__ import annotations

import argparse
import os
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
        H.within_prompt_table(X, prompts, {"race": labels}, n_boot=n_boot, n_perm=0, paper=False, small_group=30)

    def near_dup():
        H.near_duplicate_pairs(H.prompt_blocks(X, prompts), [(codes, 5)], 0.95)

    def near_dup_gram():  # the same pairs by the Gram pass at every size (the LSH screen's baseline)
        saved, H.LSH_MIN_ROWS = H.LSH_MIN_ROWS, 1 << 62
        try:
            H.near_duplicate_pairs(H.prompt_blocks(X, prompts), [(codes, 5)], 0.95)
        finally:
            H.LSH_MIN_ROWS = saved

    blocks = H.prompt_blocks(X, prompts)
    lab = H._labelled(blocks, codes, 5)

    def permutation():
        H.within_prompt_permutations(blocks, [(codes, 5)], n_perm, seed=0)

    def draws():
        rng = np.random.default_rng(0)
        for b in H._chunks(n_perm):
            H.draw_within(lab, b, rng)

    def section():
        H.within_prompt_table(X, prompts, {"race": labels}, n_boot=n_boot, n_perm=n_perm, paper=False,
                              near_dup_cosine=0.95, small_group=30, blocks=H.prompt_blocks(X, prompts))

    return {"floor": floor, "inference": inference, "near-dup": near_dup, "near-dup Gram": near_dup_gram,
            "permutation": permutation,
            "draws": draws, "section": section}


def recall(P: int, m: int, d: int, k: int, seeds: int, t: float = 0.95) -> None:
    found = true = screened = 0
    for seed in range(seeds):
        X, prompts, labels = data(P, m, d, seed)
        U = X / np.linalg.norm(X, axis=1, keepdims=True)
        rng = np.random.default_rng(seed + 1000)
        src, dst = np.stack([rng.permutation(m)[:2 * k] + p * m for p in range(P)]).reshape(P, 2, k).transpose(1, 0, 2)
        src, dst = src.ravel(), dst.ravel()
        e = rng.normal(size=(len(src), d))
        e -= np.einsum("ij,ij->i", e, U[src])[:, None] * U[src]
        c = rng.uniform(t, t + 1e-3, size=len(src))[:, None]
        U[dst] = c * U[src] + np.sqrt(1 - c * c) * e / np.linalg.norm(e, axis=1, keepdims=True)
        blocks, codes = H.prompt_blocks(U.astype(np.float32), prompts), H._codes(labels)[0]
        screened += sum(H._lsh_candidates(blocks.units[a:b], t) is not None
                        for a, b in zip(blocks.bounds[:-1], blocks.bounds[1:]))
        found += H.near_duplicate_pairs(blocks, [(codes, 5)], t)[1][0][1].sum() / 2
        saved, H.LSH_MIN_ROWS = H.LSH_MIN_ROWS, 1 << 62
        try:
            true += H.near_duplicate_pairs(blocks, [(codes, 5)], t)[1][0][1].sum() / 2
        finally:
            H.LSH_MIN_ROWS = saved
    print(f"{seeds} data sets × {P} prompts × {m} images (d = {d}), {k} pairs planted per prompt at cosine in "
          f"[{t}, {t + 1e-3}]; {screened} of {seeds * P} prompts screened by LSH (the rest: Gram pass)")
    print(f"  pairs at cosine ≥ {t}: {true:.0f} (Gram pass), {found:.0f} found (screen): measured recall "
          f"{found / true:.5f}, {true - found:.0f} missed; design recall ≥ {H.LSH_RECALL} per pair "
          f"({H.LSH_BITS} signs, tables of {H.LSH_BAND}, {H.LSH_TABLES} tables, ≤ {H.LSH_MAX_DIFF} signs apart)")


def cpu(fn) -> tuple[float, float]:
    """(CPU seconds of the process, all its threads: getrusage's user + system; wall seconds) of one call."""
    t, w = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - t, time.perf_counter() - w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--per-prompt", type=int, default=100)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--n-perm", type=int, default=100)
    ap.add_argument("--recall", type=int, default=0, help="pairs planted per prompt: measure the screen's recall")
    ap.add_argument("--seeds", type=int, default=1)
    a = ap.parse_args()
    if a.recall:
        return recall(a.prompts, 4 * a.per_prompt, a.dim, a.recall, a.seeds)
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
    print(f"{a.prompts} prompts, d = {a.dim}, CPU seconds (median of {a.reps}, 1 BLAS thread; wall seconds after "
          f"the ratio); ratio at 4× images per prompt ({sizes[0]} → {sizes[1]})")
    for k in jobs[sizes[0]]:
        (t1, w1), (t4, w4) = ([statistics.median(x) for x in zip(*times[(m, k)])] for m in sizes)
        note = (f"  (Gram pass below {H.LSH_MIN_ROWS} images per prompt, LSH screen from there)"
                if k == "near-dup" else "")
        print(f"  {k:14s} {t1:8.3f} s  {t4:8.3f} s  ratio {t4 / t1:5.2f}×   wall {w1:.3f} → {w4:.3f} s "
              f"{w4 / w1:5.2f}×{note}")
    print(f"  load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores (shared machine)")


if __name__ == "__main__":
    main()
