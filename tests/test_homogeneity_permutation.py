"""The within-prompt permutation test (stats.homogeneity.within_prompt_permutations) against enumeration: on
tiny data every distinct within-prompt arrangement of the labels is listed, its statistic computed from explicit
pairwise cosines, and the exact permutation p-value read off; the draws are checked to be uniform over them."""

import itertools

import numpy as np
import pytest
from scipy import stats

from biasaudit.stats import homogeneity as H

from .test_within_prompt_gap import brute_prompt_terms


def _tiny(seed=0):
    """3 prompts of 5, 6 and 5 rows (one unlabelled, one zero row), 3 groups, d = 6."""
    rng = np.random.default_rng(seed)
    sizes = [5, 6, 5]
    prompts = np.repeat(np.arange(3), sizes)
    X = rng.normal(size=(3, 6))[prompts] + rng.normal(size=(16, 6))
    codes = np.array([0, 0, 1, 1, 2,  0, 0, 0, 1, 2, -1,  0, 1, 1, 2, 2])
    X[15] = 0.0  # a zero row is no image
    codes[0:2] = 0  # group 0 has pairs in every prompt
    X[[0, 1, 5]] += 1.5 * rng.normal(size=6)  # group 0 somewhat alike: a p-value away from 0 and 1
    return X, prompts, codes


def brute_statistics(X, prompts, codes, G):
    """Per group Σ_p a_p / √Σ_p (a_p − Δ w_p)² (a_p = w_p Δ_p, Δ = Σa / Σw) and the pooled Σ_g Σ_p a / Σ_g Σ_p w,
    from explicit mean cosines over distinct pairs inside a prompt; zero rows and code −1 are no images."""
    norms = np.linalg.norm(X, axis=1)
    good = norms > 0
    U = np.where(good[:, None], X / np.where(good, norms, 1)[:, None], 0.0)
    labels = [int(c) if ok and c >= 0 else None for c, ok in zip(codes, good)]
    out, A, W = [], 0.0, 0.0
    for g in range(G):
        a, w = brute_prompt_terms(U, prompts, labels, g)
        if len(a) < 2:  # no SE (every tiny case here has 0 or ≥ 2 contributing prompts per group)
            assert len(a) == 0
            out.append(np.nan)
            continue
        delta = a.sum() / w.sum()
        out.append(a.sum() / np.sqrt(((a - delta * w) ** 2).sum()))
        A, W = A + a.sum(), W + w.sum()
    return np.array([*out, A / W])


def arrangements(prompts, codes, usable):
    """Every distinct labelling reachable by permuting labels among the labelled usable rows of each prompt."""
    per_prompt = []
    for p in np.unique(prompts):
        at = np.flatnonzero((prompts == p) & usable & (codes >= 0))
        per_prompt.append([(at, np.array(c)) for c in sorted(set(itertools.permutations(codes[at])))])
    for combo in itertools.product(*per_prompt):
        c = codes.copy()
        for at, v in combo:
            c[at] = v
        yield c


@pytest.fixture(params=["unit rows", "coordinates"])
def route(request, monkeypatch):
    """Both ways the permutation kernel reads a prompt's rows (H.prompt_coordinates): the unit rows, or their
    triangular coordinates (taken at these sizes only when COORDINATE_SHARE allows it)."""
    monkeypatch.setattr(H, "COORDINATE_SHARE", 0.0 if request.param == "unit rows" else 100.0)
    return request.param


def test_permuted_statistic_equals_brute_force_for_every_arrangement(route):
    X, prompts, codes = _tiny()
    blocks = H.prompt_blocks(X, prompts)
    lab = H._labelled(blocks, codes, 3)
    rows = np.concatenate(blocks.rows)[lab.idx]  # the row of X behind each labelled position
    every = list(arrangements(prompts, codes, ~blocks.n_dropped))
    assert len(every) == 30 * 20 * 12  # 5!/(2!2!), 5!/3!, 4!/2!: prompt 2's zero row is no image
    drawn = np.array([c[rows] for c in every[::37]], dtype=np.int16)  # a spread of 195 arrangements as one batch
    got = H._statistics(H._draw_terms(blocks, lab, drawn), 3, True)
    want = np.array([brute_statistics(X, prompts, c, 3) for c in every[::37]])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_p_value_equals_the_exact_enumeration_p_value(route):
    """p = P(T_perm ≥ T_obs) over every within-prompt arrangement (the exact test), from brute-force statistics;
    the Monte-Carlo p of 4000 draws must fall within 4 binomial SEs of it, for every group and the global test."""
    X, prompts, codes = _tiny(seed=1)
    blocks = H.prompt_blocks(X, prompts)
    lab = H._labelled(blocks, codes, 3)
    rows = np.concatenate(blocks.rows)[lab.idx]
    every = list(arrangements(prompts, codes, ~blocks.n_dropped))
    # the statistic of every arrangement by the code under test (checked against brute force above), the
    # observed one by brute force
    allstats = H._statistics(H._draw_terms(blocks, lab, np.array([c[rows] for c in every], np.int16)), 3, True)
    obs = brute_statistics(X, prompts, codes, 3)
    exact = (allstats >= obs - 1e-6).mean(axis=0)
    assert ((exact > 0.02) & (exact < 0.98)).any()  # the check is not at a boundary
    assert np.isnan(obs[2])  # group 2 has no within-prompt pair: its p is undefined
    n = 4000
    p, glob, done = H.within_prompt_permutations(blocks, [(codes, 3)], n, seed=7)
    mc = np.array([*p[0], glob[0]])
    assert done == n
    se = np.sqrt(exact * (1 - exact) / n)
    ok = ~np.isnan(obs)
    assert np.isnan(mc[~ok]).all()
    assert (np.abs(mc - (exact * n + 1) / (n + 1))[ok] <= 4 * se[ok] + 2 / n).all(), (mc, exact)


@pytest.mark.parametrize("design", ["within", "across"])
def test_draws_are_uniform_over_arrangements(design):
    """Chi-square of the frequency of each arrangement of one prompt's labels ('within': 5!/(2!2!) = 30 equally
    likely), or of where the labels land over all labelled rows ('across': each code's count in prompt 0
    follows the hypergeometric law)."""
    X, prompts, codes = _tiny()
    blocks = H.prompt_blocks(X, prompts)
    lab = H._labelled(blocks, codes, 3)
    b = 30000
    drawn = H.draw_within(lab, b, np.random.default_rng(3), design)
    assert (np.sort(drawn, axis=1) == np.sort(lab.codes)).all()
    if design == "within":
        a, e = lab.bounds[0], lab.bounds[1]
        for s, t in zip(lab.bounds[:-1], lab.bounds[1:]):  # every prompt keeps its multiset
            assert (np.sort(drawn[:, s:t], axis=1) == np.sort(lab.codes[s:t])).all()
        _, counts = np.unique(drawn[:, a:e], axis=0, return_counts=True)
        assert len(counts) == 30
        assert stats.chisquare(counts).pvalue > 1e-3
    else:
        a, e = lab.bounds[0], lab.bounds[1]
        k = (drawn[:, a:e] == 0).sum(axis=1)  # zeros landing in prompt 0's 5 slots, of 6 zeros among 15
        M, K = len(lab.codes), int((lab.codes == 0).sum())
        ks = np.arange(0, 6)
        expected = stats.hypergeom(M, K, e - a).pmf(ks) * b
        observed = np.array([(k == v).sum() for v in ks])
        keep = expected > 5
        obs, exp = observed[keep], expected[keep]
        assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3


def test_across_shuffle_moves_labels_between_prompts():
    X, prompts, codes = _tiny()
    blocks = H.prompt_blocks(X, prompts)
    lab = H._labelled(blocks, codes, 3)
    drawn = H.draw_within(lab, 200, np.random.default_rng(0), "across")
    a, e = lab.bounds[0], lab.bounds[1]
    assert len({tuple(np.sort(r)) for r in drawn[:, a:e]}) > 1


def test_coordinates_of_dependent_rows_give_the_unit_rows_statistics():
    """Prompts with exact copies and a row in the span of two others (rank below n_p, where plain Cholesky
    fails): the triangular coordinates give each draw's terms of the unit rows to float32 precision, and a
    coordinate row has no more non-zero entries than its length says."""
    rng = np.random.default_rng(3)
    sizes = [9, 7, 12]
    prompts = np.repeat(np.arange(3), sizes)
    X = rng.normal(size=(3, 64))[prompts] + rng.normal(size=(28, 64))
    X[3] = X[1]
    X[4] = X[1] * 2.0  # the same direction
    X[12] = X[10] - 0.5 * X[11]
    X = X.astype(np.float32)
    codes = rng.integers(0, 3, size=28)
    blocks = H.prompt_blocks(X, prompts)
    C, lens = H.prompt_coordinates(blocks)  # COORDINATE_SHARE 0.25: 12 rows ≤ 0.25 · 64
    assert C.shape == (28, 12)
    for p, m in enumerate(sizes):  # the k-th row in pivot order has at most k non-zero coordinates
        own = lens[blocks.bounds[p]:blocks.bounds[p + 1]]
        assert (np.sort(own) <= np.arange(1, m + 1)).all()
    assert all((C[i, lens[i]:] == 0).all() for i in range(len(C)))
    # rank: rows 3 and 4 repeat row 1's direction (prompt 0: 7 of 9), row 12 is in the span of 10 and 11 (6 of 7)
    assert [lens[blocks.bounds[p]:blocks.bounds[p + 1]].max() for p in range(3)] == [7, 6, 12]
    lab = H._labelled(blocks, codes, 3)
    drawn = H.draw_within(lab, 50, np.random.default_rng(0))
    coords = H._draw_terms(blocks, lab, drawn)
    blocks.coordinates = (blocks.units, np.full(len(blocks.units), X.shape[1]))
    np.testing.assert_allclose(coords, H._draw_terms(blocks, lab, drawn), rtol=2e-5, atol=2e-5)
