"""The analyze stage at paper scale: wall time of every section with its figures, as a ratio to one
read of the inputs; the within-prompt homogeneity gap against one pass over X; permutation memory.

Input: a SYNTHETIC paper-scale tree from a seeded generator (`write_paper_tree`, in the stage's
contract formats: prompts.csv, image manifests, labels, faces colour columns through the faces
stage's own describe_rgb, embeddings with their index, reliability outputs): 3 models × 150 prompts ×
100 images = 45,000 images, CLIP 1024-d and face 512-d float32 embeddings, 2% unlabelled images (the
classifier abstained: label 'unknown') and 5% without a face. Every number is made up.

Stage settings: params.yaml with the paper profile's analyze values (n_boot 2000, n_permutations 1000),
BLAS threads as the stage leaves them (the library default: every core), figures written as PNG and
SVG by the stage's OutputWriter, both as the notebook runs them: each section's files written by a
forked child (OutputWriter processes), the sections without figures computed by a forked child
(outputs.Elsewhere). After one untimed warm-up read (imports, page cache), repetitions
are interleaved (read, stage, read, stage, …) and the medians reported, with the load average: the
ratio stage / read is what carries across machines; the CPU seconds of the process per section
(every thread) are printed too: less sensitive to other jobs than wall time, but blind to the children
(a section computed elsewhere shows the wait for its value). `--compare DIR` checks every table against a
reports folder that the previous code's run_stage wrote from the same tree (max |Δ|).

Homogeneity alone (one model × CLIP, 15,000 × 1024): the within-prompt gap's point estimate (one pass
for the per-(prompt, group) sums, then the per-prompt totals) against one pass over X (X.sum(axis=0)),
interleaved, 41 times each, at 1 BLAS thread (threadpoolctl), with the 2% unlabelled rows; beside it
the stage's two labellings (race and L* bins) in one pass, and the same rows shuffled (the stage's
tree groups rows by prompt, which the blocked kernel profits from; labels are encoded outside the
timing); the peak memory of the permutation test beyond X (tracemalloc).

    python benchmarks/bench_analyze.py [--tree /tmp/biasaudit-paper-tree] [--reps 3] [--sections-only]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd

from biasaudit import contracts as C
from biasaudit.contracts import GROUPS

MODELS = ("paper-a", "paper-b", "paper-c")
PROMPTS_PER_CATEGORY, IMAGES_PER_PROMPT = 50, 100
CLIP_DIM, FACE_DIM = 1024, 512
UNLABELLED, NO_FACE = 0.02, 0.05
BASE = np.array([0.6, 0.12, 0.08, 0.15, 0.05])
L_MEAN = {"white": 68, "black": 33, "asian": 62, "hispanic": 55, "other": 58}


def write_paper_tree(root: Path, seed: int = 2026) -> Path:
    """The SYNTHETIC paper-scale input tree (see the module docstring), written once per seed."""
    from skimage.color import lab2rgb

    from biasaudit.faces.colour import describe_rgb
    from biasaudit.faces.stage import _empty_colour

    stamp = root / "SYNTHETIC-paper-scale.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("seed") == seed and \
            json.loads(stamp.read_text()).get("gender"):
        return root
    rng = np.random.default_rng(seed)
    rows = []
    for cat in ("occupation", "geography", "surname"):
        for k in range(PROMPTS_PER_CATEGORY):
            shares = rng.dirichlet(5 * BASE)
            rows.append({"prompt_id": f"{cat[:3]}_{k:03d}", "category": cat, "instance": f"{cat} {k}",
                         "selected_for": GROUPS[int(np.argmax(shares[1:])) + 1], "rank_in_group": 1,
                         "prompt": f"A person ({cat} {k}), synthetic", **dict(zip(GROUPS, shares)), "size": 100.0,
                         "median_weekly_earnings_usd": float(rng.uniform(600, 2200)) if cat == "occupation" else np.nan,
                         "template_version": "v1"})
    # apparent gender (the gender section): a BLS-like share of women per occupation, drawn after the rest
    women = rng.uniform(0.05, 0.95, len(rows))
    for row, w in zip(rows, women):
        row["pct_women"] = float(w) if row["category"] == "occupation" else np.nan
    prompts = pd.DataFrame(rows)
    (root / C.T2I).mkdir(parents=True, exist_ok=True)
    prompts.to_csv(root / C.PROMPTS_CSV, index=False)
    # a pool of skin colours per group through the faces stage's own describe_rgb (45,000 calls would take minutes)
    pool = {g: [describe_rgb(lab2rgb(np.array([L_MEAN[g] + rng.normal(0, 6), rng.normal(14, 3), rng.normal(18, 3)]),
                                     illuminant="D65", observer="2") * 255.0) for _ in range(60)] for g in GROUPS}
    P, m = len(prompts), IMAGES_PER_PROMPT
    for mi, model in enumerate(MODELS):
        skew = prompts[list(GROUPS)].to_numpy() ** (0.7 + 0.4 * mi)
        skew /= skew.sum(axis=1, keepdims=True)
        pid = np.repeat(prompts["prompt_id"].to_numpy(), m)
        index = np.tile(np.arange(m), P)
        true = np.array([rng.choice(5, size=m, p=row) for row in skew]).ravel()
        image_id = np.array([f"{model}-{p}-{i:03d}" for p, i in zip(pid, index)])
        n = len(image_id)
        img_dir = root / C.IMAGES_DIR / model
        img_dir.mkdir(parents=True, exist_ok=True)
        pd.DataFrame({"image_id": image_id, "model": model, "backend": "synthetic", "model_id": f"synthetic/{model}",
                      "model_revision": "0" * 7, "prompt_id": pid, "prompt": "synthetic", "seed": index, "index": index,
                      "width": 64, "height": 64, "sha256": image_id,
                      "path": [(C.IMAGES_DIR / model / f"{i}.png").as_posix() for i in image_id], "status": "ok",
                      "reason": "", "created_at": "2026-01-01T00:00:00+00:00", "libraries": "{}",
                      "stand_in": True}).to_parquet(img_dir / "manifest.parquet", index=False)
        unknown = rng.random(n) < UNLABELLED
        label = np.where(unknown, "unknown", np.array(GROUPS)[true])
        (root / C.LABELS_DIR).mkdir(parents=True, exist_ok=True)
        pd.DataFrame({"image_id": image_id, "model": model, "prompt_id": pid, "label": label,
                      "status": np.where(unknown, "failed", "ok"), "reason": np.where(unknown, "unparseable", ""),
                      "raw_answer": label, "backend": "synthetic", "classifier_model_id": "synthetic/clf",
                      "classifier_revision": "0", "instruction_version": "v1", "from_cache": False,
                      "stand_in": True,
                      "gender": np.where(rng.random(n) < np.repeat(np.nan_to_num(prompts["pct_women"].to_numpy(), nan=0.5),
                                                                      m) ** (0.8 + 0.3 * mi), "woman", "man"),
                      }).to_parquet(root / C.labels_path(model), index=False)
        has_face = rng.random(n) >= NO_FACE
        pick = rng.integers(0, 60, size=n)
        colour = [pool[GROUPS[t]][k] if f else _empty_colour() for t, k, f in zip(true, pick, has_face)]
        faces = pd.DataFrame(colour)
        faces.insert(0, "image_id", image_id)
        faces.insert(1, "model", model)
        faces.insert(2, "prompt_id", pid)
        faces = faces.assign(n_faces=has_face.astype(int), det_score=np.where(has_face, 0.99, np.nan),
                             bbox=np.where(has_face, "[8, 8, 56, 56]", None), skin_pixels=np.where(has_face, 900, 0),
                             status=np.where(has_face, "ok", "skipped"), reason=np.where(has_face, "", "no face"),
                             face_backend="dlib", skin_backend="landmarks", stand_in=True)
        (root / C.FACES_DIR).mkdir(parents=True, exist_ok=True)
        faces.to_parquet(root / C.faces_path(model), index=False)
        emb = root / C.embeddings_dir(model)
        emb.mkdir(parents=True, exist_ok=True)
        code = np.repeat(np.arange(P), m)
        for space, d, rows_used in (("clip", CLIP_DIM, np.ones(n, bool)), ("face", FACE_DIM, has_face)):
            centres = rng.normal(size=(P, d)).astype(np.float32)
            group_dir = rng.normal(size=(5, d)).astype(np.float32) * 0.3
            X = centres[code[rows_used]] + group_dir[true[rows_used]] + 1.5 * rng.normal(size=(int(rows_used.sum()), d)).astype(np.float32)
            np.save(emb / f"{space}.npy", (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32))
        face_rows = np.full(n, -1)
        face_rows[has_face] = np.arange(has_face.sum())
        pd.DataFrame({"image_id": image_id, "clip_row": np.arange(n), "face_row": face_rows}).to_parquet(
            emb / "index.parquet", index=False)
    rel = root / C.RELIABILITY_DIR
    rel.mkdir(parents=True, exist_ok=True)
    (rel / "summary.json").write_text(json.dumps({"status": "ok", "n_items": 300, "synthetic": True,
                                                  "cohen_kappa": {"human_human": 0.8, "human_classifier_mean": 0.7}}))
    pd.DataFrame({"pair": ["r1-r2", "r1-clf"], "kappa": [0.8, 0.7]}).to_csv(rel / "kappa.csv", index=False)
    cm = pd.DataFrame(np.eye(5, dtype=int) * 50 + 2, index=GROUPS, columns=GROUPS).rename_axis("human").reset_index()
    cm.to_csv(rel / "confusion_matrix.csv", index=False)
    stamp.write_text(json.dumps({"seed": seed, "models": MODELS, "images": len(MODELS) * P * m, "gender": True}))
    return root


def paper_config(sections: tuple[str, ...] = ("analyze.",)):
    """params.yaml with the paper profile's values of these sections (the keys profiles/paper.yaml sets)."""
    from biasaudit.config import read_yaml, validate

    raw = read_yaml(Path("params.yaml"))
    profile = read_yaml(Path("profiles/paper.yaml"))
    for key, value in profile.items():
        if key.startswith(sections):
            section, name = key.split(".", 1)
            raw[section][name] = value
    return validate(raw)


def read_once(tree: Path):
    from biasaudit.t2i.analysis.inputs import SPACES, load_embeddings, load_inputs

    cfg = paper_config()
    data = load_inputs(tree, cfg.generate.prompts_file, cfg.generate.images_dir, groups=cfg.groups)
    for model in data.models:
        for space in SPACES:
            load_embeddings(tree, model, space)
    return data


def run_stage(tree: Path, out: Path) -> dict[str, float]:
    """Every section of notebooks/t2i_analyze.py, in its order, with the OutputWriter: seconds per section."""
    from biasaudit.pipeline.outputs import Elsewhere, OutputWriter
    from biasaudit.t2i.analysis import ELSEWHERE, SECTIONS, inputs

    sections = {name: importlib.import_module(f"biasaudit.t2i.analysis.{name}") for name in SECTIONS}

    cfg = paper_config()
    np.random.seed(cfg.seed % 2**32)  # as the notebook's banner does (seaborn's strip jitter draws from it)
    t0, c0 = time.perf_counter(), time.process_time()
    data = inputs.load_inputs(tree, cfg.generate.prompts_file, cfg.generate.images_dir, groups=cfg.groups)
    writer = OutputWriter(out, dpi=cfg.analyze.figure_dpi, processes=inputs.cores())  # as the notebook's
    elsewhere = Elsewhere(tuple(sections[name].compute for name in ELSEWHERE), data, cfg)
    times = {"read tables": time.perf_counter() - t0}
    cpu = {"read tables": time.process_time() - c0}
    for name, mod in sections.items():
        t, c = time.perf_counter(), time.process_time()
        writer.add(elsewhere.result(mod.compute) if name in ELSEWHERE else mod.compute(data, cfg))
        times[name], cpu[name] = time.perf_counter() - t, time.process_time() - c
    t, c = time.perf_counter(), time.process_time()
    writer.finish(inputs.PLOTS, profile="paper", stand_in=True)
    times["finish"], cpu["finish"] = time.perf_counter() - t, time.process_time() - c
    times["total"], cpu["total"] = time.perf_counter() - t0, time.process_time() - c0
    return {**times, **{f"cpu {k}": v for k, v in cpu.items()}}


def homogeneity_alone(tree: Path, reps: int) -> dict[str, float]:
    from threadpoolctl import threadpool_limits

    from biasaudit.contracts import GROUPS  # the demo tree is the U.S. set's
    from biasaudit.stats import homogeneity as H
    from biasaudit.t2i.analysis.inputs import _embedding_meta, load_embeddings, load_inputs

    data = load_inputs(tree, groups=GROUPS)
    index, X = load_embeddings(tree, MODELS[0], "clip")
    meta = _embedding_meta(data, index, MODELS[0])
    prompts = meta["prompt_id"].to_numpy()
    race = meta["race"].astype(object).where(meta["race"].notna(), None).to_numpy()
    codes, cats = H._codes(race)

    pcodes, pnames = H._codes(prompts)
    bins = meta["L_bin"].astype(object).where(meta["L_bin"].notna(), None).to_numpy()
    bcodes, bcats = H._codes(bins)
    shuffle = np.random.default_rng(0).permutation(len(X))
    Xs, codes_s, pcodes_s = X[shuffle], codes[shuffle], pcodes[shuffle]

    def gap():  # the point estimate: one pass for the per-(prompt, group) sums, then P·G·d
        return H.within_prompt_totals_from_cells(*H.cell_sums(X, codes, pcodes, len(cats), len(pnames)))

    def gap_race_and_bins():  # what the stage does: both labellings' sums in one pass, then both totals
        cells = H.cell_sums_many(X, [codes, bcodes], pcodes, [len(cats), len(bcats)], len(pnames))
        return [H.within_prompt_totals_from_cells(*c) for c in cells]

    def gap_shuffled():  # the same rows in a random order (the stage's tree groups them by prompt)
        return H.within_prompt_totals_from_cells(*H.cell_sums(Xs, codes_s, pcodes_s, len(cats), len(pnames)))

    timed = {"gap": gap, "race + L* bins": gap_race_and_bins, "gap, rows shuffled": gap_shuffled,
             "one pass": lambda: X.sum(axis=0), "one pass, rows shuffled": lambda: Xs.sum(axis=0)}
    with threadpool_limits(1):
        for f in timed.values():
            f()
        t = {k: [] for k in timed}
        for _ in range(max(reps, 41)):  # milliseconds each: many interleaved repetitions
            for k, f in timed.items():
                s = time.perf_counter()
                f()
                t[k].append(time.perf_counter() - s)
    med = {k: statistics.median(v) for k, v in t.items()}
    blocks = H.prompt_blocks(X, prompts)
    tracemalloc.start()
    H.within_prompt_permutations(blocks, [(codes, len(cats)), (bcodes, len(bcats))], 1000, seed=0, stop_after=0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"X MB": X.nbytes / 1e6, "unlabelled share": float(np.mean([v is None for v in race])),
            "unlabelled L* bin share": float(np.mean([v is None for v in bins])),
            **{f"{k} ms (1 thread)": 1e3 * v for k, v in med.items()},
            "gap / one pass": med["gap"] / med["one pass"],
            "gap / one pass (fastest of each)": min(t["gap"]) / min(t["one pass"]),
            "race + L* bins in one pass / one pass (two gaps)": med["race + L* bins"] / med["one pass"],
            "gap / one pass, rows shuffled": med["gap, rows shuffled"] / med["one pass, rows shuffled"],
            "permutation peak / X (1000 permutations, race + L* bins)": peak / X.nbytes}


def compare_tables(new: Path, reference: Path) -> dict[str, object]:
    """Every table CSV of the stage's output against the same table from a reference run (the previous
    code on the same tree): max |Δ| over the numeric cells, and the cells of other columns that differ."""
    worst, other, missing = {}, 0, []
    for ref in sorted((reference / "tables").glob("*.csv")):
        path = new / "tables" / ref.name
        if not path.exists():
            missing.append(ref.stem)
            continue
        a, b = pd.read_csv(ref), pd.read_csv(path)
        if list(a.columns) != list(b.columns) or len(a) != len(b):
            missing.append(f"{ref.stem} (shape)")
            continue
        num = [c for c in a.columns if pd.api.types.is_numeric_dtype(a[c]) and pd.api.types.is_numeric_dtype(b[c])]
        if num:
            x, y = a[num].to_numpy(float), b[num].to_numpy(float)
            both = np.isfinite(x) & np.isfinite(y)
            other += int((np.isfinite(x) != np.isfinite(y)).sum())
            worst[ref.stem] = float(np.abs(x - y)[both].max()) if both.any() else 0.0
        rest = [c for c in a.columns if c not in num]
        if not rest:
            continue
        both_missing = a[rest].isna().to_numpy() & b[rest].isna().to_numpy()
        other += int(((a[rest].astype(str).to_numpy() != b[rest].astype(str).to_numpy()) & ~both_missing).sum())
    top = max(worst, key=worst.get) if worst else None
    return {"tables": len(worst), "max |Δ| numeric": max(worst.values()) if worst else None, "worst table": top,
            "non-numeric or NaN-pattern cells differing": other, "missing": missing}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=Path("/tmp/biasaudit-paper-tree"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--compare", type=Path, default=None,
                    help="a reports folder written by the previous code's run_stage on the same tree: max |Δ| per table")
    args = ap.parse_args()
    t = time.perf_counter()
    write_paper_tree(args.tree, args.seed)
    print(f"tree {args.tree} ({time.perf_counter() - t:.1f} s to write or check); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    read_once(args.tree)  # warm-up: imports and the page cache, so that every timed read is a plain read
    stage, read = [], []
    for r in range(args.reps):
        t = time.perf_counter()
        read_once(args.tree)
        read.append(time.perf_counter() - t)
        stage.append(run_stage(args.tree, args.tree / f"reports-{r}"))
        print(f"rep {r}: read {read[-1]:.2f} s, stage {stage[-1]['total']:.2f} s, load {os.getloadavg()[0]:.1f}",
              flush=True)
    med = {k: statistics.median(s[k] for s in stage) for k in stage[0]}
    print("\nsection seconds (median):", json.dumps({k: round(v, 2) for k, v in med.items() if not k.startswith("cpu")}))
    print("section CPU seconds of the process, every thread (median):",
          json.dumps({k[4:]: round(v, 2) for k, v in med.items() if k.startswith("cpu")}))
    print(f"stage {med['total']:.2f} s / read {statistics.median(read):.2f} s = "
          f"{med['total'] / statistics.median(read):.1f}× one read of the inputs")
    if args.compare is not None:
        print("tables against", args.compare, json.dumps(compare_tables(args.tree / "reports-0", args.compare)))
    print("homogeneity alone (one model × CLIP):", json.dumps({k: round(v, 3) for k, v in
                                                               homogeneity_alone(args.tree, args.reps).items()}))


if __name__ == "__main__":
    main()
