"""The localising test of stats.homogeneity: pairwise within-prompt gaps against brute-force pair enumeration,
the intersection-union rule on a hand example, and near-duplicate pairs left out."""

import numpy as np
import pandas as pd
from scipy import stats

from biasaudit.stats import homogeneity as H


def _tiny(seed=0, P=4, m=7, d=5, G=3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(P * m, d))
    prompts = np.repeat(np.arange(P), m)
    labels = rng.integers(0, G, size=P * m)
    labels[::m] = 0  # every prompt has group 0 at least twice
    labels[1::m] = 0
    return X, prompts, labels


def _brute_pairs(X, prompts, labels, G, skip=lambda c: False):
    """Per prompt, loops over every ordered pair of distinct images: (sums A, counts N) of cosines by group pair."""
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    P = prompts.max() + 1
    A, N = np.zeros((P, G, G)), np.zeros((P, G, G))
    for i in range(len(X)):
        for j in range(len(X)):
            if i == j or prompts[i] != prompts[j]:
                continue
            c = float(U[i] @ U[j])
            if skip(c):
                continue
            A[prompts[i], labels[i], labels[j]] += c
            N[prompts[i], labels[i], labels[j]] += 1
    return A, N


def test_pair_sums_equal_brute_force_enumeration():
    X, prompts, labels = _tiny()
    S, n, q = H.cell_sums(X, labels, prompts, 3, 4)
    A, N = H.pair_sums_from_cells(S, n, q)
    A0, N0 = _brute_pairs(X, prompts, labels, 3)
    # ordered pairs within g count each unordered pair twice, as ‖S_g‖² − q does
    np.testing.assert_allclose(A, A0, atol=1e-5)
    np.testing.assert_allclose(N, N0)


def test_dedup_pair_sums_leave_out_exactly_the_pairs_above_the_threshold():
    X, prompts, labels = _tiny(seed=3)
    X[3] = X[4] * 2.0 + 1e-3  # a near copy inside prompt 0
    blocks = H.prompt_blocks(X, prompts)
    A, N = H.pair_sums_dedup(blocks, labels, 3, 0.9)
    A0, N0 = _brute_pairs(X, prompts, labels, 3, skip=lambda c: c >= 0.9)
    np.testing.assert_allclose(A, A0, atol=1e-5)
    np.testing.assert_allclose(N, N0)
    assert N0.sum() < _brute_pairs(X, prompts, labels, 3)[1].sum()  # the copy pair was there to leave out


def test_near_duplicates_found_across_gram_row_blocks(monkeypatch):
    """Blocks of 3 rows over prompts of 11: copies inside one block, across blocks and in the last partial
    block are each found once, with both orders in the pair sums and both images flagged."""
    monkeypatch.setattr(H, "GRAM_ROWS", 3)
    X, prompts, labels = _tiny(seed=4, P=3, m=11, d=32)
    X[1] = X[2] * 1.5 + 1e-3  # same block
    X[11 + 0] = X[11 + 10] * 0.7  # first and last (partial) block of prompt 1
    X[22 + 4] = X[22 + 8] + 1e-3  # second and third block of prompt 2
    X[22 + 5] = X[22 + 8] - 1e-3  # a triple: three pairs
    blocks = H.prompt_blocks(X, prompts)
    flag, [(A, N)] = H.near_duplicate_pairs(blocks, [(labels, 3)], 0.9)
    all_A, all_N = _brute_pairs(X, prompts, labels, 3)
    kept_A, kept_N = _brute_pairs(X, prompts, labels, 3, skip=lambda c: c >= 0.9)
    np.testing.assert_allclose(A, all_A - kept_A, atol=1e-5)
    np.testing.assert_allclose(N, all_N - kept_N)
    assert N.sum() == 2 * 5  # 1 + 1 + 3 unordered pairs, each in both orders (no chance ones at 0.9 in d = 32)
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    K = U @ U.T
    np.fill_diagonal(K, -2)
    K[prompts[:, None] != prompts[None, :]] = -2
    np.testing.assert_array_equal(flag, K.max(axis=1) >= 0.9)


def test_pairwise_gap_and_its_t_interval_from_the_definition():
    X, prompts, labels = _tiny(seed=5, P=6, m=9)
    S, n, q = H.cell_sums(X, labels, prompts, 3, 6)
    A, N = _brute_pairs(X, prompts, labels, 3)
    t = H.pairwise_gaps(*H.pair_sums_from_cells(S, n, q), n, ["a", "b", "c"]).set_index(["group", "other"])
    # g = 0, h = 1 by hand: per prompt intra_0 − between_01, weights n0 n1 / (n0 + n1), ratio of sums
    x, w = [], []
    for p in range(6):
        n0, n1 = (labels[prompts == p] == 0).sum(), (labels[prompts == p] == 1).sum()
        if n0 >= 2 and n1 >= 1:
            x.append(A[p, 0, 0] / N[p, 0, 0] - A[p, 0, 1] / N[p, 0, 1])
            w.append(n0 * n1 / (n0 + n1))
    x, w = np.array(x), np.array(w)
    est = (w * x).sum() / w.sum()
    k = len(x)
    se = np.sqrt(k / (k - 1) * ((w * (x - est)) ** 2).sum()) / w.sum()
    row = t.loc[("a", "b")]
    assert np.isclose(row["pair_gap"], est) and np.isclose(row["pair_gap_se"], se)
    assert np.isclose(row["p_pair_gap"], stats.t.sf(est / se, k - 1))
    assert np.isclose(row["pair_gap_hi"] - row["pair_gap_lo"], 2 * stats.t.ppf(0.975, k - 1) * se)
    # the tightness contrast is antisymmetric
    assert np.isclose(t.loc[("a", "b"), "tight_diff"], -t.loc[("b", "a"), "tight_diff"])


def test_intersection_union_rule_hand_example():
    # a: every comparison rejects → flagged at the largest p (0.03); b: one comparison fails → not flagged;
    # c: a comparison undefined → p = 1 with a reason
    pairs = pd.DataFrame({
        "group": ["a", "a", "b", "b", "c", "c"], "other": ["b", "c", "a", "c", "a", "b"],
        "p_pair_gap": [0.01, 0.02, 0.001, 0.2, 0.001, np.nan], "p_tight_diff": [0.03, 0.001, 0.01, 0.01, 0.01, 0.01]})
    out = H.localise(pairs, ["a", "b", "c"], alpha=0.05).set_index("group")
    assert out.loc["a", "p_localise"] == 0.03 and out.loc["a", "flagged"]
    assert out.loc["b", "p_localise"] == 0.2 and not out.loc["b", "flagged"]
    assert out.loc["c", "p_localise"] == 1.0 and not out.loc["c", "flagged"] and "b" in out.loc["c", "localise_reason"]


def _looks(rng, P=30, m=60, d=8, shift=0.0, copies_in=()):
    """Prompts with centres; group 'x' optionally shifted along one direction; copies within chosen groups."""
    prompts = np.repeat(np.arange(P), m)
    labels = np.array(["w", "x", "y", "z"], dtype=object)[rng.integers(0, 4, size=P * m)]
    X = rng.normal(size=(P, d))[prompts] * 0.8 + 0.5 + rng.normal(size=(P * m, d))
    X[labels == "x"] += shift * np.eye(d)[0]
    for g in copies_in:
        for p in range(P):
            rows = np.flatnonzero((prompts == p) & (labels == g))
            for i in rows[: max(1, len(rows) // 5)]:
                X[i] = X[rows[-1]] + 1e-4 * rng.normal(size=d)
    return X, prompts, labels


def test_shifted_group_is_the_only_one_flagged():
    rng = np.random.default_rng(11)
    X, prompts, labels = _looks(rng, shift=1.5)
    t = H.within_prompt_table(X, prompts, {"race": labels}, n_boot=0, n_perm=0, paper=False,
                              small_group=30)["race"].set_index("group")
    assert t.loc["x", "flagged"] and not t.loc[["w", "y", "z"], "flagged"].any()


def test_equal_copies_flag_nothing_once_copy_pairs_are_left_out():
    rng = np.random.default_rng(12)
    X, prompts, labels = _looks(rng, copies_in=("w", "x", "y", "z"))
    t = H.within_prompt_table(X, prompts, {"race": labels}, n_boot=50, n_perm=0, paper=False,
                              near_dup_cosine=0.99, small_group=30)["race"].set_index("group")
    assert (t["wp_gap"] > t["wp_gap_dedup"]).all()  # the copies raise every headline gap
    assert not t["dedup_flagged"].any()


def _planted_near_copies(seed, P, m, d, n_pairs, lo, hi):
    """Prompts of alike images (prompt centre + noise: cosines about 0.5 within a prompt) with `n_pairs` planted
    pairs per prompt at cosines drawn uniformly in [lo, hi] (each a fresh row set at that angle to another)."""
    rng = np.random.default_rng(seed)
    prompts = np.repeat(np.arange(P), m)
    X = rng.normal(size=(P, d))[prompts] + rng.normal(size=(P * m, d))
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    for p in range(P):
        src, dst = rng.permutation(np.arange(p * m, (p + 1) * m))[:2 * n_pairs].reshape(2, n_pairs)
        for s, t in zip(src, dst):
            e = rng.normal(size=d)
            e -= (e @ U[s]) * U[s]
            c = rng.uniform(lo, hi)
            U[t] = c * U[s] + np.sqrt(1 - c * c) * e / np.linalg.norm(e)
    return U.astype(np.float32), prompts


def test_lsh_screen_recalls_the_near_duplicates_that_brute_force_finds(monkeypatch):
    """The linear-time screen (random-hyperplane LSH on each prompt's centred rows, exact cosines on the
    candidates) against brute force over every pair: the hardest pairs, planted just above the threshold,
    are found at the design recall (≥ 0.999 each; here every one of 300 but at most 2), no pair below the
    threshold is reported (exact float64 cosines decide), and the sums match brute force over the pairs found."""
    t = 0.95
    X, prompts = _planted_near_copies(7, P=3, m=700, d=256, n_pairs=100, lo=t + 1e-4, hi=t + 0.01)
    labels = np.random.default_rng(8).integers(0, 3, size=len(X))
    blocks = H.prompt_blocks(X, prompts)
    for p in range(3):  # the screen itself ran (its design recall held), not the Gram fallback
        assert H._lsh_candidates(blocks.units[blocks.bounds[p]:blocks.bounds[p + 1]], t) is not None
    monkeypatch.setattr(H, "LSH_MIN_ROWS", 500)
    flag, [(A, N)] = H.near_duplicate_pairs(blocks, [(labels, 3)], t)
    U = np.asarray(X, np.float64)
    true_pairs = found = 0
    want_flag = np.zeros(len(X), bool)
    A0, N0 = np.zeros_like(A), np.zeros_like(N)
    for p in range(3):
        rows = np.flatnonzero(prompts == p)
        K = U[rows] @ U[rows].T
        i, j = np.nonzero(np.triu(K >= t, 1))
        true_pairs += len(i)
        want_flag[rows[i]] = want_flag[rows[j]] = True
        for a, b in zip(i, j):
            for x, y in ((a, b), (b, a)):
                A0[p, labels[rows[x]], labels[rows[y]]] += K[a, b]
                N0[p, labels[rows[x]], labels[rows[y]]] += 1
    found = N.sum() / 2
    assert true_pairs >= 300 and true_pairs - 2 <= found <= true_pairs
    assert not (flag & ~want_flag).any() and (want_flag & ~flag).sum() <= 4
    assert np.all(N <= N0)
    if found == true_pairs:  # (the unit rows are renormalised in float32: cosines agree to ~1e-7 each)
        np.testing.assert_allclose(A, A0, atol=1e-5)
        np.testing.assert_array_equal(N, N0)


def test_lsh_design_recall_from_its_definition():
    """lsh_recall against a direct simulation of the same design: B random-hyperplane signs, tables of r distinct
    bits, a pair at angle θ collides in some table, and (with the signature filter) differs in at most 9 signs
    (Monte Carlo over 20,000 pairs, 3 standard errors)."""
    rng = np.random.default_rng(0)
    B, r, L, theta, n = 32, 6, 5, np.radians(40), 20_000
    diff = rng.random((n, B)) < theta / np.pi  # each sign differs with probability θ/π, independently
    bands = np.stack([rng.choice(B, r, replace=False) for _ in range(L)])
    # the formula averages over random tables, so the simulation draws many sets of them
    hits, kept = [], []
    for _ in range(40):
        bands = np.stack([rng.choice(B, r, replace=False) for _ in range(L)])
        hits.append((~diff[:, bands].any(axis=2)).any(axis=1).mean())
        kept.append(((~diff[:, bands].any(axis=2)).any(axis=1) & (diff.sum(axis=1) <= 9)).mean())
    for sim, want in ((hits, H.lsh_recall(theta, B, r, L, max_diff=None)), (kept, H.lsh_recall(theta, B, r, L, 9))):
        assert 0.2 < want < 0.98  # a regime where the test can tell
        assert abs(np.mean(sim) - want) < 3 * np.sqrt(want * (1 - want) / n) + 2e-3
    assert np.mean(kept) < np.mean(hits) - 0.02  # the signature filter costs recall at this angle, as counted
