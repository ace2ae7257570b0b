"""Compiled loops where numpy needs several passes over the embeddings.

The within-prompt homogeneity gap needs, per (prompt, group) cell, the sum of the unit-length rows. In numpy
that is a pass for the norms plus a sparse or one-hot product per labelling (about 4–6× one pass over X,
benchmarks/results/analyze.txt); the loop below reads each row once while it is in cache.
"""

from __future__ import annotations

import numba
import numpy as np

# reassociation lets the compiler vectorise the sums; NaN and infinity keep their IEEE meaning (no "fast" flags
# that assume finite values), so a non-finite row is still recognised and left out.
_FLAGS = {"reassoc", "contract"}


@numba.njit(cache=True, nogil=True, fastmath=_FLAGS)
def accumulate_cell_sums(X, cell, normalise, S, n, q):
    """Add each usable row of X (finite, non-zero), scaled to unit length when `normalise`, to S[cell[i, j]]
    for every labelling j with cell[i, j] ≥ 0; count it in n and its squared (scaled) norm in q. In place."""
    rows, d = X.shape
    for i in range(rows):
        sq = 0.0
        for k in range(d):
            v = np.float64(X[i, k])
            sq += v * v
        if not (sq > 0.0 and sq < np.inf):
            continue
        w = 1.0 / np.sqrt(sq) if normalise else 1.0
        for j in range(cell.shape[1]):
            c = cell[i, j]
            if c < 0:
                continue
            for k in range(d):
                S[c, k] += w * X[i, k]
            n[c] += 1.0
            q[c] += sq * w * w
