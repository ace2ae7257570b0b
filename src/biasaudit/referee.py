"""The referee run's PLANTED world: the papers' published numbers, planted at the papers' design, so that the
replication table can be checked against a known truth (`make referee`, docs/referee.md).

Every planted quantity is read from a row of data/reference/published/ (`load_published`): each row's
`statistic` names a PLANTER that turns the row's target (value, relation, model, category, group, subset)
into a constraint or a setting of the planted world. A row added to the published CSVs with a statistic
that has a planter is planted by adding data; a row whose statistic has none is listed by `unplanted`
with the reason, and the replication table's referee check names it.

Method A (no pixels: rendering 45,000 images adds nothing a row checks): for each of the three planted
"generators" (named as the paper's) and each prompt of the prompts stage, the classifier's label counts
are planted as round(N · q_p) with q_p = softmax(log b_p + θ[model, category]), b_p the prompt's benchmark
shares; θ is solved (`solve_representation`) so that the mean per-prompt TVD, the mean deviations, the
label counts and the per-prompt TVD bounds of the rows hold. Each face's L* is planted per model × label
at exact quantiles of a normal whose mean is the row's (L_mean), so the sample mean is the target.
The tables are written as the generate, classify and faces stages write them (same columns), every row
labelled PLANTED (`backend` referee-planted, `stand_in` true). Nothing here is a model.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from biasaudit import contracts as C

PLANTED = "PLANTED"
BACKEND = "referee-planted"
PROFILE = "referee"
DIRECTION_MARGIN = 0.05   # a claimed sign is planted this far beyond its bound (share units)
TVD_BOUND_MARGIN = 0.04   # a claimed per-prompt TVD bound is planted this far below it
DEFAULT_L = {"white": (66.0, 5.0), "black": (40.0, 8.0), "asian": (62.0, 5.0), "hispanic": (56.0, 5.0),
             "other": (52.0, 5.0)}  # L* (mean, sd) of a label no row names (our choice, docs/referee.md)
L_RANGE = (15.0, 85.0)


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def subset_of(text: str) -> dict[str, str]:
    out = {}
    for part in str(text or "").split(";"):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


# ------------------------------------------------------------------------------ the world

@dataclass
class World:
    """What the planters set: the models, the representation constraints, L* per model × label."""

    models: list[str]
    groups: tuple[str, ...]
    images_per_prompt: int
    constraints: list[dict[str, Any]] = field(default_factory=list)  # representation rows (see solve_representation)
    L: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)  # (model, label) → (mean, sd)
    planted: dict[str, str] = field(default_factory=dict)    # row id → what was planted
    unplanted: dict[str, str] = field(default_factory=dict)  # row id → why not


def _models_of(row: Mapping[str, Any], world: World) -> list[str]:
    m = str(row["run_model"])
    return list(world.models) if m == "*" else [m]


def _constraint(kind: str) -> Callable[[World, Mapping[str, Any]], str]:
    def plant(world: World, row: Mapping[str, Any]) -> str:
        for m in _models_of(row, world):
            world.constraints.append({"kind": kind, "model": m, "row": dict(row)})
        return f"representation constraint {kind} ({row['relation']} {row['value']})"
    return plant


def plant_L_mean(world: World, row: Mapping[str, Any]) -> str:
    for m in _models_of(row, world):
        sd = world.L.get((m, row["group"]), DEFAULT_L.get(str(row["group"]), (50.0, 5.0)))[1]
        world.L[(m, str(row["group"]))] = (_num(row["value"]), sd)
    return f"L* of {row['group']} faces: exact normal quantiles, mean {row['value']}"


def plant_dark_share(world: World, row: Mapping[str, Any]) -> str:
    """Most faces below the threshold are `group`: every other label's L* distribution keeps 4 sd above it."""
    below = _num(subset_of(row["subset"]).get("L_below"))
    for m in _models_of(row, world):
        for g in world.groups:
            if g == row["group"]:
                continue
            mean, sd = world.L.get((m, g), DEFAULT_L.get(g, (60.0, 5.0)))
            world.L[(m, g)] = (max(mean, below + 4 * sd), sd)
    return f"other labels' L* at least 4 sd above {below:g}"


def design_setting(what: str) -> Callable[[World, Mapping[str, Any]], str]:
    def plant(world: World, row: Mapping[str, Any]) -> str:
        return f"design: {what}"
    return plant


def plant_no_slope(world: World, row: Mapping[str, Any]) -> str:
    return "L* drawn independently of earnings (no slope planted)"


PLANTERS: dict[str, Callable[[World, Mapping[str, Any]], str]] = {
    "mean_tvd": _constraint("mean_tvd"), "mean_deviation": _constraint("mean_deviation"),
    "n_classified": _constraint("n_classified"), "prompt_tvd_max": _constraint("prompt_tvd_max"),
    "share_reaching": _constraint("share_reaching"),
    "L_mean": plant_L_mean, "dark_share": plant_dark_share, "earnings_slope_p": plant_no_slope,
    "n_prompts": design_setting("prompts.top_k (profiles/referee.yaml)"),
    "n_prompts_per_category": design_setting("prompts.top_k (profiles/referee.yaml)"),
    "images_per_prompt": design_setting("generate.images_per_prompt"),
    "n_models": design_setting("models: (profiles/referee.yaml)"),
    "n_categories": design_setting("prompts.categories"),
    "threshold_share": design_setting("analyze.threshold_share"),
    "n_labels": design_setting("the group set's labels"), "det_threshold": design_setting("faces.det_threshold"),
}


# statistics no planted model can set: the row reads reference data or a constant of the method
UNPLANTABLE: dict[str, str] = {
    "benchmark_share": "reads the reference data (data/reference/bls), not a model: the run shows the table's value",
    "parsing_classes": "a constant of the parsing network (faces/bisenet.py N_CLASSES), not a run output",
    "two_afc_images": "fixed by the task design (biasaudit.vlm.tasks), not a run output",
}
CANNOT_PLANT = "cannot be planted"


def plant_world(published: pd.DataFrame, models: list[str], groups: tuple[str, ...], images_per_prompt: int,
                method: str = "A") -> World:
    """The planted world of `method`'s rows: each row through its statistic's planter (in id order; the
    L* planters after the others so that a row's mean is kept)."""
    world = World(list(models), tuple(groups), int(images_per_prompt))
    rows = published[published["method"] == method].to_dict("records")
    rows.sort(key=lambda r: (r["statistic"] == "L_mean", r["id"]))  # dark_share first, then the rows' means
    for row in rows:
        planter = PLANTERS.get(str(row["statistic"]))
        if str(row["statistic"]) in UNPLANTABLE:
            world.unplanted[str(row["id"])] = f"{CANNOT_PLANT}: {UNPLANTABLE[str(row['statistic'])]}"
            continue
        if planter is None:
            world.unplanted[str(row["id"])] = f"no planter for the statistic {row['statistic']} (biasaudit.referee.PLANTERS)"
            continue
        if str(row["run_model"]) not in ("*", *models):
            world.unplanted[str(row["id"])] = f"the run has no model {row['run_model']}"
            continue
        world.planted[str(row["id"])] = planter(world, row)
    return world


# ------------------------------------------------------------------------------ representation

def _softmax_shares(bench: np.ndarray, theta: np.ndarray) -> np.ndarray:
    z = np.log(np.clip(bench, 1e-6, None)) + theta
    z -= z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def _threshold(published: pd.DataFrame, group: str) -> float:
    rows = published[(published["statistic"] == "threshold_share") & (published["group"] == group)]
    return _num(rows["value"].iloc[0]) if len(rows) else math.nan


@dataclass
class Representation:
    prompts: pd.DataFrame     # prompt_id, category, instance, benchmark columns
    theta: dict[tuple[str, ...], np.ndarray]  # (model, category, selected_for) → log weights of the groups
    shares: dict[str, np.ndarray]             # model → planted shares (prompt × group), continuous
    counts: dict[str, np.ndarray]             # model → planted label counts (prompt × group), integers
    residual: float


def largest_remainder(q: np.ndarray, n: int) -> np.ndarray:
    """Integer counts per row summing to n, closest to n·q (largest remainder)."""
    raw = q * n
    base = np.floor(raw).astype(int)
    short = n - base.sum(axis=1)
    order = np.argsort(-(raw - base), axis=1, kind="stable")
    for i, k in enumerate(short):
        base[i, order[i, :k]] += 1
    return base


def exact_total(counts: np.ndarray, shares: np.ndarray, g: int, total: int, n: int) -> None:
    """Move single images into or out of group g (from or to each prompt's largest other group), in the
    prompts whose rounding lost or gained the most, until group g counts `total` images (in place)."""
    gap = total - int(counts[:, g].sum())
    lost = shares[:, g] * n - counts[:, g]  # > 0 where rounding took images away from g
    for i in np.argsort(-lost if gap > 0 else lost, kind="stable")[:abs(gap)]:
        other = counts[i].copy()
        other[g] = -1
        j = int(np.argmax(other))
        step = 1 if gap > 0 else -1
        if counts[i, g] + step < 0:
            continue
        counts[i, g] += step
        counts[i, j] -= step


def solve_representation(world: World, prompts: pd.DataFrame, published: pd.DataFrame) -> Representation:
    """θ[model, category, selected_for] (log weights of the groups, the first group's 0) solving the
    representation constraints in least squares, with hinges for the claimed bounds and a small ridge (the
    least distortion that meets the rows). One θ per cell of prompts selected for one group, so that a
    category can be distorted while the prompts a row names stay near their benchmark. Solved by L-BFGS on
    torch's exact gradient (the one place torch serves here: 180 parameters, no finite differences)."""
    import torch

    groups, models = world.groups, world.models
    cells = list(dict.fromkeys(zip(prompts["category"], prompts["selected_for"])))
    cell_idx = np.array([cells.index(c) for c in zip(prompts["category"], prompts["selected_for"])])
    bench = prompts[list(groups)].to_numpy(float)
    bench = bench / bench.sum(axis=1, keepdims=True)
    n_free = len(groups) - 1
    N = world.images_per_prompt
    size = len(cells) * n_free

    def rows_of(cat: str) -> np.ndarray:
        return np.ones(len(prompts), bool) if cat in ("all", "") else (prompts["category"] == cat).to_numpy()

    terms = []  # (model index, kind, selection, group index, target, relation)
    for c in world.constraints:
        row = c["row"]
        mi, t, rel = models.index(c["model"]), _num(row["value"]), str(row["relation"])
        g = groups.index(str(row["group"])) if str(row["group"]) in groups else -1
        sel = rows_of(str(row["category"]))
        if c["kind"] == "prompt_tvd_max":
            inst = subset_of(row["subset"]).get("instance", "").lower()
            sel = sel & (prompts["instance"].astype(str).str.lower() == inst).to_numpy()
        elif c["kind"] == "share_reaching":
            sel = bench[:, g] > _threshold(published, str(row["group"]))
        terms.append((mi, c["kind"], sel, g, t, rel))

    tb = torch.tensor(bench, dtype=torch.float64)
    logb = torch.log(tb.clamp_min(1e-6))
    cix = torch.tensor(cell_idx)
    tsel = [(mi, kind, torch.tensor(sel), g, t, rel) for mi, kind, sel, g, t, rel in terms]

    def shares_t(x: Any, mi: int) -> Any:
        th = torch.cat([torch.zeros(len(cells), 1, dtype=x.dtype), x[mi * size:(mi + 1) * size].reshape(len(cells), n_free)], 1)
        return torch.softmax(logb + th[cix], dim=1)

    def hinge(v: Any, bound: float, rel: str) -> Any:
        return torch.relu(v - bound) if rel == "<" else torch.relu(bound - v)

    def loss(x: Any) -> Any:
        q = [shares_t(x, i) for i in range(len(models))]
        out = [0.02 * x]
        for mi, kind, sel, g, t, rel in tsel:
            p = q[mi]
            if kind == "mean_tvd":
                out.append(((0.5 * (p[sel] - tb[sel]).abs().sum(1).mean() - t) / 0.003).reshape(1))
            elif kind == "mean_deviation":
                v = (p[sel, g] - tb[sel, g]).mean()
                r = (v - t) if rel == "=" else hinge(v, t - DIRECTION_MARGIN if rel == "<" else t + DIRECTION_MARGIN, rel)
                out.append((r / 0.003).reshape(1))
            elif kind == "n_classified":
                out.append(((N * p[:, g].sum() - t) / 3.0).reshape(1))
            elif kind == "prompt_tvd_max":
                v = 0.5 * (p[sel] - tb[sel]).abs().sum(1)
                out.append(hinge(v, t - TVD_BOUND_MARGIN if rel == "<" else t + TVD_BOUND_MARGIN, rel) / 0.003)
            elif kind == "share_reaching":
                # 0: every prompt above the threshold planted at most 60% of its benchmark share; 1: at least 140%
                out.append(torch.relu(p[sel, g] - 0.6 * tb[sel, g]) / 0.003 if t == 0 else
                           torch.relu(1.4 * tb[sel, g] - p[sel, g]) / 0.003)
        return torch.cat(out)

    x = torch.zeros(len(models) * size, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([x], lr=1.0, max_iter=400, tolerance_grad=1e-10, tolerance_change=1e-14,
                            history_size=50, line_search_fn="strong_wolfe")

    def closure() -> Any:
        opt.zero_grad()
        value = (loss(x) ** 2).sum()
        value.backward()
        return value

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 180 parameters: threads only add overhead
    try:
        for _ in range(3):
            opt.step(closure)
    finally:
        torch.set_num_threads(threads)
    xs = x.detach()
    residual = float((loss(xs) ** 2).sum())

    def shares(xv: Any, mi: int) -> np.ndarray:
        return shares_t(torch.as_tensor(xv), mi).numpy()

    planted = {m: shares(xs, i) for i, m in enumerate(models)}
    counts = {m: largest_remainder(s, N) for m, s in planted.items()}
    for mi, kind, _sel, g, t, _rel in terms:  # a planted count is exact: rounding per prompt moved it
        if kind == "n_classified":
            exact_total(counts[models[mi]], planted[models[mi]], g, int(round(t)), N)
    theta = {(m, *cell): np.r_[0.0, xs.numpy()[i * size:(i + 1) * size].reshape(len(cells), n_free)[j]]
             for i, m in enumerate(models) for j, cell in enumerate(cells)}
    return Representation(prompts, theta, planted, counts, residual)


# ------------------------------------------------------------------------------ the tables

def _normal_quantiles(n: int, mean: float, sd: float) -> np.ndarray:
    from scipy.stats import norm

    if n == 0:
        return np.zeros(0)
    x = norm.ppf((np.arange(n) + 0.5) / n)
    x = x - x.mean()
    return np.clip(mean + sd * x, *L_RANGE)


def planted_tables(world: World, rep: Representation, seed: int) -> dict[str, dict[str, pd.DataFrame]]:
    """Per model: the generate manifest, the classifier's labels and the faces table (L*, C*, hue, L bin)."""
    from biasaudit.faces.colour import ita_degrees
    from biasaudit.pipeline.provenance import derive_seed

    out: dict[str, dict[str, pd.DataFrame]] = {}
    prompts = rep.prompts
    for m in world.models:
        rng = np.random.default_rng(derive_seed(seed, "referee", m))
        rows = []
        for (pid, prompt), cnt, q in zip(prompts[["prompt_id", "prompt"]].itertuples(index=False, name=None),
                                         rep.counts[m], rep.shares[m]):
            labels = np.repeat(np.asarray(world.groups, dtype=object), cnt)
            rng.shuffle(labels)
            for i, lab in enumerate(labels):
                rows.append((f"{m}-{pid}-{i:03d}", pid, prompt, i, lab, q))
        df = pd.DataFrame(rows, columns=["image_id", "prompt_id", "prompt", "index", "label", "q"])
        df["L"] = np.nan
        for g in world.groups:
            sel = (df["label"] == g).to_numpy()
            mean, sd = world.L.get((m, g), DEFAULT_L.get(g, (55.0, 5.0)))
            vals = _normal_quantiles(int(sel.sum()), mean, sd)
            df.loc[sel, "L"] = rng.permutation(vals)
        hue = 55.0 + rng.normal(0.0, 3.0, len(df))
        chroma = 18.0 + rng.normal(0.0, 2.0, len(df))
        a, b = chroma * np.cos(np.radians(hue)), chroma * np.sin(np.radians(hue))
        common = {"model": m, "stand_in": True}
        manifest = pd.DataFrame({
            "image_id": df["image_id"], **common, "backend": BACKEND,
            "model_id": f"{PLANTED} referee world (data/reference/published), not a model",
            "model_revision": "referee v1", "prompt_id": df["prompt_id"], "prompt": df["prompt"],
            "template_version": "v1", "seed": 0, "seed_used": False, "index": df["index"], "width": 0, "height": 0,
            "sha256": "", "path": "", "status": C.OK, "reason": "", "retries": 0, "created_at": "", "libraries": "",
            "settings": "", "extra": [f'{{"planted_shares": {list(map(float, q))}}}' for q in df["q"]],
            "config_hash": "", "model_version": "", "planted_label": df["label"], "planted_L": df["L"],
            "planted_hue": hue})
        labels = pd.DataFrame({
            "image_id": df["image_id"], "model": m, "prompt_id": df["prompt_id"], "label": df["label"],
            "status": C.OK, "reason": "", "raw_answer": df["label"], "backend": BACKEND,
            "classifier_model_id": f"{PLANTED} classifier labels (referee world)", "classifier_revision": "referee v1",
            "instruction_version": "v1", "from_cache": False, "stand_in": True, "option_probs": "",
            "tokens_in": 0, "tokens_out": 0, "model_version": ""})
        faces = pd.DataFrame({
            "image_id": df["image_id"], "model": m, "prompt_id": df["prompt_id"], "n_faces": 1, "det_score": 0.99,
            "bbox": "", "image_scale": 1.0, "skin_pixels": 1000, "mean_r": np.nan, "mean_g": np.nan,
            "mean_b": np.nan, "L": df["L"].astype(float), "a": a, "b": b, "C": chroma, "h": hue,
            "ita": ita_degrees(np.column_stack([df["L"].to_numpy(float), a, b])), "L_bin": C.l_bin(df["L"].to_numpy(float)),
            "status": C.OK, "reason": "", "face_backend": BACKEND, "face_model_id": f"{PLANTED} L* (referee world)",
            "face_revision": "referee v1", "skin_backend": BACKEND, "skin_model_id": PLANTED,
            "skin_revision": "", "stand_in": True, "cross_detector": "none", "cross_n_faces": np.nan,
            "cross_det_score": np.nan, "cross_L": np.nan})
        out[m] = {"manifest": manifest, "labels": labels, "faces": faces}
    return out


def write_tables(tables: Mapping[str, Mapping[str, pd.DataFrame]], root: Path, images_dir: Path) -> list[Path]:
    from biasaudit.pipeline.io import atomic_write_table

    written = []
    for m, t in tables.items():
        written.append(atomic_write_table(t["manifest"], Path(root) / images_dir / m / "manifest.parquet"))
        written.append(atomic_write_table(t["labels"], Path(root) / C.labels_path(m)))
        written.append(atomic_write_table(t["faces"], Path(root) / C.faces_path(m)))
    return written


def build(root: Path, cfg: Any, published: pd.DataFrame) -> tuple[World, Representation,
                                                                   dict[str, dict[str, pd.DataFrame]]]:
    prompts = pd.read_csv(Path(root) / cfg.generate.prompts_file, dtype={"prompt_id": str})
    world = plant_world(published, list(cfg.models), tuple(cfg.groups), cfg.generate.images_per_prompt)
    rep = solve_representation(world, prompts, published)
    return world, rep, planted_tables(world, rep, cfg.seed)


def planted_notes(world: World) -> dict[str, str]:
    """Row id → what the referee world planted for it, or why it planted nothing (the table's notes)."""
    return {**{k: f"{PLANTED}: {v}" for k, v in world.planted.items()},
            **{k: v if v.startswith(CANNOT_PLANT) else f"not planted: {v}" for k, v in world.unplanted.items()}}


def verify(cfg: Any, published: pd.DataFrame, reports: Path = C.REPORTS) -> int:
    """Build the replication table of the referee run (reports/replication.csv and its page) and print every
    row that is not recovered; 0 when each row is covered or a named chance miss."""
    from biasaudit.report.replication import CHANCE_MISS, build_replication

    ra = cfg.reflect_analysis
    world = plant_world(published, list(cfg.models), tuple(cfg.groups), cfg.generate.images_per_prompt)
    table = build_replication(
        Path(reports), C.PUBLISHED_DIR, cfg.profile, cfg.stand_ins(), groups=cfg.groups,
        design={"faces.detector": cfg.faces.detector, "faces.det_threshold": cfg.faces.det_threshold,
                "faces.skin_method": cfg.faces.skin_method},
        options={"mcq_salary": ra.salary_brackets, "mcq_education": ra.education_levels},
        level=cfg.analyze.ci_level, title=cfg.report.title, planted=planted_notes(world))
    cov = table["covered"].astype(str).str.lower()
    chance = table["note"].astype(str).str.contains(CHANCE_MISS)
    unplantable = table["note"].astype(str).str.contains(CANNOT_PLANT)
    bad = table[(cov != "true") & ~chance & ~unplantable]
    print(f"referee run: {len(table)} rows; {int((cov == 'true').sum())} recovered, {int(chance.sum())} named chance "
          f"miss(es), {int((unplantable & (cov != 'true')).sum())} that cannot be planted (each says why), {len(bad)} "
          "not recovered (reports/replication.csv, reports/pages/replication.html)")
    for r in bad.itertuples():
        print(f"  {r.id} {r.statistic} {r.model} {r.category} {r.group}: published {r.relation} {r.published}, "
              f"run {r.this_run} [{r.low}, {r.high}] — {str(r.note)[len(''):300]}")
    return 1 if len(bad) else 0


def main(argv: list[str] | None = None) -> int:
    from biasaudit.config import load_params
    from biasaudit.report.replication import load_published

    parser = argparse.ArgumentParser(prog="python -m biasaudit.referee", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("write", help="write the planted Method A tables of the referee profile")
    sub.add_parser("verify", help="build the replication table of this run and check every row (exit 1 if one fails)")
    args = parser.parse_args(argv)
    cfg = load_params()
    if cfg.profile != PROFILE:
        print(f"params.yaml is in profile '{cfg.profile}', not '{PROFILE}': run `biasaudit profile {PROFILE}` first",
              file=sys.stderr)
        return 2
    published = load_published(Path(C.PUBLISHED_DIR))
    if args.command == "verify":
        return verify(cfg, published)
    if args.command == "write":
        world, rep, tables = build(Path("."), cfg, published)
        for path in write_tables(tables, Path("."), Path(cfg.generate.images_dir)):
            print(f"{PLANTED}: wrote {path}")
        print(f"planted {len(world.planted)} rows; not planted: {len(world.unplanted)} "
              f"({', '.join(sorted(world.unplanted))}); solver residual {rep.residual:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
