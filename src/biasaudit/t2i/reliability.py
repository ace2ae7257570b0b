"""Stage reliability: how far the race classifier can be trusted, against human raters.

1. `annotation_sheet`: a seeded random sample of labelled images → a CSV with image path, id and a
   blank `label` column, one copy per rater (the classifier's answer is not shown).
2. `read_sheets`: filled sheets back, labels checked against the allowed groups (strict parser).
3. Agreement: Cohen's κ for every rater pair (scikit-learn), Fleiss' κ overall and per group
   one-vs-rest (statsmodels), the human-vs-classifier confusion matrix and the disagreement
   breakdown, each with a percentile bootstrap CI over images.
4. With no human sheets (offline profile), `simulate_raters` draws SIMULATED raters through a known
   confusion matrix (their declared accuracies) from the PLANTED labels when the images are planted,
   else from the classifier labels; every output says so.
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.metrics import cohen_kappa_score
from statsmodels.stats.inter_rater import aggregate_raters, fleiss_kappa

from biasaudit import contracts as C
from biasaudit.backends.vlm.parse import parse_choice

CLASSIFIER = "classifier"


# --- sheets ------------------------------------------------------------------------------------------

def annotation_sheet(labels: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    """Seeded sample of images the classifier labelled (status ok) → sheet rows, blank `label`."""
    pool = labels[labels["status"] == "ok"].sort_values("image_id")
    sample = pool.sample(n=min(n, len(pool)), random_state=seed)
    return pd.DataFrame({"item": range(1, len(sample) + 1), "image_id": sample["image_id"].to_numpy(),
                         "model": sample["model"].to_numpy(), "path": sample["path"].to_numpy(),
                         "label": ""})


def read_sheets(sheets: dict[str, str | Path], groups: tuple[str, ...]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Filled sheets {rater: csv} → (wide table image_id × rater, problems table).

    Labels go through the strict parser (so 'Hispanic/Latino' or 'Caucasian' are accepted); a blank
    or invalid label is left missing and listed in the problems table with its reason."""
    wide, problems = None, []
    for rater, path in sheets.items():
        sheet = pd.read_csv(path, dtype=str, keep_default_na=False)
        for col in ("image_id", "label"):
            if col not in sheet:
                raise ValueError(f"{path}: column '{col}' missing")
        parsed = []
        for image_id, text in zip(sheet["image_id"], sheet["label"]):
            label, reason = parse_choice(text, groups)
            if label is None:
                problems.append({"rater": rater, "image_id": image_id, "answer": text, "reason": reason})
            parsed.append(label)
        col = pd.Series(parsed, index=sheet["image_id"], name=rater)
        if col.index.duplicated().any():
            raise ValueError(f"{path}: duplicate image_id rows")
        wide = col.to_frame() if wide is None else wide.join(col, how="outer")
    return wide, pd.DataFrame(problems, columns=["rater", "image_id", "answer", "reason"])


def simulated_confusion(groups: tuple[str, ...], accuracy: float, group_accuracy: dict[str, float]) -> pd.DataFrame:
    """P(rater says column | classifier said row): `accuracy` on the diagonal (or the group's own),
    the rest spread evenly over the other groups."""
    k = len(groups)
    M = np.zeros((k, k))
    for i, g in enumerate(groups):
        acc = group_accuracy.get(g, accuracy)
        M[i] = (1 - acc) / (k - 1)
        M[i, i] = acc
    return pd.DataFrame(M, index=list(groups), columns=list(groups))


def simulate_raters(classifier_labels: pd.Series, confusion: pd.DataFrame, raters: list[str], seed: int) -> pd.DataFrame:
    """SIMULATED raters: each rater's label drawn from confusion.loc[classifier label] (seeded)."""
    rng = np.random.default_rng(seed)
    groups = list(confusion.columns)
    P = confusion.loc[classifier_labels.to_numpy()].to_numpy()
    cum = P.cumsum(axis=1)
    out = {}
    for r in raters:
        u = rng.random(len(P))[:, None]
        out[r] = np.array(groups)[np.minimum((u > cum).sum(axis=1), len(groups) - 1)]
    return pd.DataFrame(out, index=classifier_labels.index)


# --- agreement statistics ------------------------------------------------------------------------------

def cohen_kappa(a: np.ndarray, b: np.ndarray, categories: list[str]) -> float:
    return float(cohen_kappa_score(a, b, labels=categories))


def fleiss(ratings: np.ndarray, categories: list[str]) -> float:
    """Fleiss' κ of an items × raters array of category labels (statsmodels).

    A label outside `categories` is an error (searchsorted would silently code it as a neighbour)."""
    ratings = np.asarray(ratings)
    outside = sorted(set(np.unique(ratings).tolist()) - set(categories), key=str)
    if outside:
        raise ValueError(f"labels {outside} are not among the categories {sorted(categories)}")
    codes = np.searchsorted(np.array(sorted(categories)), ratings)
    table, _ = aggregate_raters(codes, n_cat=len(categories))
    return float(fleiss_kappa(table, method="fleiss"))


def fleiss_one_vs_rest(ratings: np.ndarray, group: str) -> float:
    """Fleiss' κ for 'group' vs every other label (binary), as the paper's per-group κ."""
    binary = np.where(ratings == group, group, "rest")
    return fleiss(binary, [group, "rest"])


def disagreement_breakdown(ratings: pd.DataFrame, groups: tuple[str, ...]) -> pd.DataFrame:
    """For each group g: of the rater-pair disagreements in which one side says g, the share in which
    the other side says h (e.g. 59% of Hispanic disagreements are against White)."""
    arr = ratings.to_numpy()
    counts = pd.DataFrame(0, index=list(groups), columns=list(groups), dtype=float)
    for i, j in combinations(range(arr.shape[1]), 2):
        a, b = arr[:, i], arr[:, j]
        for x, y in zip(a[a != b], b[a != b]):
            if x in counts.index and y in counts.columns:
                counts.loc[x, y] += 1
                counts.loc[y, x] += 1
    totals = counts.sum(axis=1)
    shares = counts.div(totals.where(totals > 0), axis=0)
    shares["n_disagreements"] = totals.astype(int)
    return shares


def _item_interval(stat, n_items: int, n_boot: int, seed: int, level: float,
                   method: str = "percentile") -> tuple[float, float]:
    """Bootstrap CI over images through the resampling engine (biasaudit.stats.resample): a replicate's
    multiplicities become an index of repeated items; a replicate where κ is undefined is excluded."""
    from biasaudit.stats.resample import resample

    def weights_stat(w: np.ndarray) -> np.ndarray:
        out = np.full(len(w), np.nan)
        for b, row in enumerate(w):
            idx = np.repeat(np.arange(n_items), row.astype(int))
            with np.errstate(all="ignore"):
                try:
                    out[b] = stat(idx)
                except (ValueError, ZeroDivisionError):
                    pass
        return out

    if n_items == 0 or n_boot <= 0:
        return float("nan"), float("nan")
    iv = resample(weights_stat, n_items, n_boot=n_boot, level=level, seed=seed, method=method)[0]
    return iv.low, iv.high


def agreement(ratings: pd.DataFrame, humans: list[str], groups: tuple[str, ...],
              n_boot: int = 1000, ci: float = 0.95, seed: int = 0) -> dict[str, pd.DataFrame]:
    """All reliability tables from an items × raters frame (humans + optional 'classifier' column).

    Items where any rater's label is missing are dropped (counted in `summary`). Categories are the
    groups plus 'unknown' when the classifier abstained."""
    raters = [c for c in ratings.columns if c in humans or c == CLASSIFIER]
    complete = ratings[raters].dropna()
    arr = complete.to_numpy(dtype=object).astype(str)
    n = len(arr)
    categories = sorted(set(groups) | set(np.unique(arr)))
    col = {r: i for i, r in enumerate(raters)}

    pairs = []
    for a, b in combinations(raters, 2):
        kind = "human-classifier" if CLASSIFIER in (a, b) else "human-human"
        i, j = col[a], col[b]
        k = cohen_kappa(arr[:, i], arr[:, j], categories)
        lo, hi = _item_interval(lambda idx, i=i, j=j: cohen_kappa(arr[idx, i], arr[idx, j], categories), n, n_boot,
                                seed, ci)
        agree = float((arr[:, i] == arr[:, j]).mean()) if n else float("nan")
        pairs.append({"rater_a": a, "rater_b": b, "kind": kind, "n": n, "agreement": agree, "cohen_kappa": k,
                      "ci_low": lo, "ci_high": hi})
    pairs = pd.DataFrame(pairs)
    means = pairs.groupby("kind")["cohen_kappa"].mean().rename("mean_cohen_kappa").reset_index() if len(pairs) else pd.DataFrame()

    fleiss_rows = []
    all_groups = [("overall", None), *[(g, g) for g in groups]]
    for name, g in all_groups:
        for subset_name, cols in (("humans", [col[h] for h in humans if h in col]), ("all", list(range(len(raters))))):
            if len(cols) < 2:
                continue
            sub = arr[:, cols]
            if g is None:
                f = lambda idx, s=sub: fleiss(s[idx], categories)  # noqa: E731
            else:
                f = lambda idx, s=sub, g=g: fleiss_one_vs_rest(s[idx], g)  # noqa: E731
            with np.errstate(all="ignore"):
                est = f(np.arange(n)) if n else float("nan")
            lo, hi = _item_interval(f, n, n_boot, seed, ci)
            fleiss_rows.append({"group": name, "raters": subset_name, "n": n, "prevalence": float((sub == g).mean()) if g else 1.0,
                                "fleiss_kappa": est, "ci_low": lo, "ci_high": hi})
    fleiss_table = pd.DataFrame(fleiss_rows)

    confusion = pd.DataFrame()
    if CLASSIFIER in col:
        human_labels = np.concatenate([arr[:, col[h]] for h in humans if h in col])
        clf_labels = np.tile(arr[:, col[CLASSIFIER]], sum(h in col for h in humans))
        confusion = pd.crosstab(pd.Series(human_labels, name="human"), pd.Series(clf_labels, name="classifier"))
        confusion = confusion.reindex(index=categories, columns=categories, fill_value=0)

    breakdown = disagreement_breakdown(complete[raters].astype(str), tuple(groups))
    summary = pd.DataFrame([{"items": len(ratings), "complete_items": n, "dropped_incomplete": len(ratings) - n,
                             "raters": ", ".join(raters)}])
    return {"pairwise_kappa": pairs, "mean_kappa": means, "fleiss_kappa": fleiss_table,
            "confusion": confusion, "disagreements": breakdown, "summary": summary}


# --- stage helpers ------------------------------------------------------------------------------------

def load_inputs(models: list[str], images_dir: str | Path, prompts_file: str | Path, groups: tuple[str, ...],
                root: str | Path = ".") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Labels of every generator that has them (with image paths) and the per-prompt benchmark of `groups` (the
    active set's labels); `images_dir` and `prompts_file` are generate.images_dir and generate.prompts_file."""
    root = Path(root)
    frames = []
    for m in models:
        path = root / C.labels_path(m)
        manifest = root / C.manifest_path(images_dir, m)
        if not path.exists() or not manifest.exists():
            continue
        lab = pd.read_parquet(path)
        paths = pd.read_parquet(manifest)
        paths = paths[[c for c in ("image_id", "path", "planted_label") if c in paths]]
        frames.append(lab.merge(paths, on="image_id", how="left"))
    if not frames:
        raise FileNotFoundError(f"no labels under {root / C.LABELS_DIR} for models {models}")
    prompts = pd.read_csv(root / prompts_file)
    bench = prompts.set_index("prompt_id")[list(groups)]
    return pd.concat(frames, ignore_index=True), bench


def simulation_basis(sheet: pd.DataFrame, labels: pd.DataFrame, clf: pd.Series,
                     groups: tuple[str, ...]) -> tuple[pd.Series, str]:
    """What SIMULATED raters look at: the PLANTED label where every sampled image has one (planted
    generator), so they act as raters of known accuracy against the truth; else the classifier's label."""
    if "planted_label" in labels:
        planted = labels.drop_duplicates("image_id").set_index("image_id").loc[sheet["image_id"], "planted_label"]
        if planted.notna().all() and planted.isin(groups).all():
            return planted.rename(CLASSIFIER), "PLANTED labels"
    return clf[clf.isin(groups)], "classifier's labels"


def collect_ratings(sheet: pd.DataFrame, labels: pd.DataFrame, params, seed: int,
                    groups: tuple[str, ...]) -> tuple[pd.DataFrame, dict]:
    """items × (raters + classifier) over `groups`: filled human sheets, or SIMULATED raters when params.simulate."""
    clf = labels.set_index("image_id").loc[sheet["image_id"], "label"].rename(CLASSIFIER)
    if params.simulate:
        conf = simulated_confusion(groups, params.sim_accuracy, dict(params.sim_group_accuracy))
        truth, basis = simulation_basis(sheet, labels, clf, groups)
        sim = simulate_raters(truth, conf, list(params.raters), seed)
        ratings = sim.join(clf, how="right")
        note = (f"SIMULATED raters {list(params.raters)}: drawn from the {basis} with accuracy "
                f"{params.sim_accuracy} ({dict(params.sim_group_accuracy)} per group); no human judged these images")
        return ratings, {"source": "simulated", "note": note, "confusion": conf.round(4).to_dict()}
    sheets = {r: Path(params.sheets_dir) / f"{r}.csv" for r in params.raters}
    missing = [str(p) for p in sheets.values() if not p.exists()]
    if missing:
        raise FileNotFoundError(f"filled annotation sheets missing: {missing}: copy "
                                f"{Path(params.sheets_dir) / 'annotation_sheet.csv'} once per rater, fill its label "
                                "column (docs/raters.md), and run again (or set reliability.simulate: true)")
    wide, problems = read_sheets(sheets, groups)
    ratings = wide.join(clf, how="inner")
    note = f"human raters {list(params.raters)}: {len(ratings)} images, {len(problems)} blank/invalid labels"
    return ratings, {"source": "human", "note": note, "problems": problems.to_dict("records")}


def ratings_table(ratings: pd.DataFrame) -> pd.DataFrame:
    """Items × (raters + classifier) with `image_id` as a column: the analysis stage bootstraps these
    *images* (each with all its labels) when it corrects TVD for classifier error."""
    return ratings.rename_axis("image_id").reset_index()


def correction_diagnostics(ratings: pd.DataFrame, humans: list[str], method: str, groups: tuple[str, ...],
                           max_condition: float | None = None, reference: str = "consensus") -> dict:
    """The estimated confusion matrix M[human, classifier] and whether it can be inverted.

    The corrected TVD itself is computed once, by the analysis stage (t2i.analysis.corrected_tvd),
    with this same `correction_method` and `reference` (stats.correction.reference_labels), both
    recorded here for it."""
    from biasaudit.stats.correction import (
        MAX_CONDITION,
        identifiability,
        image_confusions,
        matrix_from_counts,
        reference_labels,
    )

    humans = [h for h in humans if h in ratings]
    sub = ratings[ratings[CLASSIFIER].isin(groups)] if CLASSIFIER in ratings else ratings.iloc[:0]
    labels = reference_labels([[v for v in row if isinstance(v, str) and v in groups]
                               for row in sub[humans].to_numpy(object)], reference)
    E = image_confusions(labels, list(sub[CLASSIFIER]) if len(sub) else [], groups)
    M = matrix_from_counts(E.sum(axis=0), len(groups))
    cond, ok, reason = identifiability(M, max_condition or MAX_CONDITION)
    return {"correction_method": method, "confusion_reference": reference, "n_annotated_images": int(len(sub)),
            "n_reference_images": int(sum(1 for lab in labels if lab)),
            "condition_number": cond if np.isfinite(cond) else None,
            "identifiable": ok, "reason": reason,
            "misclassification_matrix": pd.DataFrame(M, index=list(groups), columns=list(groups)).round(6).to_dict()}


def summary_json(tables: dict[str, pd.DataFrame], correction: dict, provenance: dict,
                 labels: pd.DataFrame) -> dict:
    pairs, fl = tables["pairwise_kappa"], tables["fleiss_kappa"]
    mean = dict(zip(tables["mean_kappa"]["kind"], tables["mean_kappa"]["mean_cohen_kappa"])) if len(tables["mean_kappa"]) else {}
    overall = fl[(fl["group"] == "overall") & (fl["raters"] == "all")]
    return {"raters_source": provenance["source"], "note": provenance["note"],
            "stand_in": bool(labels["stand_in"].any()) if "stand_in" in labels else None,
            "n_items": int(tables["summary"]["complete_items"].iloc[0]),
            "mean_kappa_human_human": mean.get("human-human"), "mean_kappa_human_classifier": mean.get("human-classifier"),
            "fleiss_kappa_overall": float(overall["fleiss_kappa"].iloc[0]) if len(overall) else None,
            "fleiss_kappa_per_group": {r.group: r.fleiss_kappa for r in fl[(fl.raters == "all") & (fl.group != "overall")].itertuples()},
            "pairwise": pairs.to_dict("records"),
            "correction": correction, "correction_method": correction.get("correction_method"),
            "simulated_confusion": provenance.get("confusion")}


def write_outputs(out_dir: Path, tables: dict[str, pd.DataFrame], ratings: pd.DataFrame, correction: dict,
                  provenance: dict, labels: pd.DataFrame, tag: str, run: dict) -> list[Path]:
    """The stage's files under out_dir: each agreement table and ratings.csv (every row tagged `raters_source`),
    and summary.json (summary_json, with the run's provenance)."""
    from biasaudit.pipeline.io import atomic_write_json, atomic_write_table

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, df in tables.items():
        df = df.copy()
        df["raters_source"] = tag
        written.append(atomic_write_table(df.reset_index() if name in ("confusion", "disagreements") else df,
                                          out_dir / f"{name}.csv"))
    written.append(atomic_write_table(ratings_table(ratings).assign(raters_source=tag), out_dir / "ratings.csv"))
    summary = summary_json(tables, correction, provenance, labels)
    atomic_write_json(out_dir / "summary.json", summary | {"run": run})
    return [*written, out_dir / "summary.json"]

