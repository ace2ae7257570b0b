"""Label-free identity clusters: PLANTED face embeddings with a known cluster structure (well-separated blobs on the
unit sphere) are recovered (adjusted Rand index ≥ 0.9), and a planted model that over-produces one cluster is found;
the TVDs and AMI against brute-force values."""

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import adjusted_mutual_info_score, adjusted_rand_score

from biasaudit import contracts as C
from biasaudit.t2i.analysis import clusters
from biasaudit.t2i.analysis.inputs import Inputs

from .fixtures_t2i import analysis_config

K_TRUE, DIM, PROMPTS, PER_PROMPT = 4, 32, 15, 16
MODELS = {"even-a": [0.25] * 4, "even-b": [0.25] * 4, "over": [0.15, 0.15, 0.55, 0.15]}  # "over": cluster 2 × 2.2


def planted_tree(root, groups, seed=0):
    """Embeddings of three planted models (files in the faces stage's format), their labels and manifests; the
    planted cluster of every face."""
    rng = np.random.default_rng(seed)
    centres = np.linalg.qr(rng.normal(size=(DIM, K_TRUE)))[0].T  # orthonormal: pairwise cosine 0
    man, lab, truth = [], [], {}
    for model, p in MODELS.items():
        ids, rows = [], []
        for j in range(PROMPTS):
            for i in range(PER_PROMPT):
                iid = f"{model}-p{j}-{i}"
                c = int(rng.choice(K_TRUE, p=p))
                x = centres[c] + rng.normal(0, 0.06, DIM)
                rows.append(x / np.linalg.norm(x))
                ids.append(iid)
                truth[iid] = c
                # the classifier's label follows the cluster 85% of the time
                label = groups[c] if rng.random() < 0.85 else groups[int(rng.integers(len(groups)))]
                lab.append({"image_id": iid, "model": model, "prompt_id": f"p{j}", "label": label})
                man.append({"image_id": iid, "model": model, "prompt_id": f"p{j}", "path": "", "status": "ok"})
        d = root / C.embeddings_dir(model)
        d.mkdir(parents=True, exist_ok=True)
        np.save(d / "face.npy", np.asarray(rows, dtype=np.float32))
        np.save(d / "clip.npy", np.asarray(rows, dtype=np.float32))
        pd.DataFrame({"image_id": ids, "clip_row": np.arange(len(ids)), "face_row": np.arange(len(ids))}).to_parquet(
            d / "index.parquet", index=False)
    inputs = Inputs(pd.DataFrame(), pd.DataFrame(man), pd.DataFrame(lab), pd.DataFrame(), root=root, groups=groups)
    return inputs, truth


def test_planted_clusters_are_recovered_and_the_over_producing_model_is_found(tmp_path):
    cfg = analysis_config(n_boot=400)
    inputs, truth = planted_tree(tmp_path, cfg.groups)
    res = clusters.compute(inputs, cfg)
    assert res.status == "ok"
    assert res.metrics["k"] == K_TRUE  # chosen by the silhouette rule over [2, 10]
    meta, X = clusters.pooled_embeddings(inputs)
    _, found, _ = clusters.choose_k(X, tuple(cfg.analyze.cluster_k_range), clusters.derive_seed(cfg.seed, "clusters"))
    planted = meta["image_id"].map(truth).to_numpy()
    assert adjusted_rand_score(planted, found) >= 0.9
    # the over-produced cluster is the one holding planted cluster 2
    c2 = int(pd.Series(found[planted == 2]).mode()[0])
    assert res.metrics["over_produced"]["over"] == c2
    excess = res.tables["cluster_excess"].set_index(["model", "cluster"])
    assert excess.loc[("over", c2), "over_produced"] and excess.loc[("over", c2), "low"] > 0
    assert excess["excess"].idxmax() == ("over", c2)
    assert any("over over-produces cluster" in n for n in res.notes)


def test_cluster_tvd_and_ami_are_the_brute_force_values(tmp_path):
    cfg = analysis_config(n_boot=200)
    inputs, _ = planted_tree(tmp_path, cfg.groups, seed=1)
    res = clusters.compute(inputs, cfg)
    meta, X = clusters.pooled_embeddings(inputs)
    k, found, _ = clusters.choose_k(X, tuple(cfg.analyze.cluster_k_range), clusters.derive_seed(cfg.seed, "clusters"))
    d = meta.assign(cluster=found)
    table = res.tables["cluster_tvd"].set_index("model")
    for model in MODELS:
        own = d[d["model"] == model]["cluster"].value_counts(normalize=True).reindex(range(k), fill_value=0)
        rest = d[d["model"] != model]["cluster"].value_counts(normalize=True).reindex(range(k), fill_value=0)
        allp = d["cluster"].value_counts(normalize=True).reindex(range(k), fill_value=0)
        r = table.loc[model]
        assert r["tvd_vs_others"] == pytest.approx(0.5 * np.abs(own - rest).sum())
        assert r["tvd_vs_pooled"] == pytest.approx(0.5 * np.abs(own - allp).sum())
        assert r["tvd_vs_others_low"] <= r["tvd_vs_others"] <= r["tvd_vs_others_high"]
    ami = res.tables["cluster_ami"].set_index("model")
    assert ami.loc["all models", "ami"] == pytest.approx(adjusted_mutual_info_score(d["label"], d["cluster"]))
    assert ami.loc["all models", "ami"] > 0.5  # labels follow the planted clusters 85% of the time
    ex = res.tables["cluster_exemplars"]
    assert set(ex["cluster"]) == set(range(k)) and ex.groupby("cluster")["rank"].max().eq(clusters.EXEMPLARS).all()
    # the nearest images are nearest: no face of a cluster is closer to its centre than its last exemplar
    for c, sub in ex.groupby("cluster"):
        idx = np.flatnonzero(found == c)
        centre = X[idx].mean(axis=0)
        centre /= np.linalg.norm(centre)
        assert sub["cosine_distance"].max() <= np.sort(1 - X[idx] @ centre)[clusters.EXEMPLARS - 1] + 1e-12
    shares = res.tables["cluster_shares"]
    np.testing.assert_allclose(shares.groupby(["model", "prompt_id"])["share"].sum(), 1.0)


def test_too_few_faces_say_no_data(tmp_path):
    cfg = analysis_config()
    empty = Inputs(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), root=tmp_path, groups=cfg.groups)
    assert clusters.compute(empty, cfg).status == "no data"


def test_k_chosen_on_a_sample_still_clusters_every_face(tmp_path, monkeypatch):
    """Paper scale chooses k on a seeded sample and fits that k to every face: the same recovery."""
    cfg = analysis_config()
    inputs, truth = planted_tree(tmp_path, cfg.groups, seed=2)
    monkeypatch.setattr(clusters, "SAMPLE", 200)
    meta, X = clusters.pooled_embeddings(inputs)
    k, found, table = clusters.choose_k(X, (2, 6), 7)
    assert k == K_TRUE and len(found) == len(X) and (table["sample"] == 200).all()
    assert adjusted_rand_score(meta["image_id"].map(truth).to_numpy(), found) >= 0.9


def test_the_linear_cosine_silhouette_is_sklearns():
    """choose_k's silhouette (cluster sums, O(n·k·d)) against sklearn's silhouette_score over the n × n cosine
    distances, with rows not of unit length, a singleton cluster and unbalanced sizes."""
    from sklearn.metrics import silhouette_score

    rng = np.random.default_rng(5)
    X = rng.normal(size=(300, 12)) * rng.uniform(0.5, 3.0, size=(300, 1)) + np.repeat(rng.normal(size=(5, 12)), 60, 0)
    labels = np.repeat(np.arange(5), 60)
    labels[7] = 9  # a cluster of one face: silhouette 0 by definition
    labels[100:150] = 3
    for lab in (labels, rng.integers(0, 3, 300)):
        assert clusters.cosine_silhouette(X, lab) == pytest.approx(silhouette_score(X, lab, metric="cosine"), abs=1e-12)
        # the table's inertia: the partition's squared distances to its cluster means, summed
        brute = sum(((X[lab == c] - X[lab == c].mean(axis=0)) ** 2).sum() for c in np.unique(lab))
        assert clusters.within_ss(X, lab) == pytest.approx(brute, rel=1e-12)
