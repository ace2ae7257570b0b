"""The fast paths of the analysis against the direct computation: per-(prompt, group) sums of several
labellings in one pass, the permutation test's one-hot columns, and the figures' shared bounding box."""

import numpy as np
import pytest

from biasaudit.stats import homogeneity as H
from biasaudit.stats import kernels


def test_cell_sums_many_equals_direct_sums_with_unlabelled_and_bad_rows():
    rng = np.random.default_rng(5)
    N, d, P = 300, 7, 6
    X = rng.normal(size=(N, d)).astype(np.float32)
    X[3] = 0  # no direction: left out
    X[8, 2] = np.nan  # not finite: left out
    prompts = rng.integers(0, P, size=N)
    prompts[11] = -1  # no prompt
    a = rng.integers(-1, 3, size=N)  # −1: unlabelled
    b = rng.integers(-1, 4, size=N)
    got = H.cell_sums_many(X, [a, b], prompts, [3, 4], P, chunk=64)  # several chunks
    for codes, G, (S, n, q) in zip((a, b), (3, 4), got):
        for p in range(P):
            for g in range(G):
                rows = [i for i in range(N) if prompts[i] == p and codes[i] == g and i not in (3, 8)]
                unit = X[rows].astype(np.float64) / np.linalg.norm(X[rows].astype(np.float64), axis=1, keepdims=True)
                np.testing.assert_allclose(S[p, g], unit.sum(axis=0), atol=1e-5)
                assert n[p, g] == len(rows)
                assert q[p, g] == pytest.approx(len(rows), abs=1e-5)  # Σ‖x/‖x‖‖² = count
        assert S.flags.c_contiguous  # kernels.cell_dots reads it in place
        single = H.cell_sums(X, codes, prompts, G, P)
        for x, y in zip(single, (S, n, q)):
            np.testing.assert_allclose(x, y, atol=1e-5)


def test_cell_dots_equal_the_definition():
    rng = np.random.default_rng(9)
    S = rng.normal(size=(4, 3, 5))
    sq, tot = np.empty((4, 3)), np.empty((4, 3))
    kernels.cell_dots(S, sq, tot)
    for p in range(4):
        for g in range(3):
            assert sq[p, g] == pytest.approx(sum(v * v for v in S[p, g]), rel=1e-12)
            assert tot[p, g] == pytest.approx(sum(float(S[p, g] @ S[p, h]) for h in range(3)), rel=1e-12)


@pytest.mark.parametrize("sizes", [[5, 4], [3], [70, 80]])  # [70, 80]: too many code pairs for one table
def test_one_hot_equals_comparison(sizes):
    rng = np.random.default_rng(len(sizes))
    k, b, n = 3, 4, 6
    codes = [rng.integers(-1, g, size=(k, b, n)).astype(np.int16) for g in sizes]
    Z = H._one_hot(codes, sizes)
    ref = np.concatenate([np.swapaxes(c, 1, 2)[..., None] == np.arange(g) for c, g in zip(codes, sizes)], axis=-1)
    assert Z.dtype == np.float32 and Z.flags.c_contiguous and Z.shape == (k, n, b, sum(sizes))
    np.testing.assert_array_equal(Z, ref.astype(np.float32))


def test_shared_bounding_box_is_the_tight_one():
    import matplotlib

    matplotlib.use("Agg")
    import io

    import matplotlib.pyplot as plt
    from PIL import Image

    from biasaudit.outputs import tight_bbox

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.scatter(np.arange(50), np.arange(50) ** 2, rasterized=True)
    ax.set(title="a title that sticks out", xlabel="x label", ylabel="y label")
    fig.legend(["points"], loc="center right")
    sizes = []
    for bbox in ("tight", tight_bbox(fig, 150)):
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=150, bbox_inches=bbox)
        sizes.append(Image.open(io.BytesIO(buf.getvalue())).size)
    plt.close(fig)
    assert sizes[0] == sizes[1]
