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


def _plant(U, s, t, c, rng):
    """Row t set to a unit row at cosine c to row s (a random direction orthogonal to it)."""
    e = rng.normal(size=U.shape[1])
    e -= (e @ U[s]) * U[s]
    U[t] = c * U[s] + np.sqrt(1 - c * c) * e / np.linalg.norm(e)


def _planted_near_copies(seed, P, m, d, n_pairs, *ranges, centre=0):
    """Prompts of alike images (prompt centre + noise: cosines about 0.5 within a prompt) with `n_pairs` planted
    pairs per prompt and range (lo, hi) at cosines drawn uniformly in it (each a fresh row set at that angle to
    another; no row in two planted pairs), and `centre` rows at the first range's cosines to a row set to the
    prompt's mean direction (pairs whose centred rows are far apart in angle: the screen's core finds them)."""
    rng = np.random.default_rng(seed)
    prompts = np.repeat(np.arange(P), m)
    X = rng.normal(size=(P, d))[prompts] + rng.normal(size=(P * m, d))
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    k = len(ranges) * n_pairs
    for p in range(P):
        order = rng.permutation(np.arange(p * m, (p + 1) * m))
        for s, t, (lo, hi) in zip(order[:k], order[k:2 * k], [r for r in ranges for _ in range(n_pairs)]):
            _plant(U, s, t, rng.uniform(lo, hi), rng)
        if centre:
            mid = order[2 * k]
            U[mid] = U[p * m:(p + 1) * m].mean(axis=0) / np.linalg.norm(U[p * m:(p + 1) * m].mean(axis=0))
            for t in order[2 * k + 1:2 * k + 1 + centre]:
                _plant(U, mid, t, rng.uniform(*ranges[0]), rng)
    return U.astype(np.float32), prompts


def _brute_near_duplicates(blocks, labels, G, t):
    """Every pair of usable rows of a prompt, by the definition (float64 cosine of the unit rows ≥ t): the flags,
    the P × G × G sums and counts over ordered pairs, and the set of pairs (rows of X)."""
    flag = np.zeros(len(blocks.n_dropped), bool)
    A, N = np.zeros((blocks.n_prompts, G, G)), np.zeros((blocks.n_prompts, G, G))
    pairs = set()
    for p in range(blocks.n_prompts):
        U = np.asarray(blocks.units[blocks.bounds[p]:blocks.bounds[p + 1]], np.float64)
        K = U @ U.T
        rows = blocks.rows[p]
        for a, b in zip(*np.nonzero(np.triu(K >= t, 1))):
            pairs.add((rows[a], rows[b]))
            flag[rows[a]] = flag[rows[b]] = True
            for x, y in ((a, b), (b, a)):
                A[p, labels[rows[x]], labels[rows[y]]] += K[a, b]
                N[p, labels[rows[x]], labels[rows[y]]] += 1
    return flag, A, N, pairs


def _assert_screen_equals_brute_force(blocks, labels, G, t):
    flag, [(A, N)] = H.near_duplicate_pairs(blocks, [(labels, G)], t)
    flag0, A0, N0, pairs = _brute_near_duplicates(blocks, labels, G, t)
    np.testing.assert_array_equal(flag, flag0)
    np.testing.assert_array_equal(N, N0)
    np.testing.assert_allclose(A, A0, rtol=0, atol=1e-9)
    return pairs


def _prompt(blocks, p):
    return blocks.units[blocks.bounds[p]:blocks.bounds[p + 1]]


def test_lsh_screen_finds_every_pair_just_above_the_threshold_and_none_below():
    """The linear-time screen (random-hyperplane LSH on each prompt's centred rows, exact cosines on the
    candidates) against brute force over every pair, where it could fail: 600 pairs planted at most 1e-3 above
    the threshold (the hardest to find), 600 at most 1e-3 below it (the easiest to report wrongly) and 24 above
    it around a row at the prompt's mean direction (wide centred angles: the core's exact pass finds them), in 3
    prompts of 900 alike images (d = 256). The design recall is ≥ LSH_RECALL = 0.999 per pair (lsh_recall),
    so on other data a pair can be missed (about 1 in 2,000 here); on this data every pair is found, nothing
    below the threshold is reported, and the flags and pair sums equal brute force."""
    t = 0.95
    X, prompts = _planted_near_copies(7, 3, 900, 256, 200, (t + 1e-7, t + 1e-3), (t - 1e-3, t - 1e-7), centre=8)
    labels = np.random.default_rng(8).integers(0, 3, size=len(X))
    blocks = H.prompt_blocks(X, prompts)
    for p in range(3):  # the screen itself ran (its design recall held), not the Gram fallback
        assert H._lsh_candidates(_prompt(blocks, p), t) is not None
    pairs = _assert_screen_equals_brute_force(blocks, labels, 3, t)
    assert len(pairs) >= 600  # the planted pairs above the threshold (chance ones are rare at 0.95)
    U = np.asarray(blocks.units, np.float64)
    below = sum(int(np.sum(np.triu((K := U[a:e] @ U[a:e].T) < t, 1) & (K >= t - 1e-3)))
                for a, e in zip(blocks.bounds[:-1], blocks.bounds[1:]))
    assert below >= 300  # pairs just below the threshold were there to be reported wrongly


def test_lsh_screen_with_many_copies_and_one_huge_bucket(monkeypatch):
    """Copies share a bucket in every table: 2 × 11 near copies (runs of 11 equal buckets and more: every pair
    inside them) go through the screen; 2 × 41 (bucket mates above LSH_PAIR_SHARE of the pairs) through the
    exact Gram pass, and through the screen too when that guard is lifted. Each equals brute force."""
    rng = np.random.default_rng(3)
    t, m, d = 0.95, 800, 256
    prompts = np.repeat(np.arange(2), m)
    X = rng.normal(size=(2, d))[prompts] + rng.normal(size=(2 * m, d))
    for p, k in ((0, 10), (1, 40)):
        for c in range(2):  # two clusters of k copies of a row (± small noise), on either side of the centre
            rows = p * m + 1 + c * k + np.arange(k)
            X[rows] = X[p * m + c * 400] + 0.02 * rng.normal(size=(k, d))
    labels = rng.integers(0, 4, size=len(X))
    blocks = H.prompt_blocks(X.astype(np.float32), prompts)
    assert H._lsh_candidates(_prompt(blocks, 0), t) is not None
    assert H._lsh_candidates(_prompt(blocks, 1), t) is None
    pairs = _assert_screen_equals_brute_force(blocks, labels, 4, t)
    assert len(pairs) >= 2 * (11 * 10 // 2 + 41 * 40 // 2)  # every copy pair (and copy–original pair)
    monkeypatch.setattr(H, "LSH_PAIR_SHARE", np.inf)
    assert H._lsh_candidates(_prompt(blocks, 1), t) is not None  # the guard, not the recall, took the Gram pass
    _assert_screen_equals_brute_force(blocks, labels, 4, t)


def test_bucket_mates_are_every_pair_sharing_a_bucket():
    """_bucket_mates against enumeration of every pair of rows in every table (a table: some of the bits; a row's
    bucket: its signs on them), with few bits per table so that runs of many equal buckets occur, one table where
    every row shares a bucket, and both key types (float32 keys below 2^24, float64 above): the same multiset of
    pairs, once per table shared; None once there are more mates than allowed."""
    rng = np.random.default_rng(5)
    for n, bits in ((40, (2, 3, 1, 0, 5, 4, 2)), (40, (13, 20))):
        signs = rng.random((n, 24)) < 0.5
        signs[:, 23] = True
        tables = [rng.choice(23, b, replace=False) for b in bits] + [np.array([23])]
        W = np.zeros((len(tables), 24), np.float32)
        for t, cols in enumerate(tables):
            W[t, cols] = 2.0 ** np.arange(len(cols))
        i, j = H._bucket_mates(W, signs, np.inf)
        want = []
        for cols in tables:
            _, bucket = np.unique(signs[:, cols], axis=0, return_inverse=True)
            a, b = np.nonzero(np.triu(bucket[:, None] == bucket[None, :], 1))
            want += list(zip(a.tolist(), b.tolist()))
        assert sorted(zip(np.minimum(i, j).tolist(), np.maximum(i, j).tolist())) == sorted(want)
        assert H._bucket_mates(W, signs, len(want) - 1) is None and H._bucket_mates(W, signs, len(want)) is not None


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
