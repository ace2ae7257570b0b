"""Section `homogeneity`: the homogeneity gap by race and by L* bin (biasaudit.stats.homogeneity)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from biasaudit import contracts as C
from biasaudit.outputs import NO_DATA, Result
from biasaudit.provenance import derive_seed
from biasaudit.stats.homogeneity import add_p_adjusted, homogeneity_table
from biasaudit.t2i.analysis.inputs import SPACES, Boot, Inputs, _embedding_meta, load_embeddings
from biasaudit.t2i.figures import plot_gap_heatmap, plot_similarity_by_bin


def compute(inputs: Inputs, cfg: Any) -> Result:
    """Gap tables by race and by L* bin, per model and embedding space (biasaudit.stats.homogeneity)."""
    boot, n_permutations, min_group_size = Boot.of(cfg), cfg.analyze.n_permutations, cfg.analyze.min_group_size
    res = Result("homogeneity", "Homogeneity gap (CLIP and face embeddings)")
    race, bins = [], []
    for model in inputs.models:
        for space in SPACES:
            loaded = load_embeddings(inputs.root, model, space)
            if loaded is None or len(loaded[0]) == 0:
                continue
            index, X = loaded
            meta = _embedding_meta(inputs, index, model)
            kw = dict(within="model", cluster="prompt_id", n_boot=boot.n_boot, n_perm=n_permutations,
                      seed=derive_seed(boot.seed, "homogeneity", model, space), small_group=min_group_size,
                      method=boot.method, design=boot.permutation_design, p_adjust_method=None, level=boot.level)
            meta = meta.assign(prompt_id=meta["prompt_id"].fillna("?"))
            for by, sink in (("race", race), ("L_bin", bins)):
                if meta[by].notna().any():
                    sink.append(homogeneity_table(X, meta, by=by, **kw).assign(space=space))
    if not race and not bins:
        res.status, res.reason = NO_DATA, ("no embeddings under data/t2i/embeddings/ for any model"
                                           if inputs.models else "no models found")
        return res
    adjust = (lambda t: add_p_adjusted(t, boot.p_adjust)) if n_permutations > 0 else (lambda t: t)
    if n_permutations > 0:
        res.notes.append(f"permutation test: labels permuted {boot.permutation_design} prompts "
                         + ("(does the label add similarity beyond what the prompt explains?)"
                            if boot.permutation_design == "within" else "(are embeddings independent of the label?)")
                         + f"; p_adjusted: {boot.p_adjust} over every group, space and model of a table")
    if race:
        t = adjust(pd.concat(race, ignore_index=True))
        res.tables[C.HOMOGENEITY_BY_RACE.name] = t[["model", "space", *[c for c in t.columns if c not in ("model", "space")]]]
        res.figures["homogeneity_gap_heatmap"] = plot_gap_heatmap(t)
        res.metrics["gap"] = {f"{r.model}/{r.space}/{r.group}": {
            "gap": r.gap, "n": r.n, "low": getattr(r, "gap_lo", None), "high": getattr(r, "gap_hi", None),
            "p": getattr(r, "p_value", None), "p_adjusted": getattr(r, "p_adjusted", None)} for r in t.itertuples()}
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
    else:
        res.notes.append("no labelled image has an embedding: race gaps not computed")
    if bins:
        t = adjust(pd.concat(bins, ignore_index=True))
        res.tables["homogeneity_by_L_bin"] = t[["model", "space", *[c for c in t.columns if c not in ("model", "space")]]]
        res.figures["similarity_by_L_bin"] = plot_similarity_by_bin(t)
    return res
