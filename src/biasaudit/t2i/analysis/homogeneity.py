"""Section `homogeneity`: the within-prompt homogeneity gap (headline) and the paper's unstratified gap,
by race and by L* bin, per model and embedding space (biasaudit.stats.homogeneity)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from biasaudit import contracts as C
from biasaudit.pipeline.io import stable_table
from biasaudit.pipeline.outputs import NO_DATA, Result
from biasaudit.pipeline.provenance import derive_seed
from biasaudit.stats.homogeneity import (
    add_p_adjusted,
    bootstrap_gap,
    homogeneity_gap,
    prompt_blocks,
    within_prompt_table,
)
from biasaudit.t2i.analysis.inputs import SPACES, Boot, Inputs, _embedding_meta, cores, load_embeddings
from biasaudit.t2i.figures import plot_gap_heatmap, plot_similarity_by_bin

BYS = ("race", "L_bin")


def _labels(meta: pd.DataFrame, by: str):
    return meta[by].astype(object).where(lambda s: s.notna() & (s != ""), None).to_numpy()


def _model_space(inputs: Inputs, cfg: Any, boot: Boot, model: str, space: str) -> dict[str, pd.DataFrame]:
    """Every labelling's table for one model and embedding space (one pass over its X), and its pairwise
    table under "<labelling>_pairs"."""
    a = cfg.analyze
    loaded = load_embeddings(inputs.root, model, space)
    if loaded is None or len(loaded[0]) == 0:
        return {}
    index, X = loaded
    meta = _embedding_meta(inputs, index, model)
    prompts = meta["prompt_id"].fillna("?").to_numpy()
    labellings = {by: _labels(meta, by) for by in BYS if meta[by].notna().any()}
    if not labellings:
        return {}
    blocks = prompt_blocks(X, prompts)  # one pass over X: every labelling and permutation reuses it
    pairs: dict[str, pd.DataFrame] = {}
    out = within_prompt_table(X, prompts, labellings, n_boot=boot.n_boot, n_perm=a.n_permutations,
                              seed=derive_seed(boot.seed, "homogeneity", model, space), level=boot.level,
                              method=boot.method, design=boot.permutation_design,
                              stop_after=a.permutation_stop_after, near_dup_cosine=a.near_duplicate_cosine,
                              small_group=a.min_group_size, blocks=blocks, pairs_out=pairs)
    for by, p in pairs.items():
        out[f"{by}_pairs"] = p.assign(model=model, space=space, grouping=by)
    # the prompt as the group (the seed computes similarity "within groups defined by race, prompt, and skin
    # tone"): each prompt's images against the model's other prompts, the paper's unstratified gap, point only
    known = meta["prompt_id"].notna().to_numpy()
    if known.sum() >= 2:
        Xk = X if known.all() else X[known]  # one copy at most (61 MB per model at paper scale), not three
        by_prompt = homogeneity_gap(Xk, prompts[known], small_group=a.min_group_size)
        out["prompt"] = by_prompt.assign(model=model, space=space, grouping="prompt")
        # every embedded face of the model as one group: its mean pairwise cosine ("the most diverse facial
        # embeddings" is the lowest), with a prompt-cluster bootstrap interval
        one = np.full(int(known.sum()), "all", dtype=object)
        with np.errstate(invalid="ignore", divide="ignore"):  # one group has no "rest": inter is NaN
            overall = homogeneity_gap(Xk, one, small_group=a.min_group_size)[["n", "intra"]]
            if boot.n_boot > 0:
                ci = bootstrap_gap(Xk, one, prompts[known], n_boot=boot.n_boot, ci=boot.level, method=boot.method,
                                   seed=derive_seed(boot.seed, "homogeneity_overall", model, space) % 2**32)
                overall = overall.assign(intra_lo=ci["intra_lo"].to_numpy(), intra_hi=ci["intra_hi"].to_numpy())
        out["overall"] = overall.assign(model=model, space=space)
    for by, t in list(out.items()):
        if by.endswith("_pairs"):
            continue
        t = t.assign(model=model, space=space, grouping=by)
        if "p_perm" in t:
            t["p_value"] = t["p_perm"]
        out[by] = t
    return out


def compute(inputs: Inputs, cfg: Any) -> Result:
    """Gap tables by race and by L* bin, per model and embedding space: the within-prompt gap (pairs
    that share a prompt, prompt-cluster bootstrap CI, one-sided within-prompt permutation test per
    group and a global test, near-duplicate rates) and the paper's unstratified gap beside it.

    The (model, space) units run on every core, each with 1 BLAS thread: the permutation test is a
    compiled loop that releases the GIL (group sums per prompt and draw, linear in the images per prompt)
    and the near-duplicates many small GEMMs (a prompt's Gram matrix in row blocks), which multi-threaded
    BLAS slows down (6× at 2 threads on 2 busy cores, benchmarks/bench_analyze.py). Every unit has its own
    seed, so the tables do not depend on the number of workers."""
    a = cfg.analyze
    boot = Boot.of(cfg)
    res = Result("homogeneity", "Homogeneity gap (CLIP and face embeddings)")
    units = [(model, space) for model in inputs.models for space in SPACES]
    workers = max(1, min(len(units), cores()))
    with threadpool_limits(1), ThreadPoolExecutor(workers) as pool:
        parts = list(pool.map(lambda u: _model_space(inputs, cfg, boot, *u), units))
    tables: dict[str, list[pd.DataFrame]] = {by: [p[by] for p in parts if by in p] for by in BYS}
    pair_tables = [p["race_pairs"] for p in parts if "race_pairs" in p]
    if not any(tables.values()):
        res.status, res.reason = NO_DATA, ("no embeddings under data/t2i/embeddings/ for any model"
                                           if inputs.models else "no models found")
        return res
    res.notes.append("headline: the within-prompt gap (wp_gap) compares only pairs of images that share a prompt "
                     "(intra-group minus inter-group cosine; prompt p weighs n_pg (m_p − n_pg) / m_p, its number of "
                     "group–rest pairs over its labelled images), so a group's prompt mix cancels; estimand: the "
                     "population over prompts, CI by a prompt-cluster bootstrap whose small-cluster expansion counts "
                     "the prompts where the group has pairs (n_prompts); few_prompts: fewer than "
                     f"{C.MIN_PROMPTS_CI} such prompts, where the interval under-covers. 'gap' is the paper (unstratified) gap over all pairs, kept for replication: it "
                     "also reads prompt concentration as homogeneity")
    if a.n_permutations > 0:
        res.notes.append(f"permutation test (p_perm, one-sided wp_gap > 0): labels permuted {boot.permutation_design} "
                         "prompts, as many draws for race as for L* bins of a model and space; a group's "
                         "statistic is its within-prompt gap over its prompt-cluster SE, recomputed in every draw "
                         "(studentised: exact when labels are exchangeable, and it still tests the group's own gap "
                         "when another group is homogeneous); "
                         f"p_global: the pooled within-prompt gap of all groups; Besag–Clifford stopping at "
                         f"{a.permutation_stop_after} exceedances; p_adjusted: {boot.p_adjust} over every group, space "
                         "and model of a table")
    res.notes.append(f"localising test (flagged, p_localise): group g is flagged only if it is more self-similar than "
                     "every other group h, i.e. every one of its pairwise within-prompt gaps (pair_gap: mean cosine "
                     "within g minus between g and h, pairs sharing a prompt) and tightness contrasts (tight_diff: "
                     "intra g minus intra h) is above 0 at one-sided level "
                     f"{1 - boot.level:.2f} (intersection-union rule, prompt-cluster t tests); a group beside one with "
                     "a look of its own is not flagged. dedup_flagged, p_dedup_localise, wp_gap_dedup: the same with "
                     f"near-duplicate pairs (cosine ≥ {a.near_duplicate_cosine}) left out, so equal copy rates read as "
                     "no group effect. Pairwise table: homogeneity_pairs")
    res.notes.append(f"near_dup_rate: share of a group's images with another image of the same prompt at cosine ≥ "
                     f"{a.near_duplicate_cosine} (near-duplicates are real repetition and raise the gap)")
    adjust = (lambda t: add_p_adjusted(t, boot.p_adjust)) if a.n_permutations > 0 else (lambda t: t)
    if tables["race"]:
        t = adjust(pd.concat(tables["race"], ignore_index=True))
        res.tables[C.HOMOGENEITY_BY_RACE.name] = t[["model", "space", *[c for c in t.columns if c not in ("model", "space")]]]
        res.figures["homogeneity_gap_heatmap"] = plot_gap_heatmap(t, inputs.groups)
        res.metrics["gap"] = {f"{r.model}/{r.space}/{r.group}": {
            "gap": r.gap, "n": r.n, "low": getattr(r, "gap_lo", None), "high": getattr(r, "gap_hi", None),
            "wp_gap": r.wp_gap, "wp_low": r.wp_gap_lo, "wp_high": r.wp_gap_hi,
            "n_prompts": getattr(r, "n_prompts", None), "few_prompts": getattr(r, "few_prompts", None),
            "near_dup_rate": getattr(r, "near_dup_rate", None),
            "p": getattr(r, "p_value", None), "p_adjusted": getattr(r, "p_adjusted", None),
            "p_global": getattr(r, "p_global", None)} for r in t.itertuples()}
        baseline_path = inputs.root / C.BASELINE_DIR / "gaps.parquet"
        baseline = pd.read_parquet(baseline_path) if baseline_path.exists() else pd.DataFrame()
        if baseline.empty:
            res.notes.append("no real-portrait baseline (baseline.source: none or no portraits embedded)")
        else:
            from biasaudit.stats.homogeneity import relative_gaps

            rel = relative_gaps(t[["model", "space", "group", "gap", "n"]], baseline)
            res.tables[C.HOMOGENEITY_VS_BASELINE.name] = rel
            if bool(baseline.get("stand_in", pd.Series([False])).any()):
                res.notes.append("the real-portrait baseline is a STAND-IN (packaged photos dealt into group "
                                 "folders): its gaps and the differences mean nothing")
        if pair_tables:
            pt = pd.concat(pair_tables, ignore_index=True)
            res.tables["homogeneity_pairs"] = pt[["model", "space", *[c for c in pt.columns if c not in ("model", "space")]]]
    else:
        res.notes.append("no labelled image has an embedding: race gaps not computed")
    overall = [p["overall"] for p in parts if "overall" in p]
    if overall:
        t = pd.concat(overall, ignore_index=True)
        res.tables[C.HOMOGENEITY_OVERALL.name] = t[["model", "space", *[c for c in t.columns if c not in ("model", "space")]]]
    prompt_tables = [p["prompt"] for p in parts if "prompt" in p]
    if prompt_tables:
        t = pd.concat(prompt_tables, ignore_index=True)
        res.tables[C.HOMOGENEITY_BY_PROMPT.name] = t[["model", "space", *[c for c in t.columns if c not in ("model", "space")]]]
        res.notes.append("homogeneity_by_prompt: the prompt as the group (each prompt's images against the same "
                         "model's other prompts; the paper's unstratified gap, no interval): a prompt with a large gap "
                         "is rendered as near-copies whatever its label")
    if tables["L_bin"]:
        t = adjust(pd.concat(tables["L_bin"], ignore_index=True))
        res.tables["homogeneity_by_L_bin"] = t[["model", "space", *[c for c in t.columns if c not in ("model", "space")]]]
        res.figures["similarity_by_L_bin"] = plot_similarity_by_bin(stable_table(t))  # drawn from the written values
    return res
