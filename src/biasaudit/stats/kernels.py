"""Compiled loops where numpy needs several passes over the embeddings.

The within-prompt homogeneity gap needs, per (prompt, group) cell, the sum of the unit-length rows. In numpy
that is a pass for the norms plus a sparse or one-hot product per labelling (about 4–6× one pass over X,
benchmarks/results/analyze.txt); the loops below read each row from memory once.
"""

from __future__ import annotations

import numba
import numpy as np

# reassociation lets the compiler vectorise the sums; NaN and infinity keep their IEEE meaning (no "fast" flags
# that assume finite values), so a non-finite row is still recognised and left out.
_FLAGS = {"reassoc", "contract"}

# rows per block: 64 float32 rows of 1024 are 256 KB, which stay in L2 between the two phases
BLOCK = 64
# below this share of rows that a block would merge into its cell's buffer, blocks only cost (rows not
# grouped by prompt): one row at a time instead
MIN_MERGE_SHARE = 0.25


def block_rows(cell: np.ndarray, block: int = BLOCK) -> int:
    """The block size for accumulate_cell_sums: BLOCK where blocks would merge at least MIN_MERGE_SHARE of
    the rows (first labelling: rows after the first of their cell in a block, added to its buffer instead of
    to S), else 1."""
    c = np.asarray(cell)[: len(cell) // block * block, 0] if np.ndim(cell) == 2 and np.shape(cell)[1] else None
    if c is None or len(c) == 0:
        return 1
    s = np.sort(c.reshape(-1, block), axis=1)
    merged = ((s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)).sum()
    return block if merged >= MIN_MERGE_SHARE * len(c) else 1


@numba.njit(cache=True, nogil=True, fastmath=_FLAGS)
def accumulate_cell_sums(X, cell, normalise, S, n, q, scale, block):
    """Add each usable row of X (finite, non-zero), scaled to unit length when `normalise`, to S[cell[i, j]]
    for every labelling j with cell[i, j] ≥ 0; count it in n and its squared (scaled) norm in q; write each
    row's weight to scale (1/‖x‖, or 1 without normalising; 0 for an unusable row). In place.

    Block by block (`block` rows, block_rows): first every row's norm while the rows stream in from memory,
    then, per labelling, each cell's rows of the block summed into one buffer that stays in L1 and added to
    S once. With rows grouped by prompt, the earlier kernel (each row straight into S) measured 1.35× slower
    than blocks of 64; with rows in no order, blocks of 64 find little to merge and measured 1.6× slower
    than rows one at a time (block = 1), which is itself about 10% slower than that earlier kernel there
    (benchmarks/results/analyze.txt)."""
    rows, d = X.shape
    w = np.empty(block)
    sq = np.empty(block)
    done = np.empty(block, np.bool_)
    buf = np.empty(d)
    for b0 in range(0, rows, block):
        m = min(block, rows - b0)
        for r in range(m):
            s = 0.0
            for k in range(d):
                v = np.float64(X[b0 + r, k])
                s += v * v
            sq[r] = s
            usable = s > 0.0 and s < np.inf
            w[r] = (1.0 / np.sqrt(s) if normalise else 1.0) if usable else 0.0
            scale[b0 + r] = w[r]
        for j in range(cell.shape[1]):
            for r in range(m):
                done[r] = w[r] == 0.0 or cell[b0 + r, j] < 0
            for r in range(m):
                if done[r]:
                    continue
                c = cell[b0 + r, j]
                wr = w[r]
                n[c] += 1.0
                q[c] += sq[r] * wr * wr
                nxt = r + 1
                while nxt < m and (done[nxt] or cell[b0 + nxt, j] != c):
                    nxt += 1
                if nxt == m:  # the cell's only row in this block: straight into S (rows not grouped by cell)
                    for k in range(d):
                        S[c, k] += wr * X[b0 + r, k]
                    continue
                for k in range(d):
                    buf[k] = wr * X[b0 + r, k]
                for t in range(nxt, m):
                    if done[t] or cell[b0 + t, j] != c:
                        continue
                    wt = w[t]
                    for k in range(d):
                        buf[k] += wt * X[b0 + t, k]
                    n[c] += 1.0
                    q[c] += sq[t] * wt * wt
                    done[t] = True
                for k in range(d):
                    S[c, k] += buf[k]


@numba.njit(cache=True, nogil=True, fastmath=_FLAGS)
def cell_dots(S, sq, tot):
    """Per (prompt p, group g) of a C-contiguous P×G×d array: sq = ‖S_pg‖² and tot = S_pg · Σ_h S_ph, in one
    pass over S (numpy needs a pass for Σ_h and one einsum for each product). In place."""
    P, G, d = S.shape
    total = np.empty(d)
    for p in range(P):
        total[:] = 0.0
        for g in range(G):
            for k in range(d):
                total[k] += S[p, g, k]
        for g in range(G):
            a = 0.0
            b = 0.0
            for k in range(d):
                v = S[p, g, k]
                a += v * v
                b += v * total[k]
            sq[p, g] = a
            tot[p, g] = b


@numba.njit(cache=True, nogil=True)
def shuffle_segments(codes, bounds, u, out):
    """out[t] = codes with each segment [bounds[s], bounds[s + 1]) shuffled (Fisher–Yates driven by the
    uniforms u[t], one per position): b uniform permutations per segment from one vectorised draw of u."""
    b = u.shape[0]
    for t in range(b):
        for j in range(codes.shape[0]):
            out[t, j] = codes[j]
        for s in range(bounds.shape[0] - 1):
            a = bounds[s]
            for i in range(bounds[s + 1] - 1, a, -1):
                r = a + min(int(u[t, i] * (i - a + 1)), i - a)  # u·(i − a + 1) can round up to i − a + 1
                tmp = out[t, i]
                out[t, i] = out[t, r]
                out[t, r] = tmp


# draws that permuted_cell_dots serves from one read of a row (their group sums stay in L1 while it is added)
DRAWS_PER_PASS = 4
# a prompt's rows are added in blocks of at most this many bytes, which stay in L2 while BLOCK_DRAWS draws read
# them: at 1,000 rows of 512 float32 a prompt (2 MB) no longer stays in L2 from one pass to the next
BLOCK_BYTES = 1 << 19
BLOCK_DRAWS = 32


@numba.njit(cache=True, nogil=True, fastmath=_FLAGS)
def permuted_cell_dots(U, lens, idx, bounds, codes, sq, tot, q, cnt):
    """Per prompt p (rows idx[bounds[p]:bounds[p + 1]] of the unit rows U), draw t (codes[t], one group code
    per row of idx) and group g: sq = ‖S_ptg‖², tot = S_ptg · S_p, q = Σ ‖u‖² and cnt = the count over the
    rows coded g, S_ptg their sum and S_p the prompt's sum. Outputs P × b × G, written in place.

    Row i of U is read up to lens[i] only (the rest must be 0): U may hold each prompt's rows in
    triangular coordinates (prompt_coordinates), where row i has at most i + 1 non-zero coordinates.

    O(n_p · d) per prompt and draw, never an n_p × n_p matrix: each row is added to its group's sum (in U's
    dtype, as the float32 GEMMs before it), except the rows of the draw's largest group, whose sum is S_p
    (float64) minus the others'. Whole rows, no column blocks: the row loop then vectorises (blocks of 64–256
    columns measured 1.3–7× slower). Draws go BLOCK_DRAWS at a time through the prompt's rows in blocks of at
    most BLOCK_BYTES (in L2 while those draws read them); each row of a block is read once for DRAWS_PER_PASS
    draws, added to each draw's group sum in turn (indexed in place: a view of the sum per row and draw cost a
    reference count each). Every draw's sums get their rows in index order, so the sums do not depend on the
    blocking, and two draws that code every row alike give bitwise the same sums (ties stay ties)."""
    b, M = codes.shape
    P = bounds.shape[0] - 1
    G = sq.shape[2]
    d = U.shape[1]
    T = DRAWS_PER_PASS
    TB = BLOCK_DRAWS
    RB = max(1, BLOCK_BYTES // max(1, d * U.itemsize))
    v = np.zeros(M)
    qn = np.zeros(M)
    count = np.zeros(G)
    ltot = np.zeros(G)
    lq = np.zeros(G)
    big = np.zeros(TB, np.int64)
    total = np.zeros(d)
    rest = np.zeros(d)
    acc = np.zeros((TB, G, d), dtype=U.dtype)
    for p in range(P):
        a, e = bounds[p], bounds[p + 1]
        if e == a:
            continue
        total[:] = 0.0
        for j in range(a, e):
            row = U[idx[j]]
            for k in range(lens[idx[j]]):
                total[k] += row[k]
        for j in range(a, e):
            row = U[idx[j]]
            s1 = 0.0
            s2 = 0.0
            for k in range(lens[idx[j]]):
                x = np.float64(row[k])
                s1 += x * total[k]
                s2 += x * x
            v[j] = s1
            qn[j] = s2
        for t0 in range(0, b, TB):
            nb = min(TB, b - t0)
            for u in range(nb):
                t = t0 + u
                count[:] = 0.0
                ltot[:] = 0.0
                lq[:] = 0.0
                for j in range(a, e):
                    c = codes[t, j]
                    count[c] += 1.0
                    ltot[c] += v[j]
                    lq[c] += qn[j]
                bg = 0
                for g in range(G):
                    cnt[p, t, g] = count[g]
                    tot[p, t, g] = ltot[g]
                    q[p, t, g] = lq[g]
                    if count[g] > count[bg]:
                        bg = g
                big[u] = bg
            acc[:nb] = 0.0
            for r0 in range(a, e, RB):  # a block of rows, in L2 for the nb draws
                r1 = min(r0 + RB, e)
                for u0 in range(0, nb, T):
                    u1 = min(u0 + T, nb)
                    for j in range(r0, r1):  # each row read once for the draws u0 … u1 − 1
                        r = idx[j]
                        n = lens[r]
                        for u in range(u0, u1):
                            c = codes[t0 + u, j]
                            if c != big[u]:
                                for k in range(n):
                                    acc[u, c, k] += U[r, k]
            for u in range(nb):
                t = t0 + u
                for g in range(G):
                    if g == big[u]:
                        continue
                    s = 0.0
                    for k in range(d):
                        s += np.float64(acc[u, g, k]) * acc[u, g, k]
                    sq[p, t, g] = s
                rest[:] = total
                for g in range(G):
                    if g != big[u]:
                        for k in range(d):
                            rest[k] -= acc[u, g, k]
                s = 0.0
                for k in range(d):
                    s += rest[k] * rest[k]
                sq[p, t, big[u]] = s
