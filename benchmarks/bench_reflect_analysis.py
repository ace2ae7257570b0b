"""Method B's analysis at the paper's size: CPU seconds per VLM and per section (issue #47 item 5: ≤ 5 CPU s per
VLM at 48 photos).

Input: SIMULATED answers, not a model's: for each of 5 VLMs a whole REFLECT response table drawn by the planted
simulator (vlm/planted.simulate_responses: every 2AFC and MCQ task, salary, the placebo tasks of params.yaml and
the null-edit control) for 48 source photos (8 per occupation of sources.occupations, the paper profile's photos_per_occupation),
each VLM from its own seed. The VLMs are read as real ones (no planted truth attached), so the validation section
does not run, as for the paper's VLMs; `--planted` attaches the declared effects and times it too.

Settings: params.yaml with the paper profile's reflect_analysis values (n_permutations 9999; `--offline`:
params.yaml as it is). The sections run in
the stage's order (notebooks/vlm_reflect_analysis.py) with the OutputWriter (figures as PNG and SVG), then the
summary. One untimed warm-up VLM (imports), then every VLM timed; the medians over the VLMs are reported with
the load average. CPU seconds of the process (every thread) are the figure: wall seconds on a shared machine
say more about the other jobs than about the code.

`--out DIR` keeps the timed VLMs' outputs; `--compare DIR` (with --out) lists every table cell that differs from
an --out folder of the previous code on the same answers (same --vlms, --photos): max |Δ| per column.

    python benchmarks/bench_reflect_analysis.py [--vlms 5] [--photos 48] [--planted] [--offline] [--out DIR]
                                                [--compare DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from bench_analyze import paper_config


def responses(photos: int, seed: int, cfg) -> pd.DataFrame:
    from biasaudit.params.vlm import PlantedReflect
    from biasaudit.vlm import planted as P

    occ = list(cfg.sources.occupations)
    units = pd.DataFrame({"unit": [f"{occ[i % len(occ)]}/p{i:02d}" for i in range(photos)],
                          "occupation": [occ[i % len(occ)] for i in range(photos)]})
    return P.simulate_responses(PlantedReflect(), units, np.random.default_rng(seed), cfg.reflect, controls=True)


def run_vlm(answers, cfg, writer, keep: dict | None = None) -> dict[str, float]:
    """CPU seconds per section (its compute and the writer's add), and `write`: the writer's share of them.
    `keep`: every table of the sections, at full precision (the CSVs carry 10 significant digits)."""
    from biasaudit.vlm.analysis import controls, gaps, interaction, refusals, significance, two_afc, validation

    cpu = {"write": 0.0}
    for name, mod in (("validation", validation), ("two_afc", two_afc), ("gaps", gaps), ("refusals", refusals),
                      ("significance", significance), ("interaction", interaction), ("controls", controls)):
        c = time.process_time()
        res = mod.compute(answers, cfg)
        w = time.process_time()
        if res is not None:
            writer.add(res)
        cpu[name] = time.process_time() - c
        cpu["write"] += time.process_time() - w
        if keep is not None and res is not None:  # untimed
            keep.update({k: t.copy() for k, t in res.tables.items()})
    return cpu


def table_diffs(new: Path, reference: Path) -> pd.DataFrame:
    """Every table CSV of `new` against the same table of `reference` (the previous code on the same answers),
    per column that differs: max |Δ| over the cells finite in both, and the cells that differ otherwise (text,
    or finite in one only). No row: every table byte-identical."""
    rows = []
    for ref in sorted((reference / "tables").glob("*.csv")):
        path = new / "tables" / ref.name
        if not path.exists():
            rows.append({"table": ref.stem, "column": "(missing)"})
            continue
        if path.read_bytes() == ref.read_bytes():
            continue
        a, b = pd.read_csv(ref), pd.read_csv(path)
        if list(a.columns) != list(b.columns) or len(a) != len(b):
            rows.append({"table": ref.stem, "column": "(columns or rows differ)"})
            continue
        for col in a.columns:
            x, y = a[col], b[col]
            if pd.api.types.is_numeric_dtype(x) and pd.api.types.is_numeric_dtype(y):
                x, y = x.to_numpy(float), y.to_numpy(float)
                both = np.isfinite(x) & np.isfinite(y)
                delta = float(np.abs(x - y)[both].max()) if both.any() else 0.0
                other = int((np.isfinite(x) != np.isfinite(y)).sum())
            else:
                delta, other = 0.0, int(((x.astype(str) != y.astype(str)) & ~(x.isna() & y.isna())).sum())
            if delta or other:
                rows.append({"table": ref.stem, "column": col, "max_abs_delta": delta, "cells_otherwise": other})
    for ref in sorted((new / "tables").glob("*.csv")):
        if not (reference / "tables" / ref.name).exists():
            rows.append({"table": ref.stem, "column": "(new table)"})
    return pd.DataFrame(rows, columns=["table", "column", "max_abs_delta", "cells_otherwise"])


def exact_diffs(new: Path, reference: Path) -> str:
    """The tables in memory (tables.pkl of each --out) compared at full precision: the numeric cells that differ
    and the largest |Δ| per table and column, or 'every cell equal'."""
    a, b = pd.read_pickle(reference / "tables.pkl"), pd.read_pickle(new / "tables.pkl")
    out = [f"{name}: missing" for name in a if name not in b]
    for name in (n for n in a if n in b):
        x, y = a[name], b[name]
        if list(x.columns) != list(y.columns) or len(x) != len(y):
            out.append(f"{name}: columns or rows differ")
            continue
        for col in x.columns:
            u, v = x[col].to_numpy(), y[col].to_numpy()
            if pd.api.types.is_numeric_dtype(x[col]) and pd.api.types.is_numeric_dtype(y[col]):
                u, v = u.astype(float), v.astype(float)
                if not np.array_equal(u, v, equal_nan=True):
                    both = np.isfinite(u) & np.isfinite(v)
                    out.append(f"{name}.{col}: {int((~((u == v) | (np.isnan(u) & np.isnan(v)))).sum())} cells, "
                               f"max |Δ| {np.abs(u - v)[both].max() if both.any() else np.nan:.3g}")
            elif [str(t) for t in u] != [str(t) for t in v]:
                out.append(f"{name}.{col}: text differs")
    return "; ".join(out) or f"every cell of the {len(a)} tables equal"


def figure_diffs(new: Path, reference: Path) -> dict[str, list[str] | int]:
    """Every figure file of `reference` against `new`'s: byte-identical, or (PNG) the same pixels, or differing."""
    from PIL import Image

    out: dict[str, list[str] | int] = {"byte-identical": 0, "same pixels": [], "differ": []}
    for ref in sorted((reference / "figures").glob("*.*")):
        path = new / "figures" / ref.name
        if path.exists() and path.read_bytes() == ref.read_bytes():
            out["byte-identical"] += 1
        elif path.exists() and ref.suffix == ".png" and np.array_equal(np.asarray(Image.open(ref)),
                                                                       np.asarray(Image.open(path))):
            out["same pixels"].append(ref.name)
        else:
            out["differ"].append(ref.name)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vlms", type=int, default=5)
    ap.add_argument("--photos", type=int, default=48)
    ap.add_argument("--planted", action="store_true", help="attach the declared effects: the validation section runs")
    ap.add_argument("--offline", action="store_true", help="params.yaml as it is (n_permutations of the offline demo)")
    ap.add_argument("--out", type=Path, default=None, help="keep the timed VLMs' outputs (tables, figures) here")
    ap.add_argument("--compare", type=Path, default=None,
                    help="an --out folder of the previous code (same --vlms, --photos): the table cells that differ")
    args = ap.parse_args()
    from biasaudit.params.vlm import PlantedReflect
    from biasaudit.pipeline.outputs import OutputWriter
    from biasaudit.vlm.analysis import summary
    from biasaudit.vlm.analysis.inputs import Answers, Inputs

    cfg = paper_config(() if args.offline else ("reflect_analysis.",))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; n_permutations "
          f"{cfg.reflect_analysis.n_permutations}, n_boot {cfg.reflect_analysis.n_boot}", flush=True)
    tables = {f"vlm{i}": responses(args.photos, 1000 + i, cfg) for i in range(args.vlms + 1)}
    planted = PlantedReflect() if args.planted else None
    with tempfile.TemporaryDirectory() as tmp:
        writer = OutputWriter(Path(tmp) / "vlm")
        run_vlm(Answers("warm-up", tables.pop(f"vlm{args.vlms}"), planted), cfg, writer)  # imports, untimed
        out = args.out or Path(tmp) / "timed"
        writer = OutputWriter(out)
        per, all_answers, exact = [], [], {} if args.out else None
        for name, df in tables.items():
            answers = Answers(name, df, planted)
            all_answers.append(answers)
            cpu = run_vlm(answers, cfg, writer, exact)
            cpu["total"] = sum(v for k, v in cpu.items() if k != "write")
            per.append(cpu)
            print(f"{name}: {len(df)} answers, {cpu['total']:.2f} CPU s, load {os.getloadavg()[0]:.1f}", flush=True)
        c = time.process_time()
        summary.compute(Inputs(all_answers, []), cfg)
        writer.finish(profile="paper", stand_in=True, method="B (FOCUS/REFLECT)")
        tail = time.process_time() - c
    if args.out:
        pd.to_pickle(exact, args.out / "tables.pkl")
    med = {k: statistics.median(p[k] for p in per) for k in per[0]}
    print("CPU seconds per VLM (median over VLMs):", json.dumps({k: round(v, 2) for k, v in med.items()}))
    print(f"summary + figures written once for all VLMs: {tail:.2f} CPU s; per VLM with its share of it: "
          f"{med['total'] + tail / len(per):.2f} CPU s (goal ≤ 5)")
    if args.compare:
        diffs = table_diffs(args.out, args.compare) if args.out else None
        print("tables against --compare:", "pass --out too" if diffs is None else
              "every table byte-identical" if diffs.empty else "\n" + diffs.to_string(index=False))
        if args.out:
            same = (args.out / "metrics.json").read_bytes() == (args.compare / "metrics.json").read_bytes()
            print("metrics.json", "byte-identical" if same else "differs")
            print("figures against --compare:", json.dumps(figure_diffs(args.out, args.compare)))
            print("tables at full precision against --compare:", exact_diffs(args.out, args.compare))


if __name__ == "__main__":
    main()
