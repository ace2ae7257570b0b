"""lsq_correct's batched solve against scipy's NNLS row by row (the definition in its docstring), for
one M and for a stack of bootstrap Ms; and the batched EM against EM on each M alone."""

import numpy as np
import pytest
from scipy.optimize import nnls

from biasaudit.stats.correction import em_correct, lsq_correct


def _reference(q: np.ndarray, M: np.ndarray, weight: float = 1e3) -> np.ndarray:
    k = M.shape[0]
    A = np.vstack([M.T, weight * np.ones((1, k))])
    exact = np.linalg.solve(M.T, q)
    if (exact >= -1e-12).all():
        return np.clip(exact, 0, None)
    p = nnls(A, np.concatenate([q, [weight]]))[0]
    return p / p.sum()


def _confusions(rng, k: int, n: int, strength: float) -> np.ndarray:
    M = np.eye(k) * strength + rng.dirichlet(np.full(k, 0.5), size=(n, k)) * (1 - strength)
    return M / M.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("k", [2, 3, 5, 7])
def test_lsq_correct_matches_nnls_row_by_row(k):
    rng = np.random.default_rng(k)
    M = _confusions(rng, k, 1, 0.6)[0]
    q = rng.dirichlet(np.full(k, 0.3), size=200)  # sparse shares: most rows leave the simplex
    got = lsq_correct(q, M)
    want = np.array([_reference(r, M) for r in q])
    assert (np.linalg.solve(M.T, q.T).T < 0).any(axis=1).mean() > 0.3  # the constrained path is exercised
    assert np.abs(got - want).max() < 1e-9
    assert np.allclose(got.sum(axis=1), 1) and (got >= 0).all()


def test_lsq_correct_stacked_matches_each_matrix_alone():
    rng = np.random.default_rng(7)
    k, B, R = 5, 40, 30
    Ms = _confusions(rng, k, B, 0.55)
    q = rng.dirichlet(np.full(k, 0.4), size=R)
    q[3] = np.nan  # a prompt without labels stays NaN
    got = lsq_correct(np.broadcast_to(q, (B, R, k)), Ms)
    for b in range(B):
        want = np.array([_reference(r, Ms[b]) if np.isfinite(r).all() else np.full(k, np.nan) for r in q])
        np.testing.assert_allclose(got[b], want, atol=1e-9)
    assert np.isnan(got[:, 3]).all()


def test_lsq_correct_singular_matrix_falls_back_to_nnls():
    M = np.array([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])  # rows 1 and 2 identical: singular
    q = np.array([[0.7, 0.1, 0.2], [0.2, 0.2, 0.6]])
    got = lsq_correct(q, M)
    A = np.vstack([M.T, 1e3 * np.ones((1, 3))])
    for r, g in zip(q, got):
        p = nnls(A, np.concatenate([r, [1e3]]))[0]
        np.testing.assert_allclose(g, p / p.sum(), atol=1e-9)


def test_em_stacked_matches_each_matrix_alone():
    rng = np.random.default_rng(3)
    k, B = 4, 6
    Ms = _confusions(rng, k, B, 0.7)
    counts = rng.multinomial(80, rng.dirichlet(np.ones(k)), size=12).astype(float)
    counts[2] = 0
    got = em_correct(np.broadcast_to(counts, (B, *counts.shape)), Ms)
    for b in range(B):
        np.testing.assert_array_equal(got[b], em_correct(counts, Ms[b]))
