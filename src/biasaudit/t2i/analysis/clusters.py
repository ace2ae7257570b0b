"""Section `clusters`: label-free identity clusters over the pooled face embeddings of every model (beyond the
paper; the classifier-free view of Stable Bias).

Method (declared): the face embeddings of all models are pooled, L2-normalised, and clustered by scikit-learn's
k-means (k-means++, N_INIT initialisations, seeded; fitted in float32, the embeddings' stored precision). k is the
value in `analyze.cluster_k_range` with the best mean cosine silhouette of a k-means fit to a seeded sample of at
most SAMPLE faces (its exact silhouette on that sample, from the cluster sums: cosine_silhouette); the chosen k is
then fitted to every face. (At paper scale, 45,000 faces, fitting every k to every face would cost minutes; the
sample decides k, every face is clustered.) Then:

* per model × prompt, the distribution of its faces over the clusters (table `cluster_shares`);
* per model, the TVD of its cluster distribution from the other models' (pooled) and from all models' (pooled),
  over the prompts every model answered, with a cluster-bootstrap interval that resamples prompts (the
  project's engine, stats.resample), every model's images of a drawn prompt together (`cluster_tvd`);
* per model × cluster, its share minus the other models' share with the same interval; a model over-produces a
  cluster when that interval lies above 0 (`cluster_excess`; the largest such excess is named);
* the adjusted mutual information between the clusters and the classifier's labels, pooled and per model
  (`cluster_ami`): how far the label-free view agrees with the classifier's race labels;
* each cluster's nearest images to its centre (`cluster_exemplars` and a figure of them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from biasaudit import contracts as C
from biasaudit.pipeline.outputs import NO_DATA, Result
from biasaudit.pipeline.provenance import derive_seed
from biasaudit.stats.tvd import tvd
from biasaudit.t2i.analysis.inputs import Boot, Inputs, _embedding_meta, cores, load_embeddings
from biasaudit.t2i.figures import plot_cluster_exemplars

SPACE = "face"  # identity: the face-recognition embedding (dlib 128-d or ArcFace), not CLIP
SAMPLE = 4000  # faces the choice of k is made on (all of them when fewer)
N_INIT = 4
EXEMPLARS = 6  # nearest images per cluster on the page
ROW_CHUNK = 4096


def pooled_embeddings(inputs: Inputs) -> tuple[pd.DataFrame, np.ndarray]:
    """(meta: image_id, model, prompt_id, label; X: L2-normalised rows) of every model's face embeddings."""
    metas, mats = [], []
    for model in inputs.models:
        loaded = load_embeddings(inputs.root, model, SPACE)
        if loaded is None or len(loaded[0]) == 0:
            continue
        index, X = loaded
        metas.append(_embedding_meta(inputs, index, model)[["image_id", "model", "prompt_id", "label"]])
        mats.append(X)
    if not mats:
        return pd.DataFrame(columns=["image_id", "model", "prompt_id", "label"]), np.zeros((0, 0))
    # float64 rows filled in place and normalised in row chunks: the same numbers as a vstack of float64 copies
    # and one norm over all rows, without their full-size temporaries (3 × 175 MB at paper scale)
    X = np.empty((sum(len(m) for m in mats), mats[0].shape[1]))
    start = 0
    for m in mats:
        X[start:start + len(m)] = m
        start += len(m)
    for a in range(0, len(X), ROW_CHUNK):
        x = X[a:a + ROW_CHUNK]
        x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return pd.concat(metas, ignore_index=True), X


def cosine_silhouette(X: np.ndarray, labels: np.ndarray) -> float:
    """Mean silhouette (Rousseeuw 1987) under cosine distance, exact, in O(n·k·d): on unit rows a face's summed
    cosine distance to a cluster is |C| − x·ΣC, so one product with the k cluster sums replaces the n × n distance
    matrix (what sklearn's silhouette_score(metric="cosine") builds; tests/test_clusters.py checks both agree).
    A face alone in its cluster scores 0, as there."""
    U = X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)
    ks, lab = np.unique(labels, return_inverse=True)
    size = np.bincount(lab, minlength=len(ks)).astype(float)
    sums = np.zeros((len(ks), U.shape[1]))
    np.add.at(sums, lab, U)
    G = U @ sums.T  # n × k: each face's summed cosine similarity to each cluster (itself included in its own)
    rows = np.arange(len(U))
    own = size[lab]
    self_sim = np.einsum("ij,ij->i", U, U)
    with np.errstate(invalid="ignore", divide="ignore"):
        a = ((own - 1) - (G[rows, lab] - self_sim)) / (own - 1)
        mean_to = (size[None, :] - G) / size[None, :]
    mean_to[rows, lab] = np.inf
    b = mean_to.min(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        s = np.nan_to_num((b - a) / np.maximum(a, b))
    s[own == 1] = 0.0
    return float(s.mean())


def within_ss(X: np.ndarray, labels: np.ndarray) -> float:
    """k-means' inertia of a partition in float64 (Σ‖x‖² − Σ_c ‖Σ_{x∈c} x‖² / |c|), whatever precision the fit ran in."""
    _, lab = np.unique(labels, return_inverse=True)
    sums = np.zeros((lab.max() + 1, X.shape[1]))
    np.add.at(sums, lab, X)
    return float(np.einsum("ij,ij->", X, X) - (np.einsum("ij,ij->i", sums, sums) / np.bincount(lab)).sum())


def choose_k(X: np.ndarray, k_range: tuple[int, int], seed: int) -> tuple[int, np.ndarray, pd.DataFrame]:
    """(k, cluster of each row, table k → mean silhouette): k-means for each k of the range on a seeded sample of at
    most SAMPLE rows, the k of the best silhouette there, then that k fitted to every row.

    The fits of the range run on every core, each k-means at 1 thread: sklearn's Lloyd loop at 4,000 rows spends
    most of its CPU in OpenMP waits when the threads share busy cores (2.5× the CPU at 2 threads on 2 busy cores,
    benchmarks/results/analyze.txt); each fit has its own seed, so the table does not depend on the workers."""
    from concurrent.futures import ThreadPoolExecutor

    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(seed)
    S = X if len(X) <= SAMPLE else X[np.sort(rng.choice(len(X), SAMPLE, replace=False))]
    lo, hi = k_range
    ks = list(range(lo, min(hi, len(S) - 1) + 1))

    S32 = S.astype(np.float32)  # fits in float32, the embeddings' stored precision (the full fit: ⅓ the CPU)

    def fit(k: int) -> tuple[Any, float]:
        km = KMeans(n_clusters=k, n_init=N_INIT, random_state=seed % 2**31).fit(S32)
        return km, (cosine_silhouette(S, km.labels_) if len(np.unique(km.labels_)) > 1 else np.nan)

    with threadpool_limits(1), ThreadPoolExecutor(max(1, min(len(ks), cores()))) as pool:
        fits = list(pool.map(fit, ks))
    rows, best = [], None
    for k, (km, s) in zip(ks, fits):
        rows.append({"k": k, "silhouette": s, "inertia": within_ss(S, km.labels_), "sample": len(S)})
        if np.isfinite(s) and (best is None or s > best[0]):
            best = (s, k, km)
    table = pd.DataFrame(rows)
    if best is None:
        return 1, np.zeros(len(X), dtype=int), table
    table["chosen"] = table["k"] == best[1]
    if S is X:
        return best[1], best[2].labels_.astype(int), table
    # every row, started from the sample's centres: one Lloyd run, not N_INIT fresh ones (4× less at paper scale)
    with threadpool_limits(1):
        km = KMeans(n_clusters=best[1], init=best[2].cluster_centers_, n_init=1,
                    random_state=seed % 2**31).fit(X.astype(np.float32))
    return best[1], km.labels_.astype(int), table


def _model_totals(meta: pd.DataFrame, clusters: np.ndarray, k: int) -> tuple[list[str], list[str], np.ndarray]:
    """(models, prompts every model answered, counts[prompt, model, cluster])."""
    d = meta.assign(cluster=clusters)
    models = sorted(d["model"].unique())
    per = d.groupby("prompt_id")["model"].nunique()
    prompts = sorted(per[per == len(models)].index)
    counts = np.zeros((len(prompts), len(models), k))
    sub = d[d["prompt_id"].isin(prompts)]
    pi = {p: i for i, p in enumerate(prompts)}
    mi = {m: i for i, m in enumerate(models)}
    np.add.at(counts, (sub["prompt_id"].map(pi).to_numpy(), sub["model"].map(mi).to_numpy(), sub["cluster"].to_numpy()), 1)
    return models, prompts, counts


def model_cluster_tvd(meta: pd.DataFrame, clusters: np.ndarray, k: int, boot: Boot) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(cluster_tvd, cluster_excess): per model, the TVD of its cluster distribution from the other models' and from
    every model's, and per model × cluster its share minus the others' share; intervals from one cluster
    bootstrap over the prompts every model answered."""
    models, prompts, counts = _model_totals(meta, clusters, k)
    tvd_rows, excess_rows = [], []
    if len(models) < 2 or not prompts:
        return pd.DataFrame(), pd.DataFrame()
    for j, model in enumerate(models):
        own = counts[:, j, :]
        others = counts.sum(axis=1) - own
        totals = np.concatenate([own, others], axis=1)  # per prompt: K own counts, K others' counts

        def stat(s: np.ndarray, K: int = k) -> np.ndarray:
            with np.errstate(invalid="ignore", divide="ignore"):
                a = s[..., :K] / s[..., :K].sum(axis=-1, keepdims=True)
                b = s[..., K:] / s[..., K:].sum(axis=-1, keepdims=True)
                allp = (s[..., :K] + s[..., K:]) / (s[..., :K] + s[..., K:]).sum(axis=-1, keepdims=True)
                return np.concatenate([tvd(a, b)[..., None], tvd(a, allp)[..., None], a - b], axis=-1)

        ivs = boot.run(totals, stat, "cluster-tvd", model)
        vs_others, vs_pooled, diffs = ivs[0], ivs[1], ivs[2:]
        tvd_rows.append({"model": model, "n_prompts": len(prompts), "n_faces": int(own.sum()), "k": k,
                         "tvd_vs_others": vs_others.estimate, "tvd_vs_others_low": vs_others.low,
                         "tvd_vs_others_high": vs_others.high, "tvd_vs_pooled": vs_pooled.estimate,
                         "tvd_vs_pooled_low": vs_pooled.low, "tvd_vs_pooled_high": vs_pooled.high,
                         "reason": vs_others.reason})
        share = own.sum(axis=0) / max(own.sum(), 1)
        other_share = others.sum(axis=0) / max(others.sum(), 1)
        for c, iv in enumerate(diffs):
            excess_rows.append({"model": model, "cluster": c, "share": share[c], "share_others": other_share[c],
                                "excess": iv.estimate, "low": iv.low, "high": iv.high,
                                "over_produced": bool(np.isfinite(iv.low) and iv.low > 0)})
    return pd.DataFrame(tvd_rows), pd.DataFrame(excess_rows)


def over_produced(excess: pd.DataFrame) -> dict[str, int]:
    """model → the cluster it over-produces most (largest excess among those whose interval lies above 0)."""
    if excess.empty:
        return {}
    hits = excess[excess["over_produced"]].sort_values("excess", ascending=False)
    return {str(m): int(g["cluster"].iloc[0]) for m, g in hits.groupby("model", sort=True)}


def cluster_shares(meta: pd.DataFrame, clusters: np.ndarray, k: int) -> pd.DataFrame:
    """Per model × prompt × cluster: count and share of the model's faces of that prompt."""
    d = meta.assign(cluster=clusters)
    counts = pd.crosstab([d["model"], d["prompt_id"]], d["cluster"]).reindex(columns=range(k), fill_value=0)
    shares = counts.div(counts.sum(axis=1), axis=0)
    out = counts.stack().rename("n").to_frame().join(shares.stack().rename("share"))
    out.index.names = ["model", "prompt_id", "cluster"]
    return out.reset_index()


def ami_table(meta: pd.DataFrame, clusters: np.ndarray, groups: tuple[str, ...]) -> pd.DataFrame:
    """Adjusted mutual information between the clusters and the classifier's labels (faces with a label of the
    group set), pooled and per model."""
    from sklearn.metrics import adjusted_mutual_info_score

    d = meta.assign(cluster=clusters)
    d = d[d["label"].isin(groups)]
    rows = []
    for model, sub in [("all models", d), *d.groupby("model", sort=True)]:
        ok = len(sub) >= 2 and sub["label"].nunique() > 1 and sub["cluster"].nunique() > 1
        rows.append({"model": model, "n_faces": len(sub),
                     "ami": float(adjusted_mutual_info_score(sub["label"], sub["cluster"])) if ok else np.nan,
                     "reason": "" if ok else "fewer than two labels or clusters among these faces"})
    return pd.DataFrame(rows)


def exemplars(meta: pd.DataFrame, X: np.ndarray, clusters: np.ndarray, k: int, paths: dict[str, str],
              n: int = EXEMPLARS) -> pd.DataFrame:
    """Each cluster's n faces nearest its centre (cosine distance to the normalised mean)."""
    rows = []
    for c in range(k):
        idx = np.flatnonzero(clusters == c)
        if not len(idx):
            continue
        centre = X[idx].mean(axis=0)
        centre /= max(np.linalg.norm(centre), 1e-12)
        dist = 1.0 - X[idx] @ centre
        for rank, i in enumerate(idx[np.argsort(dist, kind="stable")[:n]]):
            m = meta.iloc[i]
            rows.append({"cluster": c, "rank": rank + 1, "size": len(idx), "image_id": m["image_id"],
                         "model": m["model"], "prompt_id": m["prompt_id"], "label": m["label"],
                         "cosine_distance": float(1.0 - X[i] @ centre), "path": paths.get(str(m["image_id"]), "")})
    return pd.DataFrame(rows)


def compute(inputs: Inputs, cfg: Any) -> Result:
    """Tables cluster_k, cluster_tvd, cluster_excess, cluster_shares, cluster_ami, cluster_exemplars; a figure of
    each cluster's nearest images."""
    boot = Boot.of(cfg)
    res = Result("clusters", "Label-free identity clusters of the face embeddings (beyond the paper)")
    meta, X = pooled_embeddings(inputs)
    lo = cfg.analyze.cluster_k_range[0]
    if len(X) <= lo:
        res.status, res.reason = NO_DATA, f"{len(X)} face embeddings: too few to cluster (k ≥ {lo})"
        return res
    k, clusters, k_table = choose_k(X, tuple(cfg.analyze.cluster_k_range), derive_seed(boot.seed, "clusters"))
    tvd_table, excess = model_cluster_tvd(meta, clusters, k, boot)
    paths = {}
    if not inputs.manifests.empty and "path" in inputs.manifests:
        paths = dict(zip(inputs.manifests["image_id"].astype(str), inputs.manifests["path"].astype(str)))
    ex = exemplars(meta, X, clusters, k, paths)
    res.tables = {C.CLUSTER_K.name: k_table, C.CLUSTER_TVD.name: tvd_table, C.CLUSTER_EXCESS.name: excess,
                  C.CLUSTER_SHARES.name: cluster_shares(meta, clusters, k),
                  C.CLUSTER_AMI.name: ami_table(meta, clusters, inputs.groups), C.CLUSTER_EXEMPLARS.name: ex}
    res.figures["cluster_exemplars"] = plot_cluster_exemplars(ex, Path(inputs.root))
    over = over_produced(excess)
    res.notes.append(f"k-means (k-means++, {N_INIT} initialisations, seeded) on {len(X)} L2-normalised {SPACE} "
                     f"embeddings of {meta['model'].nunique()} models; k = {k}, the best mean cosine silhouette over "
                     f"k in {list(cfg.analyze.cluster_k_range)}")
    for model, c in over.items():
        r = excess[(excess["model"] == model) & (excess["cluster"] == c)].iloc[0]
        res.notes.append(f"{model} over-produces cluster {c}: {r['share']:.0%} of its faces vs {r['share_others']:.0%} "
                         f"of the other models' (excess {r['excess']:+.2f}, interval {r['low']:+.2f} to {r['high']:+.2f})")
    if tvd_table.empty:
        res.notes.append("one model, or no prompt answered by every model: no between-model TVD")
    res.metrics = {"k": k, "over_produced": over,
                   "tvd_vs_others": {r.model: {"tvd": r.tvd_vs_others, "low": r.tvd_vs_others_low,
                                               "high": r.tvd_vs_others_high} for r in tvd_table.itertuples()},
                   "ami": {r.model: r.ami for r in res.tables[C.CLUSTER_AMI.name].itertuples()}}
    return res
