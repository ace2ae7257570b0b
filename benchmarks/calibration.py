"""Calibration suite: every interval and test the report prints, checked by simulation with known truth.

For each check and setting, `reps` independent data sets are drawn from a model whose true value is
known (closed form or a large Monte Carlo of the population), and the *real* analysis functions are
run on each: the observed coverage of the nominal 95% interval (or the rejection rate at 0.05 under
a true null) is reported with its Monte-Carlo standard error √(r(1−r)/reps).

Settings: paper scale (50 prompts × 100 images; 48 source photos × 10 groups) and small scale
(10 prompts; 12 and 6 source photos, answers from the planted VLM of biasaudit.vlm.planted). A row is `ok` when coverage lies in [0.93, 0.97] (rejection in
[0.03, 0.07]); a small-scale row outside it is labelled `falls short (small scale)`, a paper-scale
one `FAILS at paper scale`; rows of a documented limitation say so (e.g. "n < 50, skewed: under-covers").
A coverage row whose check reports its intervals' widths (`Covered`) gives their mean (`mean_width`).
The audit card's impact ratios (Method B) have rows at 48 and 12 source photos, with equal rates, one group
at 0.7 and a clear top group, under two data-generating processes; beside each coverage row, the share of
no-disparity groups read "below 0.8" (kind `false mark`: ok at most 0.05), or of the 0.7 group (power).
Beyond the scenarios the estimators were built with, it draws the corrected TVD's audits from a random
grid of distortions and confusion matrices (GRID_FILE; the share of audits where its estimate is closer
to the truth than raw must reach BEATS_RAW) and checks the bootstrap on a skewed mean at small n.

    python benchmarks/calibration.py [--reps 500] [--n-boot 999] [--only NAME ...] [--fast]

writes reports/calibration/calibration.csv (and prints it). `--fast` runs the subset the test
suite runs (paper scale, fewer replications).
"""

from __future__ import annotations

import argparse
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from biasaudit import GROUPS
from biasaudit.contracts import COVERAGE_BAND, MIN_PROMPTS_CI, REJECTION_BAND
from biasaudit.params.vlm import Reflect

NOMINAL_COVERAGE, NOMINAL_LEVEL = 0.95, 0.05
BEATS_RAW = 0.60  # a corrected estimate earns its place when closer to the truth than raw this often
OUT = Path("reports/calibration/calibration.csv")
# the simulated Method B design (vlm.planted.simulate_responses): the 2AFC income task and the real single-image tasks
WITH_INCOME = Reflect(tasks=["2afc_income", "mcq_salary", "mcq_education", "salary_salary"])


@dataclass(frozen=True)
class Check:
    name: str | tuple[str, ...]  # method: the interval or test (a tuple: one replication answers several)
    kind: str | tuple[str, ...]  # coverage | rejection (a tuple: one per name)
    setting: str
    scale: str  # paper | small
    run: Callable[[np.random.Generator, int], "bool | Covered | tuple[bool | Covered, ...]"]  # one replication
    note: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        return self.name if isinstance(self.name, tuple) else (self.name,)


@dataclass(frozen=True)
class Covered:
    """One replication of an interval: whether it covers the truth, and its width (the table's
    mean_width: how much a coverage is bought with)."""

    hit: bool
    width: float


# ---------------------------------------------------------------- Method A: TVD

BASE = np.array([0.6, 0.12, 0.08, 0.15, 0.05])
SKEW = np.array([0.85, 0.05, 0.05, 0.03, 0.02])


def _prompts(rng, P, strength):
    q = rng.dirichlet(5 * BASE, size=P)
    p = (1 - strength) * q + strength * SKEW
    return q, p


def _per_prompt(q, p, n, rng, model="a", start=0):
    from biasaudit.stats.tvd import bias_corrected_tvd, null_floor, tvd

    counts = np.stack([rng.multinomial(n, row) for row in p])
    frame = pd.DataFrame({"model": model, "category": "c", "prompt_id": [f"p{start + i}" for i in range(len(q))],
                          "n": n, "n_unknown": 0})
    for j, g in enumerate(GROUPS):
        frame[f"n_{g}"] = counts[:, j]
        frame[f"share_{g}"] = counts[:, j] / n
        frame[f"bench_{g}"] = q[:, j]
    frame["tvd"] = tvd(counts / n, q)
    frame["null_floor"] = null_floor(np.full(len(q), n), q)
    frame["tvd_bias_corrected"] = bias_corrected_tvd(counts, q)
    return frame


_TRUTH: dict = {}


def _population_tvd(strength, n, samples=400_000):
    """(population mean of E[observed TVD] at n, population mean of the true TVD, E[share − bench] black)."""
    key = (strength, n)
    if key not in _TRUTH:
        from biasaudit.stats.tvd import expected_tvd, tvd

        q, p = _prompts(np.random.default_rng(12345), samples, strength)
        _TRUTH[key] = (float(expected_tvd(np.full(samples, n), p, q).mean()), float(tvd(p, q).mean()),
                       float((p[:, 1] - q[:, 1]).mean()))
    return _TRUTH[key]


def tvd_check(which: str, P: int, n: int, strength: float, n_boot: int):
    from biasaudit.t2i.analysis.inputs import Boot
    from biasaudit.t2i.analysis.representation import deviation_summary, tvd_summary

    def run(rng, rep):
        boot = Boot(n_boot, 0.95, "percentile", rep, "holm", "within")
        q, p = _prompts(rng, P, strength)
        pp = _per_prompt(q, p, n, rng)
        expected_obs, true_tvd, dev_black = _population_tvd(strength, n)
        if which == "deviation":
            d = deviation_summary(pp, boot, GROUPS)
            r = d[(d["category"] == "c") & (d["race"] == "black")].iloc[0]
            return r["mean_deviation_low"] <= dev_black <= r["mean_deviation_high"]
        s = tvd_summary(pp, boot, GROUPS)
        r = s[s["category"] == "c"].iloc[0]
        if which == "mean_tvd":
            return r["mean_tvd_low"] <= expected_obs <= r["mean_tvd_high"]
        return r["tvd_bias_corrected_low"] <= true_tvd <= r["tvd_bias_corrected_high"]

    return run


def _annotated_sample(rng, p, M, n_images=300, accuracy=0.95, group_accuracy=None, raters=2):
    """The reliability sample: n_images drawn from the audited prompts' true shares p (pooled), each
    labelled by the classifier (through M) and by `raters` raters who are right with `accuracy` (per
    group: group_accuracy), else pick one of the other groups uniformly (as the SIMULATED raters)."""
    k = len(GROUPS)
    true = rng.choice(k, size=n_images, p=p.mean(axis=0))
    classifier = (rng.random((n_images, 1)) > np.cumsum(M[true], axis=1)).sum(axis=1).clip(max=k - 1)
    acc = np.array([(group_accuracy or {}).get(g, accuracy) for g in GROUPS])[true]
    humans = []
    for _ in range(raters):
        wrong = rng.random(n_images) > acc
        other = (true + rng.integers(1, k, size=n_images)) % k
        humans.append(np.where(wrong, other, true))
    return [[GROUPS[h[i]] for h in humans] for i in range(n_images)], [GROUPS[c] for c in classifier]


def debiased_check(P: int, n: int, strength: float, reference: str, n_boot: int):
    """stats.correction.debiased_tvd on classified counts (true shares p through the paper's confusion
    pattern M) with M estimated from a simulated reliability sample (2 raters, 95% right, 90% on
    Hispanic faces): (honest interval covers the true mean TVD over these prompts, point estimate
    closer to it than the raw TVD)."""
    from biasaudit.params.classify import DEFAULT_SIM_CONFUSION
    from biasaudit.stats.correction import debiased_tvd, image_confusions, reference_labels
    from biasaudit.stats.tvd import tvd

    M = np.array([[DEFAULT_SIM_CONFUSION[t][c] for c in GROUPS] for t in GROUPS])
    M = M / M.sum(axis=1, keepdims=True)

    def run(rng, rep):
        q, p = _prompts(rng, P, strength)
        counts = np.stack([rng.multinomial(n, row @ M) for row in p])
        humans, classifier = _annotated_sample(rng, p, M, group_accuracy={"hispanic": 0.9})
        E = image_confusions(reference_labels(humans, reference), classifier, GROUPS)
        iv, _ = debiased_tvd(counts, q, E, GROUPS, n_boot=n_boot, seed=rep)
        truth = float(tvd(p, q).mean())
        raw = float(tvd(counts / n, q).mean())
        return Covered(bool(iv.low <= truth <= iv.high), iv.high - iv.low), abs(iv.estimate - truth) < abs(raw - truth)

    return run


# The random distortion grid (drawn once, committed: benchmarks/data/tvd_grid.json, `python
# benchmarks/tvd_grid.py --write` redraws it from GRID_SEED). Per point: factors s_g = 5·w_g with
# w ~ Dirichlet(3, …, 3) (mean 1 per group: the model multiplies each benchmark share by s_g and
# renormalises) and a confusion matrix whose row t ~ Dirichlet(50 · row t of the default SIMULATED
# confusion): random distortions and classifiers around the benchmark's.
GRID_FILE = Path(__file__).resolve().parent / "data" / "tvd_grid.json"
GRID_SEED, GRID_POINTS, DISTORTION_CONCENTRATION, CONFUSION_CONCENTRATION = 2026, 12, 3.0, 50.0
# the case an independent simulation found: Asian × 2, White × 0.6, 25% of Hispanic faces called White
FAILING_CASE = {"name": "Asian ×2, White ×0.6, 25% Hispanic→White", "scale": [0.6, 1.0, 2.0, 1.0, 1.0],
                "hispanic_row": [0.25, 0.02, 0.10, 0.60, 0.03]}


def default_confusion() -> np.ndarray:
    from biasaudit.params.classify import DEFAULT_SIM_CONFUSION

    M = np.array([[DEFAULT_SIM_CONFUSION[t][c] for c in GROUPS] for t in GROUPS])
    return M / M.sum(axis=1, keepdims=True)


def draw_grid(seed: int = GRID_SEED, points: int = GRID_POINTS) -> list[dict]:
    rng = np.random.default_rng(seed)
    M0, k = default_confusion(), len(GROUPS)
    out = []
    for i in range(points):
        s = k * rng.dirichlet(np.full(k, DISTORTION_CONCENTRATION))
        M = np.stack([rng.dirichlet(CONFUSION_CONCENTRATION * row) for row in M0])
        out.append({"name": f"grid{i:02d}", "scale": [round(float(v), 6) for v in s],
                    "confusion": [[round(float(v), 6) for v in row] for row in M]})
    return out


def failing_case() -> dict:
    M = default_confusion()
    M[GROUPS.index("hispanic")] = FAILING_CASE["hispanic_row"]
    return {"name": FAILING_CASE["name"], "scale": FAILING_CASE["scale"], "confusion": M.tolist()}


def load_grid(path: Path = GRID_FILE) -> list[dict]:
    import json

    return json.loads(path.read_text())["points"]


def distortion_audit(rng, P: int, n: int, point: dict, declared: bool):
    """One simulated audit at a grid point: benchmarks q ~ Dirichlet(5·BASE) per prompt, true shares
    p ∝ q·s, classified counts ~ Multinomial(n, Mᵀp), and (unless M is declared) a reliability sample
    of 300 images (2 raters, 95% right, 90% on Hispanic faces) M is estimated from against consensus.
    Returns (counts, q, E or None, M, the true mean TVD over these prompts)."""
    from biasaudit.stats.correction import image_confusions, reference_labels
    from biasaudit.stats.tvd import tvd

    s, M = np.asarray(point["scale"], dtype=float), np.asarray(point["confusion"], dtype=float)
    q = rng.dirichlet(5 * BASE, size=P)
    p = q * s
    p /= p.sum(axis=1, keepdims=True)
    counts = np.stack([rng.multinomial(n, row @ M) for row in p]).astype(float)
    E = None
    if not declared:
        humans, classifier = _annotated_sample(rng, p, M, group_accuracy={"hispanic": 0.9})
        E = image_confusions(reference_labels(humans, "consensus"), classifier, GROUPS)
    return counts, q, E, M, float(tvd(p, q).mean())


def grid_check(P: int, n: int, points: list[dict] | None, n_boot: int, declared: bool = False):
    """debiased_tvd over the random grid (replication r at point r mod len), or at one point: (honest
    interval covers the true mean TVD, point estimate closer to it than the raw TVD)."""
    from biasaudit.stats.correction import debiased_tvd
    from biasaudit.stats.tvd import tvd

    def run(rng, rep):
        grid = points if points is not None else load_grid()
        counts, q, E, M, truth = distortion_audit(rng, P, n, grid[rep % len(grid)], declared)
        iv, _ = debiased_tvd(counts, q, E, GROUPS, n_boot=n_boot, seed=rep, M=M if declared else None)
        raw = float(tvd(counts / n, q).mean())
        return Covered(bool(iv.low <= truth <= iv.high), iv.high - iv.low), abs(iv.estimate - truth) < abs(raw - truth)

    return run


def failing_point_check(P: int, n: int, n_boot: int):
    """The unseen distortion (FAILING_CASE) with M estimated from 300 annotated images: (honest interval
    covers the true mean TVD (Covered: its width), the point the report reads (point_rule: MSE-weighted
    from MIN_PROMPTS_POINT prompts, else raw) closer to the truth than raw, the report reads raw there
    (the declared rule), one-sided lower bound ≤ the truth, lower bound > 0, null-floor test p ≤ 0.05)."""
    from biasaudit.stats.correction import debiased_tvd, point_rule

    def run(rng, rep):
        counts, q, E, M, truth = distortion_audit(rng, P, n, failing_case(), False)
        iv, info = debiased_tvd(counts, q, E, GROUPS, n_boot=n_boot, seed=rep)
        point, source = point_rule(P, info["mse_weighted"], info["raw"], info["weight"])
        return (Covered(bool(iv.low <= truth <= iv.high), iv.high - iv.low),
                abs(point - truth) < abs(info["raw"] - truth), source.startswith("raw"),
                Covered(bool(info["lower_bound"] <= truth), truth - info["lower_bound"]),
                info["lower_bound"] > 0, info["above_floor_p"] <= NOMINAL_LEVEL)

    return run


def floor_null_check(P: int, n: int, n_boot: int):
    """Model = benchmark (true TVD 0), the paper's confusion pattern, M from 300 annotated images:
    (null-floor test rejects at 0.05, lower bound > 0): both are false positives here."""
    from biasaudit.stats.correction import debiased_tvd

    M = default_confusion()

    def run(rng, rep):
        q, p = _prompts(rng, P, 0.0)
        counts = np.stack([rng.multinomial(n, row @ M) for row in p]).astype(float)
        humans, classifier = _annotated_sample(rng, p, M, group_accuracy={"hispanic": 0.9})
        from biasaudit.stats.correction import image_confusions, reference_labels
        E = image_confusions(reference_labels(humans, "consensus"), classifier, GROUPS)
        _, info = debiased_tvd(counts, q, E, GROUPS, n_boot=n_boot, seed=rep)
        return info["above_floor_p"] <= NOMINAL_LEVEL, info["lower_bound"] > 0

    return run


def failing_point_names(P: int) -> tuple[str, ...]:
    what = f"{FAILING_CASE['name']}, M vs consensus labels"
    return (f"debiased_tvd honest interval (true TVD, {what}; reported point)",
            f"tvd_point closer to the true TVD than raw ({what}; point_rule)",
            f"tvd_point reads raw, share of audits ({what}; point_rule, declared)",
            f"tvd_lower_bound one-sided 95% (true TVD, {what})",
            f"tvd_lower_bound > 0, power ({what})",
            f"tvd_above_floor_p ≤ 0.05, power ({what})")


# ---------------------------------------------------------------- skewed statistics at small n

SKEW_SIGMA = 1.0  # log-normal(0, 1): skewness ≈ 6.2; its mean is exp(σ²/2)


def skewed_mean_check(n: int, n_boot: int):
    """The mean of n i.i.d. log-normal(0, 1) values by the resampling engine (stats.resample, each value
    a cluster): do the percentile, basic and BCa intervals cover the true mean exp(½)?"""
    from biasaudit.stats.resample import intervals, replicates

    truth = float(np.exp(SKEW_SIGMA ** 2 / 2))

    def run(rng, rep):
        x = rng.lognormal(0.0, SKEW_SIGMA, size=n)
        out = []
        for method in ("percentile", "basic", "BCa"):
            rep_ = replicates(lambda w: (w @ x) / w.sum(axis=1), n, n_boot=n_boot, seed=rep, method=method)
            iv = intervals(rep_, 0.95, method)[0]
            out.append(iv.low <= truth <= iv.high)
        return tuple(out)

    return run


SKEWED = tuple(f"{m} CI of a skewed mean (log-normal σ = 1)" for m in ("percentile", "basic", "BCa"))


def paired_check(which: str, P: int, n: int, n_boot: int):
    """Two models on the same prompts: a skewed 0.5, b skewed 0.3 (coverage) or 0.5 too (null)."""
    from biasaudit.t2i.analysis.inputs import Boot
    from biasaudit.t2i.analysis.representation import tvd_paired

    sb = 0.5 if which == "test" else 0.3

    def run(rng, rep):
        q = rng.dirichlet(5 * BASE, size=P)
        pa, pb = 0.5 * q + 0.5 * SKEW, (1 - sb) * q + sb * SKEW
        pp = pd.concat([_per_prompt(q, pa, n, rng, "a"), _per_prompt(q, pb, n, rng, "b")], ignore_index=True)
        r = tvd_paired(pp, Boot(n_boot, 0.95, "percentile", rep, "holm", "within")).query("category == 'c'").iloc[0]
        if which == "test":
            return r["p_value"] < NOMINAL_LEVEL
        truth = _population_tvd(0.5, n)[0] - _population_tvd(sb, n)[0]
        return r["low"] <= truth <= r["high"]

    return run


# ---------------------------------------------------------------- Method A: homogeneity

PI = np.array([0.5, 0.2, 0.15, 0.1, 0.05])


def _embeddings(rng, P, m, d=16, confounded=False):
    centres = rng.normal(size=(P, d)) * 0.8 + 0.5
    prompts = np.repeat(np.arange(P), m)
    X = centres[prompts] + rng.normal(size=(P * m, d))
    if confounded:  # the label mix depends on the prompt, the embedding only on the prompt
        mix = rng.dirichlet(np.ones(5) * 0.7, size=P)[prompts]
    else:
        mix = np.broadcast_to(PI, (P * m, 5))
    labels = np.minimum((rng.random((P * m, 1)) > np.cumsum(mix, axis=1)).sum(axis=1), 4)
    return X, np.array(GROUPS)[labels], prompts


def gap_check(P: int, m: int, group: str, n_boot: int):
    """Labels independent of prompts and embeddings: the true gap of every group is exactly 0."""
    from biasaudit.stats.homogeneity import bootstrap_gap

    def run(rng, rep):
        X, labels, prompts = _embeddings(rng, P, m)
        ci = bootstrap_gap(X, labels, prompts, n_boot=n_boot, seed=rep, categories=list(GROUPS)).set_index("group")
        return ci.loc[group, "gap_lo"] <= 0.0 <= ci.loc[group, "gap_hi"]

    return run


def permutation_check(P: int, m: int, design: str, n_perm: int, family: bool = False):
    """Prompt-confounded null: no label effect given the prompt. Rejection of the largest group's test
    (and, with family, of any group after Holm adjustment, from the same replication)."""
    from biasaudit.stats.homogeneity import permutation_pvalue
    from biasaudit.stats.resample import p_adjust

    def run(rng, rep):
        X, labels, prompts = _embeddings(rng, P, m, confounded=True)
        out = permutation_pvalue(X, labels, n_perm=n_perm, seed=rep, categories=list(GROUPS),
                                 clusters=prompts if design == "within" else None, design=design)
        p = out["p_perm"].to_numpy()
        if family:
            return bool(p[0] < NOMINAL_LEVEL), bool((p_adjust(p, "holm") < NOMINAL_LEVEL).any())
        return bool(p[0] < NOMINAL_LEVEL)

    return run


# ---------------------------------------------------------------- Method A: within-prompt homogeneity
#
# Written from the definitions, not from biasaudit.stats.homogeneity. Prompt p has a centre
# μ_p ~ N(0.5, 0.8²·I) and a noise scale s_p ~ U(0.6, 1.4) (some prompts give more alike images), and
# a label mix π_p ~ Dirichlet(0.7·1): labels depend on the prompt. An image is x = μ_p + s_p·e with
# e ~ N(0, I); in a homogeneous group h, e = √(1−ρ)·ε + √ρ·η_ph with η_ph shared by h's images of
# prompt p. Every image has the same marginal law, so a null group is exactly as similar to h as to
# itself (its estimand is 0 by construction); h's own images are more alike (estimand > 0).

WP_D, WP_RHO = 16, 0.05
STRONG_RHO = (0.3, 0.6)  # a strongly homogeneous neighbour: the unstudentised per-group test over-rejects here


# "even": every group 20% on average and present in most prompts; "rare": Dirichlet(2·BASE), so 'other' (5% on
# average, concentration 0.1) has pairs in about 14 of 50 prompts: its gap rests on those prompts alone
WP_MIX = {"even": np.full(5, 0.7), "rare": 2 * BASE}
RARE_RHO = 0.3


def _wp_data(rng, P, m, rho=WP_RHO, homogeneous="black", near_dup=0.0, mix="even"):
    mu = rng.normal(size=(P, WP_D)) * 0.8 + 0.5
    s = rng.uniform(0.6, 1.4, size=P)
    mix = rng.dirichlet(WP_MIX[mix], size=P)
    prompts = np.repeat(np.arange(P), m)
    lab = np.minimum((rng.random((P * m, 1)) > np.cumsum(mix[prompts], axis=1)).sum(axis=1), 4)
    e = rng.normal(size=(P * m, WP_D))
    if homogeneous is not None and rho > 0:
        h = lab == GROUPS.index(homogeneous)
        eta = rng.normal(size=(P, WP_D))[prompts]
        e[h] = np.sqrt(1 - rho) * e[h] + np.sqrt(rho) * eta[h]
    X = mu[prompts] + s[prompts, None] * e
    if near_dup > 0:  # a share of images replaced by a near copy of another image of the same prompt
        dup = np.flatnonzero(rng.random(P * m) < near_dup)
        src = prompts[dup] * m + (dup % m + rng.integers(1, m, size=len(dup))) % m  # another image of the prompt
        X[dup] = X[src] + 0.02 * s[prompts[dup], None] * rng.normal(size=(len(dup), WP_D))
    return X, np.array(GROUPS, dtype=object)[lab], prompts


def _wp_estimand(group, m, rho=WP_RHO, homogeneous="black", n_prompts=20_000, mix="even"):
    """E_p[w_pg Δ_pg] / E_p[w_pg] over the population of prompts (w = n_pg (m − n_pg) / m where n_pg ≥ 2
    and another labelled image exists, else 0), by brute force: every prompt's full cosine matrix and explicit pair masks."""
    key = ("wp", group, m, rho, homogeneous, mix)
    if key not in _TRUTH:
        rng = np.random.default_rng(4242)
        num = den = 0.0
        for _ in range(n_prompts // 500):
            X, labels, prompts = _wp_data(rng, 500, m, rho, homogeneous, mix=mix)
            U = X / np.linalg.norm(X, axis=1, keepdims=True)
            for p in range(500):
                u, lab = U[p * m:(p + 1) * m], labels[p * m:(p + 1) * m]
                K = u @ u.T
                g = lab == group
                if g.sum() < 2 or (~g).sum() < 1:
                    continue
                pair_g = np.outer(g, g) & ~np.eye(m, dtype=bool)
                w = g.sum() * (~g).sum() / m
                num += w * (K[pair_g].mean() - K[np.outer(g, ~g)].mean())
                den += w
        _TRUTH[key] = num / den
    return _TRUTH[key]


def wp_gap_check(P: int, m: int, group: str, n_boot: int, paper: bool = False, homogeneous: str = "black",
                 rho: float = WP_RHO, mix: str = "even"):
    """Coverage of the population within-prompt gap of `group` by the within-prompt gap's prompt-cluster
    bootstrap CI (or, with `paper`, by the paper's unstratified gap CI: it reads prompt concentration
    as homogeneity). A data set where the group has no interval counts as not covered."""
    from biasaudit.stats.homogeneity import within_prompt_table

    n_truth = 100_000 if mix == "rare" else 20_000  # a rare group has pairs in few of the prompts drawn

    def run(rng, rep):
        X, labels, prompts = _wp_data(rng, P, m, rho, homogeneous, mix=mix)
        t = within_prompt_table(X, prompts, {"race": labels}, categories={"race": list(GROUPS)}, n_boot=n_boot,
                                n_perm=0, seed=rep, paper=paper, small_group=30)["race"].set_index("group").loc[group]
        truth = _wp_estimand(group, m, rho, homogeneous, n_truth, mix)
        lo, hi = (t["gap_lo"], t["gap_hi"]) if paper else (t["wp_gap_lo"], t["wp_gap_hi"])
        return Covered(bool(lo <= truth <= hi), float(hi - lo))

    return run


def wp_test_check(P: int, m: int, n_perm: int, rho: float, near_dup: float = 0.0, stop_after: int = 10):
    """Within-prompt permutation tests of the within-prompt gap (the stage's settings: Besag–Clifford
    stopping at 10 exceedances): (the largest null group's test rejects, any null group rejects after
    Holm, the homogeneous group's test rejects, the global test rejects), one replication."""
    from biasaudit.stats.homogeneity import within_prompt_table
    from biasaudit.stats.resample import p_adjust

    def run(rng, rep):
        X, labels, prompts = _wp_data(rng, P, m, rho=rho, near_dup=near_dup)
        t = within_prompt_table(X, prompts, {"race": labels}, categories={"race": list(GROUPS)}, n_boot=0,
                                n_perm=n_perm, seed=rep, stop_after=stop_after, paper=False, small_group=30)["race"]
        p = t.set_index("group")["p_perm"]
        null = [g for g in GROUPS if g != "black"] if rho > 0 else list(GROUPS)
        return (bool(p["white"] < NOMINAL_LEVEL), bool((p_adjust(p[null].to_numpy(), "holm") < NOMINAL_LEVEL).any()),
                bool(p["black"] < NOMINAL_LEVEL), bool(t["p_global"].iloc[0] < NOMINAL_LEVEL))

    return run


# ---------------------------------------------------------------- Method A: the localising test
#
# Same prompts and label mixes as _wp_data. A *shifted* group has a look of its own: its images move by
# LOOK_SHIFT along one direction v (the same in every prompt; drawn per data set). Copies: a share of the
# images of the copying groups replaced by a near copy (noise 0.02·s_p) of another image of the same prompt
# and the same label. Without a shift, ρ or copies in a group, it is exchangeable with every other group: the
# pairwise gap and tightness contrast of two such groups are exactly 0, and the near-duplicate-free gap of a
# group without ρ or shift is 0 (a copy's other pairs are its source's, whatever the label).

LOOK_SHIFT, COPY_RATE = 2.0, 0.10


def _loc_data(rng, P, m, shift=0.0, rho=0.0, copies=0.0, copy_groups=()):
    X, labels, prompts = _wp_data(rng, P, m, rho=rho, homogeneous="black" if rho > 0 else None)
    if shift:
        v = rng.normal(size=WP_D)
        X[labels == "black"] += shift * v / np.linalg.norm(v)
    s = np.linalg.norm(X - X.mean(axis=0), axis=1).mean() / np.sqrt(WP_D)
    for g in copy_groups:
        for p in range(P):
            rows = np.flatnonzero((prompts == p) & (labels == g))
            if len(rows) < 2:
                continue
            dup = rows[rng.random(len(rows)) < copies]
            for i in dup:
                src = rng.choice(rows[rows != i])
                X[i] = X[src] + 0.02 * s * rng.normal(size=WP_D)
    return X, labels, prompts


def localise_check(P: int, m: int, n_boot: int, shift=0.0, rho=0.0, copies=0.0, copy_groups=()):
    """One replication of the localising test (stats.homogeneity.localise, α = 0.05, near-duplicates at the
    stage's cosine 0.95): (white flagged, any unaffected group flagged, the affected group (black) flagged,
    white–asian pairwise gap CI covers 0, white–asian tightness contrast CI covers 0) with a shifted or
    homogeneous group; with copies: (any group flagged without copy pairs, any group flagged with them,
    black flagged without copy pairs, white's near-duplicate-free gap CI covers 0, black's covers 0)."""
    from biasaudit.stats.homogeneity import within_prompt_table

    def run(rng, rep):
        X, labels, prompts = _loc_data(rng, P, m, shift, rho, copies, copy_groups)
        pairs = {}
        t = within_prompt_table(X, prompts, {"race": labels}, categories={"race": list(GROUPS)}, n_boot=n_boot,
                                n_perm=0, seed=rep, paper=False, near_dup_cosine=0.95, pairs_out=pairs,
                                small_group=30)["race"]
        t = t.set_index("group")
        pr = pairs["race"].set_index(["group", "other"]).loc[("white", "asian")]

        def cov(lo, hi, truth=0.0):
            ok = np.isfinite(lo) and np.isfinite(hi)
            return Covered(bool(ok and lo <= truth <= hi), float(hi - lo) if ok else np.nan)

        if copies:
            return (bool(t["dedup_flagged"].any()), bool(t["flagged"].any()), bool(t.loc["black", "dedup_flagged"]),
                    cov(t.loc["white", "wp_gap_dedup_lo"], t.loc["white", "wp_gap_dedup_hi"]),
                    cov(t.loc["black", "wp_gap_dedup_lo"], t.loc["black", "wp_gap_dedup_hi"]))
        null = [g for g in GROUPS if g != "black"]
        return (bool(t.loc["white", "flagged"]), bool(t.loc[null, "flagged"].any()), bool(t.loc["black", "flagged"]),
                cov(pr["pair_gap_lo"], pr["pair_gap_hi"]), cov(pr["tight_diff_lo"], pr["tight_diff_hi"]))

    return run


IUT_NOTE = ("intersection-union test: a group is flagged only when all its 2(G − 1) comparisons reject, so a group "
            "that is not more self-similar than the others is flagged far below 0.05 (the bound is ≤ 0.05), by design")


def localise_checks(n_boot: int) -> list[Check]:
    out = []
    for scale, P in (("paper", 50), ("small", 10)):
        wp = f"{P} prompts × 100 images, labels depend on the prompt"
        for what, kw in ((f"one shifted group (black, shift {LOOK_SHIFT})", {"shift": LOOK_SHIFT}),
                         (f"one homogeneous group (black, ρ = {RARE_RHO})", {"rho": RARE_RHO})):
            out.append(Check((f"localising test: unaffected group flagged (white), {what}",
                              f"localising test: any unaffected group flagged, {what}",
                              f"localising test: power, the affected group flagged, {what}",
                              f"pairwise gap CI (white vs asian, true 0), {what}",
                              f"tightness contrast CI (white vs asian, true 0), {what}"), "rejection",
                             f"{wp}, {what}", scale, localise_check(P, 100, n_boot, **kw), IUT_NOTE))
        for what, groups in (("every group", tuple(GROUPS)), ("one group (black)", ("black",))):
            c = f"{int(COPY_RATE * 100)}% same-label near-duplicates in {what}"
            out.append(Check((f"localising test without copy pairs: any group flagged, {c}",
                              f"localising test with copy pairs: any group flagged (power to read copies as self-similarity), {c}",
                              f"localising test without copy pairs: black flagged, {c}",
                              f"near-duplicate-free gap CI (white, true 0), {c}",
                              f"near-duplicate-free gap CI (black, true 0), {c}"), "rejection",
                             f"{wp}, {c}", scale,
                             localise_check(P, 100, n_boot, copies=COPY_RATE, copy_groups=groups), IUT_NOTE))
    return out


# ---------------------------------------------------------------- Method A: skin

LAB0, PROMPT_SD, IMAGE_SD = np.array([55.0, 12.0, 18.0]), np.array([8.0, 2.0, 3.0]), np.array([6.0, 2.0, 3.0])


def _skin(rng, P, m):
    prompts = np.repeat(np.arange(P), m)
    lab = LAB0 + rng.normal(size=(P, 3))[prompts] * PROMPT_SD + rng.normal(size=(P * m, 3)) * IMAGE_SD
    return pd.DataFrame({"model": "m", "label": "black", "prompt_id": prompts, "L": lab[:, 0], "a": lab[:, 1],
                         "b": lab[:, 2], "C": np.hypot(lab[:, 1], lab[:, 2]), "h": 0.0})


def _diversity_truth(P, m, pairs=1_000_000):
    """E[mean pairwise ΔE2000] at this design: (1 − f)·D_between + f·D_within, f the share of pairs
    from the same prompt, each D from a large Monte Carlo of the population."""
    key = ("div", P, m)
    if key not in _TRUTH:
        from biasaudit.faces.colour import delta_e2000

        rng = np.random.default_rng(999)
        shared = rng.normal(size=(pairs, 3)) * PROMPT_SD
        a = LAB0 + shared + rng.normal(size=(pairs, 3)) * IMAGE_SD
        b_same = LAB0 + shared + rng.normal(size=(pairs, 3)) * IMAGE_SD
        b_other = LAB0 + rng.normal(size=(pairs, 3)) * PROMPT_SD + rng.normal(size=(pairs, 3)) * IMAGE_SD
        d_within, d_between = delta_e2000(a, b_same).mean(), delta_e2000(a, b_other).mean()
        N = P * m
        f = P * m * (m - 1) / (N * (N - 1))
        _TRUTH[key] = float((1 - f) * d_between + f * d_within)
    return _TRUTH[key]


def skin_check(which: str, P: int, m: int, n_boot: int):
    from biasaudit.stats.skin_summary import skin_summary

    def run(rng, rep):
        out = skin_summary(_skin(rng, P, m), by=["model", "label"], n_boot=n_boot, seed=rep).iloc[0]
        if which == "L_mean":
            return out["L_mean_lo"] <= LAB0[0] <= out["L_mean_hi"]
        truth = _diversity_truth(P, m)
        return out["diversity_de2000_lo"] <= truth <= out["diversity_de2000_hi"]

    return run


# ---------------------------------------------------------------- Method B (the planted VLM)

OCCUPATIONS = ("cook", "doctor", "lawyer", "nurse", "teacher", "ceo")


def _units(G: int) -> pd.DataFrame:
    return pd.DataFrame({"unit": [f"u{i:02d}" for i in range(G)], "occupation": [OCCUPATIONS[i % 6] for i in range(G)]})


def _planted(null: bool = False, photo_effects: bool = True):
    """The planted VLM's declared effects (defaults), or a true null: no group effect in any task."""
    from biasaudit.params.vlm import PlantedReflect

    pl = PlantedReflect()
    if null:
        pl = pl.model_copy(update={
            "salary": pl.salary.model_copy(update={"effect": {}}),
            "mcq": pl.mcq.model_copy(update={"shift": {t: {} for t in pl.mcq.shift}}),
            "two_afc": pl.two_afc.model_copy(update={"strengths": {t: {} for t in pl.two_afc.strengths}})})
    # answer-independent refusal only (the rows below written before the selective refusal existed)
    pl = pl.model_copy(update={"selective_refusal": pl.selective_refusal.model_copy(update={"two_afc": 0.0,
                                                                                             "low_answer": 0.0})})
    if not photo_effects:
        pl = pl.model_copy(update={"salary": pl.salary.model_copy(update={"photo_sd": 0.0}),
                                   "mcq": pl.mcq.model_copy(update={"photo_sd": 0.0}),
                                   "two_afc": pl.two_afc.model_copy(update={"photo_sd": 0.0})})
    return pl


def _analysis(n_boot: int = 999, n_perm: int = 999):
    from biasaudit.params.vlm import ReflectAnalysis

    return ReflectAnalysis(n_boot=n_boot, n_permutations=n_perm)


def reflect_interval_check(G: int, n_boot: int):
    """One replication: does each interval cover its planted value (vlm.planted.estimands)?"""
    from types import SimpleNamespace

    from biasaudit.vlm import planted as P
    from biasaudit.vlm.analysis import gaps, two_afc
    from biasaudit.vlm.analysis.inputs import Boot, retained, with_values

    pl, params, units = _planted(), _analysis(n_boot), _units(G)
    truth = P.estimands(pl, units, params, two_afc_tasks=("income",))
    settings = Boot.of(SimpleNamespace(reflect_analysis=params))
    boot = settings.resampling
    win = truth["two_afc"]["income"]["winrate"].set_index(["row", "col"])["planted"]
    race = truth["two_afc"]["income"]["race_winrate"].set_index(["gender", "race"])["planted"]
    bt = truth["two_afc"]["income"]["bradley_terry"].set_index("term")["planted"]
    dg = {m: truth["single"][m]["delta_g"].set_index(["dimension", "level"])["planted"] for m in truth["single"]}

    def run(rng, rep):
        df = P.simulate_responses(pl, units, rng, WITH_INCOME)
        two = retained(df, "2afc", "income")
        w = two_afc.win_rate_table(two, boot | {"seed": rep}).set_index(["row", "col"]).loc[("WM", "BF")]
        r = two_afc.race_win_rates_within_gender(two, boot | {"seed": rep}).set_index(["gender", "race"]).loc[
            ("man", "Black")]
        b, _ = two_afc.bradley_terry(two, params.bt_reference, params.confidence)
        b = b.set_index("term").loc["BM"] if b is not None else {"ci_low": np.nan, "ci_high": np.nan}
        out = [w["low"] <= win[("WM", "BF")] <= w["high"], r["low"] <= race[("man", "Black")] <= r["high"],
               b["ci_low"] <= bt["BM"] <= b["ci_high"]]
        for kind, task, values in (("salary", "salary", None), ("mcq", "salary", P.letter_values()["mcq_salary"])):
            sub = with_values(retained(df, kind, task), values)
            d = gaps.delta_g_within(sub, "race", "Black", params.race_reference,
                                    replace(settings, n_permutations=99, seed=rep))
            out.append(d["low"] <= dg[f"{kind}_{task}"][("race", "Black")] <= d["high"])
        return tuple(bool(x) for x in out)

    return run


REFLECT_INTERVALS = ("REFLECT win-rate CI (income, WM vs BF)", "REFLECT race win rate CI (income, Black men)",
                     "REFLECT Bradley–Terry CI (income, BM vs WF)", "REFLECT Δg within photo CI (salary, Black)",
                     "REFLECT Δg within photo CI (MCQ salary, Black)")


PAIR_PULL = {"position_same_gender": 1.5, "position_cross_gender": 0.0}  # the independent simulation's case


def _pair_pull(pl):
    """The planted VLM with the position pull differing by pair (log-odds 1.5 same gender, 0 across)."""
    return pl.model_copy(update={"two_afc": pl.two_afc.model_copy(update=PAIR_PULL)})


POSITION_TESTS = tuple(f"REFLECT Bradley–Terry test, {est} ({term} vs WF), pair-varying position pull"
                       for est in ("symmetric", "pooled") for term in ("BF", "BM"))
POSITION_INTERVALS = ("REFLECT win-rate CI, symmetric (all 45 cells), pair-varying position pull",
                      "REFLECT win-rate CI, pooled (all 45 cells), pair-varying position pull",
                      "REFLECT race win rate CI, symmetric (all 10), pair-varying position pull")


def reflect_position_check(G: int, which: str, n_boot: int):
    """One replication under no group effect and a position pull that differs by pair (PAIR_PULL): whether
    each Bradley–Terry test rejects (`tests`), or the share of win-rate intervals covering 0.5 (`intervals`)."""
    from biasaudit.vlm import planted as P
    from biasaudit.vlm.analysis import two_afc
    from biasaudit.vlm.analysis.inputs import Boot, retained

    pl, units, params = _pair_pull(_planted(null=True)), _units(G), _analysis(n_boot)
    boot = Boot.of(SimpleNamespace(reflect_analysis=params)).resampling

    def run(rng, rep):
        two = retained(P.simulate_responses(pl, units, rng, Reflect(tasks=["2afc_income"])),
                       "2afc", "income")
        if which == "tests":
            out = []
            for est in ("symmetric", "pooled"):
                b, _ = two_afc.BT_FITS[est](two, params.bt_reference, params.confidence)
                out += [bool(b is not None and b.set_index("term").loc[t, "p"] < NOMINAL_LEVEL) for t in ("BF", "BM")]
            return tuple(out)
        out = []
        for est in ("symmetric", "pooled"):
            w = two_afc.win_rate_table(two, boot | {"seed": rep}, estimator=est)
            w = w[w["row"] < w["col"]]
            out.append(Covered(float(((w["low"] <= 0.5) & (0.5 <= w["high"])).mean()), float((w["high"] - w["low"]).mean())))
        r = two_afc.race_win_rates_within_gender(two, boot | {"seed": rep}, "symmetric")
        out.append(Covered(float(((r["low"] <= 0.5) & (0.5 <= r["high"])).mean()), float((r["high"] - r["low"]).mean())))
        return tuple(out)

    return run


def _interaction(df, params, boot):
    from biasaudit.vlm.analysis import interaction
    from biasaudit.vlm.analysis.inputs import Answers

    values = interaction.image_values(Answers("sim", df), SimpleNamespace(reflect_analysis=params))
    return interaction.interaction_table(values, params.race_reference, boot).query("race == 'Black'")


def _interaction_truth(pl, params, settings, photos: int = 1500):
    """The interaction estimates of Black at the population: one draw of `photos` source photos (a large
    Monte Carlo of the probability limit; no interval computed)."""
    key = ("interaction", repr(pl))
    if key not in _TRUTH:
        df = P_simulate(pl, _units(photos), np.random.default_rng(777))
        t = _interaction(df, params, replace(settings, min_clusters=10 ** 9))
        _TRUTH[key] = t[t["kind"] == "difference"].set_index(["task", "task_b"])["estimate"]
    return _TRUTH[key]


def P_simulate(pl, units, rng):
    from biasaudit.vlm import planted as P

    return P.simulate_responses(pl, units, rng)


def interaction_names(null: bool) -> tuple[str, ...]:
    what = "null: no group effect in any task" if null else "planted effects"
    return (f"REFLECT task × group joint test (Black, {what if null else 'power at the planted effects'})",
            f"REFLECT task × group difference CIs (Black, 15 task pairs, {what})")


def reflect_interaction_check(G: int, null: bool, n_boot: int, n_perm: int):
    """One replication: does the joint test of equal standardised effects of Black across the 6 tasks reject,
    and the share of the 15 pairwise-difference intervals covering the truth (0 under the null; under the
    planted effects the population value, by a large Monte Carlo)? Null: no group effect in any task, with
    the pair-varying position pull."""
    from biasaudit.vlm.analysis.inputs import Boot

    pl, units, params = _pair_pull(_planted(null=null)), _units(G), _analysis(n_boot, n_perm)
    # the intervals and the test themselves: the section blanks them below min_clusters complete photos (at 12
    # photos, lost edits leave fewer in most replications), a reporting rule measured nowhere else
    settings = replace(Boot.of(SimpleNamespace(reflect_analysis=params)), min_clusters=2)

    def run(rng, rep):
        truth = None if null else _interaction_truth(pl, params, settings)
        t = _interaction(P_simulate(pl, units, rng), params, replace(settings, seed=rep))
        d = t[t["kind"] == "difference"].set_index(["task", "task_b"])
        target = 0.0 if truth is None else truth.reindex(d.index).to_numpy()
        hit = (d["low"] <= target) & (target <= d["high"])
        joint = t.loc[t["kind"] == "joint", "p"].iloc[0]
        return bool(joint < NOMINAL_LEVEL), Covered(float(hit.mean()), float((d["high"] - d["low"]).mean()))

    return run


def reflect_test_check(G: int, null: bool, photo_effects: bool, n_wild: int, n_perm: int):
    """One replication: do the OLS t(G−1), OLS wild and sign-flip tests of race:Black (salary) reject?"""
    from biasaudit.vlm import planted as P
    from biasaudit.vlm.analysis.inference import sign_flip
    from biasaudit.vlm.analysis.inputs import retained, with_values
    from biasaudit.vlm.analysis.significance import ols_by_group, paired_differences

    pl, units, params = _planted(null, photo_effects), _units(G), _analysis()

    def run(rng, rep):
        df = P.simulate_responses(pl, units, rng, Reflect(tasks=["salary_salary"]))
        sub = with_values(retained(df, "salary", "salary"), None)
        table, _ = ols_by_group(sub, params.race_reference, params.gender_reference, params.confidence, n_wild,
                                params.wild_weights, rep)
        row = table.set_index("term").loc["race:Black"]
        p_flip = sign_flip(paired_differences(sub, "race", "Black", params.race_reference).to_numpy(), n_perm, rep)[1]
        return (bool(row["p_t"] < NOMINAL_LEVEL), bool(row["p_wild"] < NOMINAL_LEVEL), bool(p_flip < NOMINAL_LEVEL))

    return run


# Selective refusal (issue #38), written from the definitions: the planted VLM with no base refusal refuses a
# comparison with extra probability 0.3 when it would pick a Black face, and a single-image question about a
# Black face with extra probability 0.3 when its answer would be low (an MCQ letter below the median letter,
# a salary below the occupation's base). Its would-have-answered values are the estimands of the same VLM
# without refusals (vlm.planted.would_answer); under the null (no group effect) they are 0.5 and 0.
SELECTIVE = {"two_afc": 0.3, "low_answer": 0.3}


def _selective(null: bool):
    pl = _planted(null)
    return pl.model_copy(update={"refusal": {}, "selective_refusal": pl.selective_refusal.model_copy(update=SELECTIVE)})


def _bounds_of(df, settings, rep):
    """(race win rate bounds of Black men, income; Δg bounds of Black in salary and MCQ salary) rows."""
    from types import SimpleNamespace

    from biasaudit.vlm.analysis import refusals

    s = replace(settings, seed=rep)
    rw = refusals.race_win_rate_bounds(df[(df["kind"] == "2afc")], s).set_index(["gender", "race"]).loc[("man", "Black")]
    dg = refusals.delta_g_bounds(df, SimpleNamespace(reflect_analysis=_analysis(s.n_boot).model_copy(
        update={"seed": rep}))).set_index(["measure", "dimension", "level"])
    return rw, dg.loc[("salary_salary", "race", "Black")], dg.loc[("mcq_salary", "race", "Black")]


def selective_null_check(G: int, n_boot: int, n_perm: int):
    """One replication under the selective-refusal null: do the complete-case tests reject, do the bounds'
    CIs hold the no-effect value?"""
    from types import SimpleNamespace

    from biasaudit.vlm import planted as P
    from biasaudit.vlm.analysis.endpoints import race_winrate_test
    from biasaudit.vlm.analysis.inference import sign_flip
    from biasaudit.vlm.analysis.inputs import Boot, retained, with_values
    from biasaudit.vlm.analysis.significance import ols_by_group, paired_differences

    pl, units, params = _selective(True), _units(G), _analysis(n_boot, n_perm)
    settings = Boot.of(SimpleNamespace(reflect_analysis=params))

    def run(rng, rep):
        df = P.simulate_responses(pl, units, rng, Reflect(tasks=["2afc_income", "mcq_salary", "salary_salary"]))
        p_win = race_winrate_test(retained(df, "2afc", "income"), "man", "Black", replace(settings, seed=rep))[1]
        sal = with_values(retained(df, "salary", "salary"), None)
        p_flip = sign_flip(paired_differences(sal, "race", "Black", "White").to_numpy(), n_perm, rep)[1]
        ols, _ = ols_by_group(sal, "White", "woman", params.confidence, 0, params.wild_weights, rep)
        rw, dg_sal, dg_mcq = _bounds_of(df, settings, rep)
        return (bool(p_win < NOMINAL_LEVEL), bool(p_flip < NOMINAL_LEVEL),
                bool(ols.set_index("term").loc["race:Black", "p_t"] < NOMINAL_LEVEL),
                Covered(bool(rw["low"] <= 0.5 <= rw["high"]), rw["high"] - rw["low"]),
                Covered(bool(dg_sal["low"] <= 0 <= dg_sal["high"]), dg_sal["high"] - dg_sal["low"]),
                Covered(bool(dg_mcq["low"] <= 0 <= dg_mcq["high"]), dg_mcq["high"] - dg_mcq["low"]))

    return run


SELECTIVE_NULL = ("REFLECT complete-case race win rate sign-flip test (income, Black men), selective-refusal null",
                  "REFLECT complete-case Δg sign-flip test (salary, Black), selective-refusal null",
                  "REFLECT complete-case OLS p_t (salary, race:Black), selective-refusal null",
                  "REFLECT refusal bounds CI contains 0.5 (race win rate, income, Black men), selective-refusal null",
                  "REFLECT refusal bounds CI contains 0 (Δg salary, Black), selective-refusal null",
                  "REFLECT refusal bounds CI contains 0 (Δg MCQ salary, Black), selective-refusal null")
SELECTIVE_NOTE = ("complete-case rows: a null that selective refusal breaks, rejecting above 0.07 documents the "
                  "problem; bounds rows: worst-case bounds cover by design at least 0.95, above the band expected")


def selective_bounds_check(G: int, n_boot: int):
    """One replication with the planted effects and selective refusal: do the bounds' CIs hold the
    would-have-answered values?"""
    from types import SimpleNamespace

    from biasaudit.vlm import planted as P
    from biasaudit.vlm.analysis.inputs import Boot

    pl, units, params = _selective(False), _units(G), _analysis(n_boot)
    settings = Boot.of(SimpleNamespace(reflect_analysis=params))
    truth = P.estimands(P.would_answer(pl), units, params, two_afc_tasks=("income",))
    win = truth["two_afc"]["income"]["race_winrate"].set_index(["gender", "race"]).loc[("man", "Black"), "planted"]
    dg = {m: truth["single"][m]["delta_g"].set_index(["dimension", "level"]).loc[("race", "Black"), "planted"]
          for m in ("salary_salary", "mcq_salary")}

    def run(rng, rep):
        df = P.simulate_responses(pl, units, rng, Reflect(tasks=["2afc_income", "mcq_salary", "salary_salary"]))
        rw, dg_sal, dg_mcq = _bounds_of(df, settings, rep)
        return tuple(Covered(bool(r["low"] <= t <= r["high"]), r["high"] - r["low"])
                     for r, t in ((rw, win), (dg_sal, dg["salary_salary"]), (dg_mcq, dg["mcq_salary"])))

    return run


SELECTIVE_BOUNDS = tuple(f"REFLECT refusal bounds CI, would-have-answered value ({w}), planted effects + selective "
                         "refusal" for w in ("race win rate, income, Black men", "Δg salary, Black",
                                             "Δg MCQ salary, Black"))


def primary_family_check(G: int, n_boot: int, n_perm: int):
    """One replication under the full null (no group effect, no selective refusal): does Holm over the
    default primary endpoints reject any?"""
    from types import SimpleNamespace

    from biasaudit.vlm import planted as P
    from biasaudit.vlm.analysis import endpoints, gaps
    from biasaudit.vlm.analysis.inputs import Boot, retained, with_values

    pl, units, params = _planted(True), _units(G), _analysis(n_boot, n_perm)
    settings = Boot.of(SimpleNamespace(reflect_analysis=params))
    scales = {m: v for m, v in P.letter_values().items() if m in ("mcq_salary", "mcq_education", "salary_salary")}

    def run(rng, rep):
        df = P.simulate_responses(pl, units, rng, WITH_INCOME)
        s = replace(settings, seed=rep, n_boot=200)
        p = [gaps.delta_g_within(with_values(retained(df, *m.split("_")), v), "race", "Black", "White", s)["p_value"]
             for m, v in scales.items()]
        p += [endpoints.race_winrate_test(retained(df, "2afc", "income"), g, "Black", s)[1] for g in ("man", "woman")]
        return bool(endpoints.holm(pd.DataFrame({"p": p}), NOMINAL_LEVEL)["reject"].any())

    return run


PRIMARY_FAMILY = "REFLECT family-wise error, Holm over the 5 default primary endpoints (full null)"


# ---------------------------------------------------------------- Method B: impact ratios (audit card)
#
# Written from the definitions, not from the card's code. Source photo u and category c have a true rate
# π_uc = logistic(a_c + σ·z_u + τ_c·z_uc) (z ~ N(0, 1)): a photo effect shared by the categories (σ) and, in the
# second DGP, a photo effect of each category with a group-specific sd τ_c instead (the categories then vary
# unequally and independently across photos, which no pooled-rate or shared-effect model assumes). Each photo
# and category has 1 + Poisson(7) comparisons (independent of π), won ~ Binomial(n, π). The card's rate pools
# photos, so its estimand is μ_c = E[π_uc]; a_c is solved so that μ_c is exactly the declared rate (Gauss–Hermite),
# and the true impact ratio is μ_c / max_k μ_k. A group is "no-disparity" when its true ratio is ≥ 0.8.

IMPACT_SCENARIOS = {  # name: (true rates of the 5 categories, the rows' roles: (label, categories))
    "equal rates": ((0.5,) * 5, (("equal rates, ratio 1", (0, 1, 2, 3, 4)),)),
    "one group at 0.7": ((0.5, 0.5, 0.5, 0.5, 0.35), (("group at 0.7", (4,)), ("groups at ratio 1 beside one at 0.7", (0, 1, 2, 3)))),
    "a clear top group": ((0.6, 0.5, 0.5, 0.5, 0.5), (("clear top group, ratio 1", (0,)),
                                                      ("groups at 0.83 below a clear top", (1, 2, 3, 4)))),
}
IMPACT_DGPS = {"shared photo effect (logit sd 0.5)": (0.5, (0.0,) * 5),
               "group-specific photo effects (logit sd 0.2–1.0)": (0.0, (0.2, 0.4, 0.6, 0.8, 1.0))}
IMPACT_COMPARISONS = 8  # mean comparisons per photo and category (1 + Poisson(7))


def _intercept(mu: float, sd: float) -> float:
    key = ("impact", mu, sd)
    if key not in _TRUTH:
        from scipy import optimize

        x, w = np.polynomial.hermite_e.hermegauss(80)
        _TRUTH[key] = optimize.brentq(lambda a: float(w @ (1 / (1 + np.exp(-(a + sd * x)))) / w.sum()) - mu, -30, 30)
    return _TRUTH[key]


def impact_names(scenario: str) -> tuple[str, ...]:
    """Per role: its interval's coverage, then (except for a top group) its share read "below 0.8"."""
    out = []
    for label, _ in IMPACT_SCENARIOS[scenario][1]:
        out.append(f"impact ratio CI ({label})")
        if label == "group at 0.7":
            out.append(f"impact ratio read below 0.8, power ({label})")
        elif "top group" not in label:
            out.append(f"impact ratio read below 0.8 ({label}, no-disparity)")
    return tuple(out)


def impact_ratio_check(P: int, scenario: str, dgp: str, n_boot: int):
    """One replication of the card's impact_table on the DGP above: per role, (share of its categories whose
    interval covers the true ratio, with the intervals' mean width), and the share read "below 0.8" (false
    marks for no-disparity groups, power for the group at 0.7)."""
    from biasaudit.report.audit_card import Resampling, impact_table

    mus, roles = IMPACT_SCENARIOS[scenario]
    shared, tau = IMPACT_DGPS[dgp]
    mus, tau = np.asarray(mus), np.asarray(tau)
    truth = mus / mus.max()
    cats = [f"g{j}" for j in range(len(mus))]

    def run(rng, rep):
        a = np.array([_intercept(mu, float(np.hypot(shared, t))) for mu, t in zip(mus, tau)])
        eta = a + shared * rng.normal(size=(P, 1)) + tau * rng.normal(size=(P, len(mus)))
        n = 1 + rng.poisson(IMPACT_COMPARISONS - 1, size=(P, len(mus)))
        won = rng.binomial(n, 1 / (1 + np.exp(-eta)))
        t = impact_table(cats, won.astype(float), n.astype(float), Resampling(n_boot, 0.95, "percentile", rep))
        lo, hi, below = (t[c].to_numpy() for c in ("ratio_low", "ratio_high", "below_four_fifths"))
        out = []
        for label, idx in roles:
            idx = list(idx)
            hit = (lo[idx] <= truth[idx] + 1e-12) & (truth[idx] <= hi[idx] + 1e-12)
            out.append(Covered(float(hit.mean()), float(np.mean(hi[idx] - lo[idx]))))
            if "top group" not in label:
                out.append(float(below[idx].astype(bool).mean()))
        return tuple(out)

    return run


def reflect_tests(what: str) -> tuple[str, ...]:
    return (f"REFLECT OLS p_t, t(G−1) ({what})", f"REFLECT OLS p_wild, Webb wild cluster bootstrap ({what})",
            f"REFLECT sign-flip test ({what})")


# ---------------------------------------------------------------- the suite

def checks(n_boot: int, n_perm: int) -> list[Check]:
    out = []
    for scale, P in (("paper", 50), ("small", 10)):
        s = f"{P} prompts × 100 images"
        out += [Check("mean_tvd CI (E[observed TVD])", "coverage", s, scale, tvd_check("mean_tvd", P, 100, 0.5, n_boot)),
                Check("tvd_bias_corrected CI (true TVD)", "coverage", s, scale,
                      tvd_check("corrected", P, 100, 0.5, n_boot)),
                Check("mean_deviation CI (black)", "coverage", s, scale, tvd_check("deviation", P, 100, 0.5, n_boot)),
                Check("tvd_paired CI (difference)", "coverage", s, scale, paired_check("ci", P, 100, n_boot)),
                Check("tvd_paired test (identical models)", "rejection", s, scale, paired_check("test", P, 100, n_boot)),
                Check("homogeneity gap CI (largest group, true gap 0)", "coverage", s, scale,
                      gap_check(P, 100, "white", n_boot)),
                Check("homogeneity gap CI (smallest group, true gap 0)", "coverage", s, scale,
                      gap_check(P, 100, "other", n_boot)),
                Check(("homogeneity permutation test, within prompts (prompt-confounded null)",
                       "homogeneity permutation, within prompts, Holm family-wise (5 groups)"), "rejection", s, scale,
                      permutation_check(P, 100, "within", n_perm, family=True),
                      "Holm bounds the family-wise error by 0.05; below it is by design (correlated group tests)"),
                Check("skin L_mean CI", "coverage", f"{P} prompts × 10 faces", scale, skin_check("L_mean", P, 10, n_boot)),
                Check("skin diversity ΔE2000 CI", "coverage", f"{P} prompts × 10 faces", scale,
                      skin_check("diversity", P, 10, n_boot))]
        wp = f"{P} prompts × 100 images, labels depend on the prompt"
        out += [Check("within-prompt gap CI (homogeneous group, population estimand)", "coverage", wp, scale,
                      wp_gap_check(P, 100, "black", n_boot)),
                Check("within-prompt gap CI (null group, population estimand)", "coverage", wp, scale,
                      wp_gap_check(P, 100, "white", n_boot)),
                Check("paper (unstratified) gap CI (homogeneous group, within-prompt estimand)", "coverage", wp, scale,
                      wp_gap_check(P, 100, "black", n_boot, paper=True),
                      "known: the paper's gap also counts pairs across prompts (a different estimand): "
                      "the within-prompt gap is the headline"),
                *[Check(f"within-prompt gap CI (rare {what} group in few prompts, population estimand)", "coverage",
                        f"{P} prompts × 100 images, labels depend on the prompt, Dirichlet(2·BASE) mixes: other ≈ 5%"
                        + (f", ρ = {rho}" if rho else ""), scale,
                        wp_gap_check(P, 100, "other", n_boot, homogeneous="other", rho=rho, mix="rare"),
                        f"few prompts: the group has pairs in fewer than {MIN_PROMPTS_CI} prompts of many data sets "
                        "(no interval, or one flagged few_prompts in the table)")
                  for what, rho in (("homogeneous", RARE_RHO), ("null", 0.0))],
                Check(("within-prompt test, null group beside a homogeneous one (white)",
                       "within-prompt tests, Holm family-wise over the 4 null groups beside a homogeneous one",
                       "within-prompt test, power for the homogeneous group (ρ = 0.05)",
                       "within-prompt global test, power (one homogeneous group)"), "rejection",
                      wp + ", one homogeneous group", scale, wp_test_check(P, 100, n_perm, WP_RHO),
                      "Holm bounds the family-wise error by 0.05; below it is by design (correlated group tests)"),
                *[Check((f"within-prompt test, null group beside a strongly homogeneous one (white), ρ = {rho}",
                         f"within-prompt tests, Holm family-wise over the 4 null groups beside a strongly homogeneous "
                         f"one, ρ = {rho}",
                         f"within-prompt test, power for the homogeneous group (ρ = {rho})",
                         f"within-prompt global test, power (one homogeneous group, ρ = {rho})"), "rejection",
                        wp + f", one strongly homogeneous group (ρ = {rho})", scale,
                        wp_test_check(P, 100, n_perm, rho),
                        "Holm bounds the family-wise error by 0.05; below it is by design (correlated group tests)")
                  for rho in STRONG_RHO],
                Check(("within-prompt test, null group beside a homogeneous one (white), 10% near-duplicates",
                       "within-prompt tests, Holm family-wise over the 4 null groups beside a homogeneous one, "
                       "10% near-duplicates",
                       "within-prompt test, power for the homogeneous group (ρ = 0.05), 10% near-duplicates",
                       "within-prompt global test, power (one homogeneous group), 10% near-duplicates"), "rejection",
                      wp + ", one homogeneous group, 10% near-duplicates", scale,
                      wp_test_check(P, 100, n_perm, WP_RHO, near_dup=0.10),
                      "Holm bounds the family-wise error by 0.05; below it is by design (correlated group tests)"),
                Check(("within-prompt test, null (white), 10% near-duplicates",
                       "within-prompt tests, Holm family-wise (5 groups), 10% near-duplicates",
                       "within-prompt test (black), null, 10% near-duplicates",
                       "within-prompt global test, null, 10% near-duplicates"), "rejection",
                      wp + ", no label effect, 10% near-duplicates", scale,
                      wp_test_check(P, 100, n_perm, 0.0, near_dup=0.10),
                      "Holm bounds the family-wise error by 0.05; below it is by design (correlated group tests)")]
        out.append(Check("tvd_bias_corrected CI (model = benchmark)", "coverage", s, scale,
                         tvd_check("corrected", P, 100, 0.0, n_boot),
                         "known limitation: at the benchmark the bias correction is partial; read with the null floor"))
        out.append(Check("homogeneity permutation test, across prompts (prompt-confounded null)", "rejection", s, scale,
                         permutation_check(P, 100, "across", n_perm),
                         "different null: across-prompt design also rejects prompt effects (documented option)"))
    out += localise_checks(n_boot)
    honest = "honest (bias-aware) interval: it covers at least 95% by design, so above the band is expected"
    for scale, P, n in (("paper", 50, 100), ("small", 10, 100), ("small", 5, 12)):
        for strength, what in ((0.5, "biased model"), (0.0, "model = benchmark")):
            for reference in (("consensus", "every_label") if n == 12 else ("consensus",)):
                out.append(Check((f"debiased_tvd honest interval (true TVD, {what}, M vs {reference} labels)",
                                  f"debiased_tvd estimate closer to the true TVD than raw ({what}, M vs {reference} labels)"),
                                 "coverage", f"{P} prompts × {n} images, 300 annotated", scale,
                                 debiased_check(P, n, strength, reference, n_boot), honest))
    grid = f"random grid of {GRID_POINTS}"
    for scale, P, n, where in (("paper", 50, 100, ""), ("small", 15, 12, ", the demo's all-prompts row"),
                               ("small", 5, 12, ", the demo's per-category rows")):
        out.append(Check((f"debiased_tvd honest interval (true TVD, {grid}, M vs consensus labels)",
                          f"debiased_tvd estimate closer to the true TVD than raw ({grid}, M vs consensus labels)"),
                         "coverage", f"{P} prompts × {n} images, 300 annotated{where}", scale,
                         grid_check(P, n, None, n_boot), honest))
    for declared, how in ((False, "M vs consensus labels"), (True, "M declared")):
        out.append(Check((f"debiased_tvd honest interval (true TVD, {FAILING_CASE['name']}, {how})",
                          f"debiased_tvd estimate closer to the true TVD than raw ({FAILING_CASE['name']}, {how})"),
                         "coverage", "50 prompts × 100 images" + ("" if declared else ", 300 annotated"), "paper",
                         grid_check(50, 100, [failing_case()], n_boot, declared), honest))
    for scale, P, n in (("paper", 50, 100), ("small", 15, 12), ("small", 5, 12)):
        out.append(Check(failing_point_names(P), ("coverage", "share", "share", "coverage", "power", "power"),
                         f"{P} prompts × {n} images, 300 annotated", scale, failing_point_check(P, n, n_boot),
                         honest + "; the lower bound is one-sided and allows for the mean over prompts ≥ the TVD of "
                         "the mean deviation, so above the band is expected too"))
        out.append(Check(("tvd_above_floor_p test (model = benchmark, M vs consensus labels)",
                          "tvd_lower_bound > 0 (model = benchmark, M vs consensus labels)"), "rejection",
                         f"{P} prompts × {n} images, 300 annotated", scale, floor_null_check(P, n, n_boot),
                         "a false-positive rate at most 0.05 is the aim: below it is conservative by design"))
    for n in (30, 200):
        out.append(Check(SKEWED, "coverage", f"n = {n} i.i.d. values", "small" if n < 50 else "paper",
                         skewed_mean_check(n, n_boot),
                         "n < 50, skewed: under-covers (the bootstrap's limit for a skewed mean at this n)" if n < 50
                         else "skewed, heavy-tailed: under-covers still at n = 200 (the bootstrap's limit for a "
                              "log-normal mean; the audit's own statistics are bounded shares and similarities)"))
    for scale, G in (("paper", 48), ("small", 12), ("small", 6)):
        s = f"{G} source photos × 10 groups, planted VLM"
        out.append(Check(REFLECT_INTERVALS, "coverage", s, scale, reflect_interval_check(G, n_boot)))
        for photo_effects in (True, False):
            what = "true null, " + ("photo random effects" if photo_effects else "no photo random effects")
            out.append(Check(reflect_tests(what), "rejection", s, scale,
                             reflect_test_check(G, True, photo_effects, 399, n_perm)))
        out.append(Check(reflect_tests("power at the planted effects: salary −5 % / −8 %"), "power", s, scale,
                         reflect_test_check(G, False, True, 399, n_perm)))
        if G >= 12:
            out.append(Check(POSITION_TESTS, "rejection", s + ", no group effect", scale,
                             reflect_position_check(G, "tests", n_boot),
                             "pooled: one position term cannot absorb a pull that differs by pair (documents the "
                             "problem); symmetric: each pair's two orders averaged"))
            out.append(Check(POSITION_INTERVALS, "coverage", s + ", no group effect", scale,
                             reflect_position_check(G, "intervals", n_boot)))
            out.append(Check(interaction_names(True), ("rejection", "coverage"), s, scale,
                             reflect_interaction_check(G, True, n_boot, n_perm)))
            out.append(Check(interaction_names(False), "coverage", s, scale,
                             reflect_interaction_check(G, False, n_boot, n_perm)))
    for scale, G in (("paper", 48), ("small", 12)):
        s = f"{G} source photos × 10 groups, planted VLM"
        out += [Check(SELECTIVE_NULL, "rejection", s + ", no group effect, selective refusal of Black faces (0.3)",
                      scale, selective_null_check(G, n_boot, n_perm), SELECTIVE_NOTE),
                Check(SELECTIVE_BOUNDS, "coverage", s + ", selective refusal of Black faces (0.3)", scale,
                      selective_bounds_check(G, n_boot), SELECTIVE_NOTE),
                Check(PRIMARY_FAMILY, "rejection", s + ", true null", scale, primary_family_check(G, n_boot, n_perm),
                      "Holm bounds the family-wise error by 0.05; below it is by design (correlated group tests)")]
    for P, scale in ((48, "paper"), (12, "small")):
        for scenario in IMPACT_SCENARIOS:
            for dgp in IMPACT_DGPS:
                out.append(Check(impact_names(scenario), "coverage",
                                 f"{P} source photos × 5 categories, {scenario}, {dgp}", scale,
                                 impact_ratio_check(P, scenario, dgp, n_boot), IMPACT_NOTE))
    return out


IMPACT_NOTE = ("ratio 1 is the upper edge of every impact ratio: only the interval's upper end can miss it, so "
               "a group tied for the top is covered with probability about 1 − α' (0.975) and a clear top group "
               "almost always (its interval ends at 1), by design")

FAST = ("mean_tvd CI (E[observed TVD])", "tvd_bias_corrected CI (true TVD)",
        "homogeneity gap CI (smallest group, true gap 0)",
        "homogeneity permutation test, within prompts (prompt-confounded null)",
        "REFLECT OLS p_t, t(G−1) (true null, photo random effects)", "REFLECT Δg within photo CI (salary, Black)",
        "within-prompt gap CI (homogeneous group, population estimand)",
        "within-prompt test, null group beside a homogeneous one (white)",
        "within-prompt test, null group beside a strongly homogeneous one (white), ρ = 0.6",
        "impact ratio CI (group at 0.7)")


def flag(row: dict, note: str) -> str:
    if "share of audits" in row.get("method", ""):
        return "measured (the declared rule reads raw in this share of audits)"
    if "closer" in row.get("method", ""):  # a share of replications, not an interval: no nominal value
        return ("measured: beats raw (closer in ≥ 60% of replications)" if row["observed"] >= BEATS_RAW
                else "measured: does not beat raw (closer in < 60%)")
    if row["kind"] == "power":
        if "impact ratio" in row.get("method", ""):
            return "measured (power: the share of the group's intervals wholly under 0.8)"
        return "measured (power: the share of replications that reject a planted effect)"
    if row["kind"] == "false mark":
        return ("ok (at most 0.05)" if row["observed"] <= NOMINAL_LEVEL
                else f"reads no-disparity groups below 0.8 too often (over 0.05){' (small scale)' * (row['scale'] == 'small')}")
    lo, hi = COVERAGE_BAND if row["kind"] == "coverage" else REJECTION_BAND
    inside = lo <= row["observed"] <= hi
    if note.startswith("Holm"):  # applies to the family-wise row only
        note = note if "Holm" in row.get("method", "") else ""
    if note.startswith("pooled:"):  # documents the pooled estimator's rows only
        note = note if "pooled" in row.get("method", "") else ""
    if note.startswith("intersection-union"):  # applies to rejection rows below the band only
        note = note if row["kind"] == "rejection" and row["observed"] < lo else ""
    if note.startswith("ratio 1"):  # applies to the rows whose true ratio is 1, when they cover above the band
        note = note if "ratio 1" in row.get("method", "") and row["observed"] > hi else ""
    if note and not inside:
        return note
    if inside:
        return "ok"
    if row["kind"] == "rejection":
        verdict = "conservative" if row["observed"] < lo else "over-rejects"
    else:
        verdict = "over-covers (conservative)" if row["observed"] > hi else "under-covers"
    return f"{verdict}: falls short (small scale)" if row["scale"] == "small" else f"{verdict}: FAILS at paper scale"


def run_check(check: Check, reps: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng([seed, zlib.crc32((check.names[0] + check.setting).encode())])
    t = time.perf_counter()
    out = [check.run(rng, r) for r in range(reps)]
    out = [o if isinstance(o, tuple) else (o,) for o in out]
    # a hit is a bool, or a share in [0, 1] (a replication's share of several categories that are alike)
    hits = np.array([[float(getattr(v, "hit", v)) for v in o] for o in out], dtype=float)
    widths = np.array([[getattr(v, "width", np.nan) for v in o] for o in out], dtype=float)
    seconds = round(time.perf_counter() - t, 1)
    rows = []
    for k, name in enumerate(check.names):
        rate = float(hits[:, k].mean())
        # a share of replications: no nominal value; a power row of a tuple of tests
        kind = ("share" if "closer" in name or "share of audits" in name
                else "coverage" if isinstance(out[0][k], Covered)
                else "power" if "power" in name
                else "false mark" if "read below 0.8" in name
                else check.kind[k] if isinstance(check.kind, tuple) else check.kind)
        row = {"method": name, "kind": kind, "setting": check.setting, "scale": check.scale,
               "nominal": {"coverage": NOMINAL_COVERAGE, "rejection": NOMINAL_LEVEL, "false mark": NOMINAL_LEVEL}.get(
                   kind, np.nan), "observed": rate,
               "replications": reps, "mc_se": float(np.sqrt(max(rate * (1 - rate), 1e-12) / reps)),
               "mean_width": float(np.nanmean(widths[:, k])) if np.isfinite(widths[:, k]).any() else np.nan,
               "seconds": seconds}
        row["flag"] = flag(row, check.note)
        width = f", mean width {row['mean_width']:.4f}" if np.isfinite(row["mean_width"]) else ""
        print(f"{rate:.3f} ± {row['mc_se']:.3f}  {name} · {check.setting} · {row['flag']} ({seconds} s{width})",
              flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=500)
    ap.add_argument("--n-boot", type=int, default=999)
    ap.add_argument("--n-perm", type=int, default=199)
    ap.add_argument("--only", nargs="*", help="substrings of the checks to run")
    ap.add_argument("--scale", choices=["paper", "small"], help="only this scale")
    ap.add_argument("--fast", action="store_true", help="the test-suite subset at paper scale")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    selected = checks(args.n_boot, args.n_perm)
    if args.fast:
        selected = [c for c in selected if set(c.names) & set(FAST) and c.scale == "paper"]
    if args.only:
        selected = [c for c in selected if any(s in n for s in args.only for n in c.names)]
    if args.scale:
        selected = [c for c in selected if c.scale == args.scale]
    rows = []
    for c in selected:
        rows += run_check(c, args.reps)
    table = pd.DataFrame(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.out.exists() and (args.only or args.scale):  # a partial run updates its rows
        old = pd.read_csv(args.out)
        keep = ~old.set_index(["method", "setting"]).index.isin(table.set_index(["method", "setting"]).index)
        table = pd.concat([old[keep], table], ignore_index=True)
    table.to_csv(args.out, index=False)
    return table


if __name__ == "__main__":
    main()
