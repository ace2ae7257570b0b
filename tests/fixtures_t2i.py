"""SYNTHETIC stage outputs in the exact contract formats (biasaudit.contracts), for testing
the analysis and report stages without running the upstream stages. Every number here is made up
by a seeded random generator; nothing describes a real model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from skimage.color import lab2rgb

from biasaudit import contracts as C
from biasaudit.contracts import GROUPS
from biasaudit.faces.colour import describe_rgb
from biasaudit.faces.stage import _empty_colour


def colour_columns(L: float, a: float, b: float) -> dict:
    """The faces stage's colour columns for a skin colour given in CIELAB, through the producer's own
    describe_rgb (so L_bin and every other column are exactly what the faces stage would write)."""
    rgb = lab2rgb(np.array([L, a, b], dtype=float), illuminant="D65", observer="2") * 255.0
    return describe_rgb(rgb)

MODELS = ("synth-a", "synth-b")
IMAGES_PER_PROMPT = 10

PROMPTS = [  # prompt_id, category, instance, selected_for, shares (w, b, a, h, o), earnings
    ("occ_a", "occupation", "Nurses", "black", (0.55, 0.30, 0.05, 0.08, 0.02), 1300.0),
    ("occ_b", "occupation", "Cooks", "hispanic", (0.40, 0.15, 0.05, 0.38, 0.02), 650.0),
    ("occ_c", "occupation", "Lawyers", "white", (0.85, 0.05, 0.05, 0.04, 0.01), 2100.0),
    ("geo_a", "geography", "Hinds County, Mississippi", "black", (0.22, 0.73, 0.01, 0.02, 0.02), np.nan),
    ("geo_b", "geography", "Queens County, New York", "asian", (0.22, 0.16, 0.27, 0.28, 0.07), np.nan),
    ("sur_a", "surname", "Chen", "asian", (0.02, 0.00, 0.96, 0.01, 0.01), np.nan),
    ("sur_b", "surname", "Charles", "black", (0.36, 0.55, 0.02, 0.04, 0.03), np.nan),
]


def write_tree(root: str | Path, seed: int = 7, faces: bool = True, labels: bool = True,
               embeddings: bool = True, reliability: bool = True) -> Path:
    """Write a tiny synthetic data/t2i + reports/t2i/reliability tree under `root`."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    prompts = pd.DataFrame([{"prompt_id": pid, "category": cat, "instance": inst, "selected_for": sel,
                             "rank_in_group": 1, "prompt": f"A person ({inst}), synthetic",
                             **dict(zip(GROUPS, shares)), "size": 100.0, "median_weekly_earnings_usd": earn,
                             "template_version": "v1"} for pid, cat, inst, sel, shares, earn in PROMPTS])
    (root / C.T2I).mkdir(parents=True, exist_ok=True)
    prompts.to_csv(root / C.PROMPTS_CSV, index=False)
    (root / C.T2I / "SYNTHETIC.txt").write_text("synthetic test fixture (tests/fixtures_t2i.py)\n")
    for m, model in enumerate(MODELS):
        man, lab, fac = [], [], []
        for pid, cat, inst, _sel, shares, earn in PROMPTS:
            skew = np.array(shares) ** (1.5 if m == 0 else 0.7)
            draws = rng.choice(len(GROUPS), size=IMAGES_PER_PROMPT, p=skew / skew.sum())
            for i, g in enumerate(draws):
                image_id = f"{model}-{pid}-{i:03d}"
                path = (C.IMAGES_DIR / model / f"{image_id}.png").as_posix()
                status = "failed" if (i == 9 and pid == "geo_b") else "ok"
                man.append({"image_id": image_id, "model": model, "backend": "tiny", "model_id": f"synthetic/{model}",
                            "model_revision": "0" * 7, "prompt_id": pid, "prompt": f"A person ({inst})", "seed": i,
                            "index": i, "width": 64, "height": 64, "sha256": f"{m}{i}{pid}", "path": path,
                            "status": status, "reason": "" if status == "ok" else "synthetic failure",
                            "created_at": "2026-01-01T00:00:00+00:00", "libraries": "{}", "stand_in": True})
                label = "unknown" if (i == 0 and pid == "occ_b") else GROUPS[g]
                lab.append({"image_id": image_id, "model": model, "prompt_id": pid, "label": label,
                            "status": "ok" if label != "unknown" else "failed",
                            "reason": "" if label != "unknown" else "unparseable", "raw_answer": label,
                            "backend": "tiny", "classifier_model_id": "synthetic/clf", "classifier_revision": "0",
                            "instruction_version": "v1", "from_cache": False, "stand_in": True})
                no_face = i == 1
                L = {"black": 33, "white": 68, "asian": 62, "hispanic": 55, "other": 58}[GROUPS[g]] + rng.normal(0, 6)
                if label == "black" and cat == "occupation":
                    L += 0.004 * (earn - 1000)  # a known positive earnings slope to recover
                a_, b_ = rng.normal(14, 3), rng.normal(18, 3)
                fac.append({"image_id": image_id, "model": model, "prompt_id": pid, "n_faces": 0 if no_face else 1,
                            "det_score": np.nan if no_face else 0.99, "bbox": None if no_face else "[8, 8, 56, 56]",
                            "skin_pixels": 0 if no_face else 900,
                            **(_empty_colour() if no_face else colour_columns(L, a_, b_)),
                            "status": "skipped" if no_face else "ok", "reason": "no face" if no_face else "",
                            "face_backend": "dlib", "skin_backend": "landmarks", "stand_in": True})
        img_dir = root / C.IMAGES_DIR / model
        img_dir.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(man).to_parquet(img_dir / "manifest.parquet", index=False)
        if labels:
            (root / C.LABELS_DIR).mkdir(parents=True, exist_ok=True)
            pd.DataFrame(lab).to_parquet(root / C.labels_path(model), index=False)
        if faces:
            (root / C.FACES_DIR).mkdir(parents=True, exist_ok=True)
            pd.DataFrame(fac).to_parquet(root / C.faces_path(model), index=False)
        if embeddings:
            emb = root / C.embeddings_dir(model)
            emb.mkdir(parents=True, exist_ok=True)
            n = len(man)
            clip = rng.normal(size=(n, 16)).astype(np.float32)
            face = rng.normal(size=(n - len(PROMPTS), 8)).astype(np.float32)
            np.save(emb / "clip.npy", clip / np.linalg.norm(clip, axis=1, keepdims=True))
            np.save(emb / "face.npy", face / np.linalg.norm(face, axis=1, keepdims=True))
            face_rows = np.full(n, -1)
            has_face = np.array([r["n_faces"] > 0 for r in fac])
            face_rows[has_face] = np.arange(has_face.sum())
            pd.DataFrame({"image_id": [r["image_id"] for r in man], "clip_row": np.arange(n),
                          "face_row": face_rows}).to_parquet(emb / "index.parquet", index=False)
    if reliability:
        rel = root / C.RELIABILITY_DIR
        rel.mkdir(parents=True, exist_ok=True)
        (rel / "summary.json").write_text(json.dumps({"status": "ok", "n_items": 20, "synthetic": True,
                                                      "cohen_kappa": {"human_human": 0.8, "human_classifier_mean": 0.7}}))
        pd.DataFrame({"pair": ["r1-r2", "r1-clf"], "kappa": [0.8, 0.7]}).to_csv(rel / "kappa.csv", index=False)
        cm = pd.DataFrame(np.eye(5, dtype=int) * 4, index=GROUPS, columns=GROUPS).rename_axis("human").reset_index()
        cm.to_csv(rel / "confusion_matrix.csv", index=False)
    return root


def analysis_config(seed: int = 1, classifier: dict | None = None, **analyze):
    """params.yaml validated with `analyze` overrides, the run seed and (optionally) classify.vlm fields:
    the config an analysis section reads its parameters from."""
    from biasaudit.config import read_yaml, validate

    from .conftest import ROOT

    raw = read_yaml(ROOT / "params.yaml")
    raw["analyze"] = {**raw["analyze"], **analyze}
    raw["seed"] = seed
    if classifier is not None:
        raw["classify"] = {**raw["classify"], "vlm": {**raw["classify"]["vlm"], **classifier}}
    return validate(raw)
