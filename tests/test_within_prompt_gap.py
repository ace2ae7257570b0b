"""The within-prompt homogeneity gap (biasaudit.stats.homogeneity.within_prompt_table) against brute force
from its definition: per prompt, the full cosine matrix and explicit pair masks."""

import numpy as np
import pytest

from biasaudit.stats import homogeneity as H

from .conftest import calibration_module


def brute_within(X, prompts, labels, cats):
    """Σ_p w_pg Δ_pg / Σ_p w_pg with Δ_pg = mean cos(g, g) − mean cos(g, other labelled) inside prompt p and
    w_pg = n_pg n_rest / (n_pg + n_rest) where n_pg ≥ 2 and n_rest ≥ 1; zero / NaN rows are no images."""
    X = np.asarray(X, dtype=np.float64)
    norms = np.linalg.norm(X, axis=1)
    good = np.isfinite(norms) & (norms > 0)
    out = {}

    def cos(i, j):
        return X[i] @ X[j] / (norms[i] * norms[j])

    for g in cats:
        num = den = 0.0
        for p in dict.fromkeys(prompts):
            rows = [i for i in range(len(X)) if prompts[i] == p and good[i] and labels[i] is not None]
            ing = [i for i in rows if labels[i] == g]
            rest = [i for i in rows if labels[i] != g]
            if len(ing) < 2 or not rest:
                continue
            intra = np.mean([cos(i, j) for i in ing for j in ing if i != j])
            inter = np.mean([cos(i, j) for i in ing for j in rest])
            w = len(ing) * len(rest) / (len(ing) + len(rest))
            num, den = num + w * (intra - inter), den + w
        out[g] = num / den if den > 0 else np.nan
    return out


def _data(seed, P=6, m=14, d=8, missing=0.1):
    rng = np.random.default_rng(seed)
    prompts = np.repeat([f"p{k}" for k in range(P)], m)
    X = rng.normal(size=(P, d))[np.repeat(np.arange(P), m)] + rng.normal(size=(P * m, d))
    labels = rng.choice(np.array(["a", "b", "c"], dtype=object), size=P * m, p=[0.5, 0.3, 0.2])
    labels[rng.random(P * m) < missing] = None
    return X, prompts, labels


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_within_prompt_gap_equals_brute_force(seed):
    X, prompts, labels = _data(seed)
    X[3] = 0.0  # a zero row and a non-finite row are no images
    X[17, 2] = np.nan
    t = H.within_prompt_table(X, prompts, {"race": labels}, n_boot=0, n_perm=0, paper=False, small_group=30)["race"]
    ref = brute_within(X, prompts, labels, ["a", "b", "c"])
    np.testing.assert_allclose(t.set_index("group")["wp_gap"].to_numpy(), [ref[g] for g in "abc"], atol=1e-6)


def test_group_without_within_prompt_pairs_is_nan_with_reason():
    X, prompts, labels = _data(3)
    labels = labels.copy()
    labels[labels == "c"] = "b"
    first = np.flatnonzero(prompts == "p0")[0]
    labels[first] = "c"  # one image of c: no pair inside any prompt
    t = H.within_prompt_table(X, prompts, {"race": labels}, n_boot=50, n_perm=0, paper=False, small_group=30)["race"]
    c = t.set_index("group").loc["c"]
    assert np.isnan(c["wp_gap"]) and c["n_prompts"] == 0 and "no within-prompt pairs" in c["reason"]


def test_prompt_level_similarity_cancels():
    """Every image of a prompt equal to the prompt's vector, labels concentrated in a few prompts: each
    within-prompt pair has cosine 1, so the within-prompt gap is exactly 0, while the paper's
    unstratified gap reads the concentration as homogeneity (positive)."""
    rng = np.random.default_rng(4)
    P, m = 10, 20
    centres = rng.normal(size=(P, 6))
    prompts = np.repeat(np.arange(P), m)
    X = centres[prompts] + 1e-9 * rng.normal(size=(P * m, 6))
    share_a = np.where(np.arange(P) < 2, 0.9, 0.1)[prompts]  # group a concentrated in prompts 0 and 1
    labels = np.where(rng.random(P * m) < share_a, "a", "b").astype(object)
    t = H.within_prompt_table(X, prompts, {"race": labels}, n_boot=0, n_perm=0,
                              small_group=30)["race"].set_index("group")
    assert t.loc["a", "wp_gap"] == pytest.approx(0.0, abs=1e-6)
    assert t.loc["a", "gap"] > 0.01


def test_bootstrap_replicate_equals_brute_force_on_duplicated_prompts():
    """A replicate of the prompt-cluster bootstrap (cluster weights w) equals the brute-force gap on the
    data with prompt p copied w_p times, each copy its own prompt."""
    from biasaudit.stats.resample import sums_statistic

    X, prompts, labels = _data(5, P=5)
    codes, cats = H._codes(labels, ["a", "b", "c"])
    pcodes, names = H._codes(prompts)
    totals = H.within_prompt_totals_from_cells(*H.cell_sums(X, codes, pcodes, 3, len(names)))
    stat = sums_statistic(totals, H.within_prompt_statistic(3))
    w = np.array([[2.0, 0, 1, 0, 2]])
    got = stat(w)[0, :3]
    rows, new_prompts = [], []
    for k, p in enumerate(names):
        for copy in range(int(w[0, k])):
            idx = np.flatnonzero(prompts == p)
            rows += list(idx)
            new_prompts += [f"{p}#{copy}"] * len(idx)
    ref = brute_within(X[rows], np.array(new_prompts), labels[rows], cats)
    np.testing.assert_allclose(got, [ref[g] for g in cats], atol=1e-6)


def test_near_duplicate_rate_equals_brute_force():
    X, prompts, labels = _data(6)
    X[5] = X[6] * 3.0 + 1e-4  # a near copy inside prompt p0 (cosine ≈ 1)
    X[40] = X[41]
    t = H.within_prompt_table(X, prompts, {"race": labels}, n_boot=0, n_perm=0, near_dup_cosine=0.9,
                              paper=False, small_group=30)["race"].set_index("group")
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    flag = np.zeros(len(X), bool)
    for p in set(prompts):
        r = np.flatnonzero(prompts == p)
        K = U[r] @ U[r].T
        np.fill_diagonal(K, -2)
        flag[r] = K.max(axis=1) >= 0.9
    for g in "abc":
        m = labels == g
        assert t.loc[g, "near_dup_rate"] == pytest.approx(flag[m].mean())
    assert flag.sum() >= 4


def test_permutation_test_signal_noise_and_sequential_stopping():
    rng = np.random.default_rng(7)
    P, m = 20, 30
    prompts = np.repeat(np.arange(P), m)
    X = rng.normal(size=(P, 16))[prompts] + rng.normal(size=(P * m, 16))
    labels = rng.choice(np.array(["a", "b", "c"], dtype=object), size=P * m)
    full = H.within_prompt_table(X, prompts, {"r": labels}, n_boot=0, n_perm=199, seed=1, paper=False,
                                 small_group=30)["r"]
    assert (full["n_perm"] == 199).all() and (full["p_perm"] >= 1 / 200).all()
    early = H.within_prompt_table(X, prompts, {"r": labels}, n_boot=0, n_perm=999, seed=1, stop_after=10,
                                  paper=False, small_group=30)["r"]
    assert early["n_perm"].iloc[0] < 999  # null data: every test reaches 10 exceedances early
    assert (early["p_perm"] > 0.01).all()
    X2 = X.copy()
    a = labels == "a"
    X2[a] += 1.5 * rng.normal(size=(P, 16))[prompts[a]]  # a's images of one prompt share a direction
    sig = H.within_prompt_table(X2, prompts, {"r": labels}, n_boot=0, n_perm=199, seed=1, stop_after=10,
                                paper=False, small_group=30)["r"].set_index("group")
    assert sig.loc["a", "p_perm"] == pytest.approx(1 / 200) and sig.loc["a", "p_global"] == pytest.approx(1 / 200)


def test_two_labellings_share_one_pass_and_agree_with_separate_runs():
    X, prompts, labels = _data(8)
    rng = np.random.default_rng(9)
    bins = rng.choice(np.array(["<40", "[40,55)", None], dtype=object), size=len(X))
    both = H.within_prompt_table(X, prompts, {"race": labels, "L_bin": bins}, n_boot=100, n_perm=0, seed=3,
                                 small_group=30)
    alone = H.within_prompt_table(X, prompts, {"L_bin": bins}, n_boot=100, n_perm=0, seed=3, small_group=30)
    np.testing.assert_allclose(both["L_bin"]["wp_gap"], alone["L_bin"]["wp_gap"], atol=1e-12)
    ref = brute_within(X, prompts, bins, ["<40", "[40,55)"])
    np.testing.assert_allclose(alone["L_bin"]["wp_gap"], [ref["<40"], ref["[40,55)"]], atol=1e-6)


def test_prompt_blocks_are_each_prompts_usable_rows_over_their_norms(tmp_path):
    """Against the definition (float64 norms), however X comes: each prompt's rows adjacent in X (read in place),
    interleaved with other prompts' (gathered), Fortran order, memory-mapped, float64, float16, and unnormalised.
    A row without a prompt is no prompt's; a zero or non-finite one is left out and flagged. The same rows in the
    same order within each prompt give the same bytes whichever way X is laid out."""
    rng = np.random.default_rng(12)
    prompts = np.repeat(np.array(["b", "a", "c"], dtype=object), [9, 7, 11])
    X = rng.normal(size=(27, 13)).astype(np.float32)
    X[[2, 20]] = 0
    X[5, 4], X[16, 0] = np.nan, np.inf
    prompts[24] = None
    rank = np.array([list(prompts[:i]).count(prompts[i]) for i in range(27)])  # place within its prompt
    mixed = np.lexsort((prompts.astype(str), rank))  # prompts interleaved, each one's rows in their order
    np.save(tmp_path / "x.npy", X)
    layouts = [(X, prompts), (X[mixed], prompts[mixed]), (np.asfortranarray(X), prompts),
               (np.load(tmp_path / "x.npy", mmap_mode="r"), prompts), (X.astype(np.float64), prompts),
               (X.astype(np.float16), prompts)]
    same = set()
    for Xv, pv in layouts:
        F = np.asarray(Xv, np.float64)
        usable = np.isfinite(F).all(axis=1) & (F != 0).any(axis=1)
        blocks, raw = H.prompt_blocks(Xv, pv), H.prompt_blocks(Xv, pv, normalise=False)
        assert blocks.prompts == ["a", "b", "c"]
        assert blocks.units.dtype == raw.units.dtype == (np.float64 if Xv.dtype == np.float64 else np.float32)
        assert list(np.flatnonzero(blocks.n_dropped)) == [i for i in range(27) if pv[i] is not None and not usable[i]]
        for p, name in enumerate(blocks.prompts):
            rows = [i for i in range(27) if pv[i] == name and usable[i]]
            assert list(blocks.rows[p]) == list(raw.rows[p]) == rows
            U = blocks.units[blocks.bounds[p]:blocks.bounds[p + 1]]
            np.testing.assert_allclose(U, F[rows] / np.linalg.norm(F[rows], axis=1, keepdims=True), rtol=1e-6)
            np.testing.assert_array_equal(raw.units[raw.bounds[p]:raw.bounds[p + 1]], F[rows])
        if Xv.dtype == np.float32:
            same.add(blocks.units.tobytes())
    assert len(same) == 1


def test_within_draws_shuffle_only_inside_each_prompt_among_labelled_rows():
    rng = np.random.default_rng(10)
    prompts = np.repeat(np.arange(4), 12)
    codes = rng.integers(-1, 3, size=48)
    blocks = H.prompt_blocks(rng.normal(size=(48, 5)), prompts)
    lab = H._labelled(blocks, codes, 3)
    assert (lab.idx == np.flatnonzero(codes >= 0)).all()  # only labelled rows take part (rows already by prompt)
    drawn = H.draw_within(lab, 50, rng)
    assert drawn.shape == (50, int((codes >= 0).sum()))
    for a, e in zip(lab.bounds[:-1], lab.bounds[1:]):
        for row in drawn[:, a:e]:
            assert sorted(row) == sorted(codes[codes >= 0][a:e])  # the prompt's label multiset is kept
    assert len({tuple(r) for r in drawn}) > 1


def test_across_design_detects_signal():
    rng = np.random.default_rng(11)
    P, m = 10, 20
    prompts = np.repeat(np.arange(P), m)
    labels = rng.choice(np.array(["a", "b"], dtype=object), size=P * m)
    X = rng.normal(size=(P * m, 8))
    X[labels == "a"] += 2.0
    t = H.within_prompt_table(X, prompts, {"r": labels}, n_boot=0, n_perm=99, design="across", paper=False,
                              small_group=30)["r"]
    assert t.set_index("group").loc["a", "p_perm"] == pytest.approx(1 / 100) and (t["design"] == "across").all()


def test_paper_gap_beside_it_equals_the_unstratified_functions():
    """The paper's gap and CI in the table (from the same one-pass cell sums) equal homogeneity_gap and
    bootstrap_gap, which are checked against brute force in test_homogeneity.py."""
    X, prompts, labels = _data(12)
    X[7] = 0.0
    t = H.within_prompt_table(X, prompts, {"race": labels}, n_boot=200, n_perm=0, seed=5,
                              small_group=30)["race"].set_index("group")
    ref = H.homogeneity_gap(X, labels, categories=["a", "b", "c"], small_group=30).set_index("group")
    ci = H.bootstrap_gap(X, labels, prompts, n_boot=200, seed=5, categories=["a", "b", "c"]).set_index("group")
    np.testing.assert_allclose(t["gap"], ref["gap"], atol=1e-9)
    np.testing.assert_allclose(t[["gap_lo", "gap_hi"]], ci[["gap_lo", "gap_hi"]], atol=1e-9)
    assert (t["n_dropped"] == ref["n_dropped"]).all()


def brute_prompt_terms(U, prompts, labels, g):
    """Per prompt where g has 2 or more images and another labelled one: (a_p = w_p Δ_p, w_p) from explicit mean
    cosines over distinct pairs of the unit rows U; a row labelled None is no image."""
    a, w = [], []
    for p in dict.fromkeys(prompts):
        rows = [i for i in range(len(U)) if prompts[i] == p and labels[i] is not None]
        ing = [i for i in rows if labels[i] == g]
        rest = [i for i in rows if labels[i] != g]
        if len(ing) < 2 or not rest:
            continue
        intra = np.mean([U[i] @ U[j] for i in ing for j in ing if i != j])
        inter = np.mean([U[i] @ U[j] for i in ing for j in rest])
        wp = len(ing) * len(rest) / (len(ing) + len(rest))
        a.append(wp * (intra - inter))
        w.append(wp)
    return np.array(a), np.array(w)


def brute_studentised(X, prompts, labels, g):
    """Σ_p a_p / √Σ_p (a_p − Δ w_p)², a_p = w_p Δ_p, Δ = Σ a / Σ w: the gap over its prompt-cluster
    (linearised) SE, from explicit pair means per prompt."""
    X = np.asarray(X, dtype=np.float64)
    a, w = brute_prompt_terms(X / np.linalg.norm(X, axis=1, keepdims=True), prompts, labels, g)
    delta = a.sum() / w.sum()
    return a.sum() / np.sqrt(((a - delta * w) ** 2).sum())


def test_studentised_statistic_equals_brute_force():
    X, prompts, labels = _data(11, P=7, m=15)
    labels[:3] = None  # unlabelled rows weigh 0
    cats = ["a", "b", "c"]
    blocks = H.prompt_blocks(X, prompts)
    codes = H._codes(labels, cats)[0]
    stud, plain = (H.within_prompt_statistics(blocks, [(codes, 3)], studentise=s)[0] for s in (True, False))
    np.testing.assert_allclose(stud[:3], [brute_studentised(X, prompts, labels, g) for g in cats], rtol=1e-5)
    ref = brute_within(X, prompts, labels, cats)
    np.testing.assert_allclose(plain[:3], [ref[g] for g in cats], atol=1e-6)
    assert stud[3] == pytest.approx(plain[3])  # the global statistic is the plain pooled gap either way


@pytest.mark.slow
def test_a_null_group_beside_a_strongly_homogeneous_one_does_not_reject():
    """ρ = 0.6 in benchmarks/calibration.py's data model: each prompt's group-h images share 60% of
    their noise. Null groups have the same marginal law (their own within-prompt gap is 0), but h
    breaks exchangeability: the unstudentised test then rejects a null group more often than its
    level (0.093 on average over the four here), the studentised one does not (0.039)."""
    cal = calibration_module()  # its data model: labels depend on the prompt, group h = "black"
    rng = np.random.default_rng(2026)
    h, reps = cal.GROUPS.index("black"), 200
    null = [i for i in range(len(cal.GROUPS)) if i != h]
    reject = {True: [], False: []}
    for rep in range(reps):
        X, labels, prompts = cal._wp_data(rng, 50, 100, rho=0.6)
        codes = H._codes(labels, list(cal.GROUPS))[0]
        blocks = H.prompt_blocks(X, prompts)
        for studentise in (True, False):
            p = H.within_prompt_permutations(blocks, [(codes, 5)], 99, seed=rep, stop_after=10,
                                             studentise=studentise)[0][0]
            reject[studentise].append(((p[null] < 0.05).mean(), p[h] < 0.05))
    stud, plain = np.mean(reject[True], axis=0), np.mean(reject[False], axis=0)
    assert stud[1] == 1.0 and plain[1] == 1.0  # power for h either way
    assert stud[0] <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / (4 * reps))  # mean over the 4 null groups' tests
    assert plain[0] > 0.06  # the design this replaces fails here: the check can fail


def test_a_group_in_few_prompts_gets_the_expansion_of_its_own_prompt_count_and_a_flag(monkeypatch):
    """The interval's small-cluster expansion counts the prompts where the group has pairs (not all P): a
    group with pairs in 3 of 20 prompts is expanded for 3 clusters, flagged few_prompts with the reason; a
    group with pairs in 1 prompt is flagged and gets no interval."""
    seen = []

    def spy(rep, level, method, **kw):
        seen.append(np.asarray(kw["n_effective"]))
        return intervals(rep, level, method, **kw)

    intervals = H.intervals
    monkeypatch.setattr(H, "intervals", spy)
    rng = np.random.default_rng(3)
    P, m = 20, 12
    prompts = np.repeat(np.arange(P), m)
    labels = np.array(["b"] * (P * m), dtype=object)
    labels[::m] = "d"  # one d per prompt: b has another labelled image everywhere
    for p in (0, 5, 9):
        labels[p * m + 1:p * m + 5] = "a"  # pairs of a in 3 prompts
    labels[15 * m + 1:15 * m + 4] = "c"  # c in 1 prompt
    X = rng.normal(size=(P * m, 6)) + rng.normal(size=(P, 6))[prompts]
    t = H.within_prompt_table(X, prompts, {"race": labels}, n_boot=400, n_perm=0, paper=False, small_group=30)["race"]
    t = t.set_index("group")
    assert list(t.index) == ["a", "b", "c", "d"]
    assert t["n_prompts"].tolist() == [3, P, 1, 0]
    assert seen[0].tolist() == [3, P, 1, 0] * 3  # gap, intra, inter of each group
    assert bool(t.loc["a", "few_prompts"]) and "only 3 prompt(s)" in t.loc["a", "wp_ci_reason"]
    assert np.isfinite(t.loc["a", "wp_gap_lo"])
    assert t["few_prompts"].tolist() == [True, False, True, False] and t.loc["b", "wp_ci_reason"] == ""
    assert np.isnan(t.loc["c", "wp_gap_lo"]) and "fewer than 2" in t.loc["c", "wp_ci_reason"]
    assert "only 1 prompt(s)" in t.loc["c", "wp_ci_reason"]  # d: no prompt with pairs, its gap is undefined


def test_similarity_by_L_bin_has_intervals_and_the_difference_between_adjacent_bins():
    """The paper's similarity-by-L* rows: each bin's mean intra-bin cosine over every pair (brute force here)
    with its interval, and a bin minus the next lighter bin (the paper's 0.405 − 0.183 = 0.222) with an
    interval from the same resamples: where the darkest bin is planted tight (a shared direction), the
    difference's interval lies above 0."""
    rng = np.random.default_rng(11)
    prompts = np.repeat([f"p{i}" for i in range(12)], 12)
    bins = np.tile(["<40"] * 3 + ["[40,55)"] * 5 + ["≥70"] * 4, 12).astype(object)
    X = rng.normal(size=(len(prompts), 16))
    X[bins == "<40"] += 3 * np.eye(16)[0]  # the darkest faces share a look
    t = H.within_prompt_table(X, prompts, {"L_bin": bins}, n_boot=300, n_perm=0, small_group=2)["L_bin"]
    t = t.set_index("group")
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    for g in ("<40", "[40,55)", "≥70"):
        S = U[bins == g] @ U[bins == g].T
        assert t.loc[g, "intra"] == pytest.approx(S[np.triu_indices(len(S), 1)].mean())
        assert t.loc[g, "intra_lo"] <= t.loc[g, "intra"] <= t.loc[g, "intra_hi"]
    assert list(t.index) == ["<40", "[40,55)", "≥70"]  # the table's order is dark to light
    d = t.loc["<40", "intra"] - t.loc["[40,55)", "intra"]
    assert t.loc["<40", "intra_minus_next"] == pytest.approx(d)
    assert 0 < t.loc["<40", "intra_minus_next_lo"] <= d <= t.loc["<40", "intra_minus_next_hi"]
    assert np.isnan(t.loc["≥70", "intra_minus_next"])  # no lighter bin
    race = H.within_prompt_table(X, prompts, {"race": bins}, n_boot=0, n_perm=0, small_group=2)["race"]
    assert "intra_minus_next" not in race  # an unordered labelling has no "next"
