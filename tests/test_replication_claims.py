"""The readers of the seeds' stated claims and of the FOCUS design counts (report/replication.py): each reads
its own number from this run's tables, is covered only when the run supports the claim, and is checked against
values computed by hand here (margins from marginal intervals, Wilson intervals from statsmodels, the mean
pairwise cosine by brute force)."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from biasaudit import contracts as C
from biasaudit.report.replication import Run, load_published, replication_table
from biasaudit.t2i.analysis.skin import LABEL_ADJUSTED, SEED_SUBSET

from .conftest import ROOT

PUBLISHED = load_published(ROOT / C.PUBLISHED_DIR).set_index("id", drop=False)
MODELS = ("sd35-large-turbo", "flux-schnell", "imagen-4-fast")


def _write(reports: Path, name: str, df: pd.DataFrame, folder: str = "t2i/tables") -> None:
    (reports / folder).mkdir(parents=True, exist_ok=True)
    for method in ("t2i", "vlm"):
        (reports / method).mkdir(parents=True, exist_ok=True)
        if not (reports / method / "manifest.json").exists():
            (reports / method / "manifest.json").write_text(json.dumps({"sections": []}))
    df.to_csv(reports / folder / f"{name}.csv", index=False)


def _cov(v: object) -> object:
    """covered as True / False, or '' (no comparison); a one-row frame holds numpy's bool."""
    return v if isinstance(v, str) else bool(v)


def _table(tmp_path: Path, *ids: str) -> pd.DataFrame:
    run = Run.load(tmp_path / "reports", tmp_path)
    return replication_table(PUBLISHED.loc[list(ids)].reset_index(drop=True), run, stand_ins=[]).set_index("id")


def _deviation(reports: Path, values: dict[str, tuple[float, float, float]], category: str, race: str) -> None:
    _write(reports, "deviation_by_race", pd.DataFrame(
        [{"model": m, "category": category, "race": race, "mean_deviation": e, "mean_deviation_low": lo,
          "mean_deviation_high": hi} for m, (e, lo, hi) in values.items()]))


def test_the_largest_black_disparity_is_a_margin_with_an_interval(tmp_path):
    """A56: Imagen's Black deviation on surnames is the most negative. By hand: the margin over the nearest
    other model (flux, −0.10 vs −0.20) is 0.10, its interval [−0.15 − (−0.16), −0.05 − (−0.25)] = [0.01, 0.20]."""
    _deviation(tmp_path / "reports", {"imagen-4-fast": (-0.20, -0.25, -0.16), "flux-schnell": (-0.10, -0.15, -0.05),
                                      "sd35-large-turbo": (0.0, -0.05, 0.05)}, "surname", "black")
    row = _table(tmp_path, "A56").loc["A56"]
    assert row["this_run"] == pytest.approx(0.10) and row["low"] == pytest.approx(0.01)
    assert row["high"] == pytest.approx(0.20) and _cov(row["covered"]) is True
    assert "flux-schnell" in row["note"]
    # the intervals overlap: the claim is neither confirmed nor contradicted
    _deviation(tmp_path / "reports", {"imagen-4-fast": (-0.20, -0.25, -0.14), "flux-schnell": (-0.10, -0.15, -0.05),
                                      "sd35-large-turbo": (0.0, -0.05, 0.05)}, "surname", "black")
    row = _table(tmp_path, "A56").loc["A56"]
    assert _cov(row["covered"]) is False and "straddles" in row["note"]
    # another model has the largest disparity: the run contradicts the claim
    _deviation(tmp_path / "reports", {"imagen-4-fast": (-0.05, -0.08, -0.02), "flux-schnell": (-0.30, -0.35, -0.25),
                                      "sd35-large-turbo": (0.0, -0.05, 0.05)}, "surname", "black")
    row = _table(tmp_path, "A56").loc["A56"]
    assert row["this_run"] == pytest.approx(-0.25) and _cov(row["covered"]) is False and "contradicts" in row["note"]
    # geography is another row, and this run has no geography table row: not computed, and why
    assert "not computed" in _table(tmp_path, "A57").loc["A57", "note"]


def test_a_prompt_deviation_has_a_wilson_interval(tmp_path):
    """A58 (Charles under-represented in every model) and A59 (SD 3.5 over-represents Asians for a CEO)."""
    from statsmodels.stats.proportion import proportion_confint

    counts = {"sd35-large-turbo": 10, "flux-schnell": 20, "imagen-4-fast": 5}
    rows = [{"model": m, "prompt_id": "sur-charles", "category": "surname", "instance": "Charles", "n": 100,
             "n_black": k, "bench_black": 0.55, "n_asian": 0, "bench_asian": 0.01} for m, k in counts.items()]
    rows.append({"model": "sd35-large-turbo", "prompt_id": "occ-ceo", "category": "occupation",
                 "instance": "Chief executives", "n": 100, "n_black": 0, "bench_black": 0.05, "n_asian": 30,
                 "bench_asian": 0.08})
    _write(tmp_path / "reports", "tvd_per_prompt", pd.DataFrame(rows))
    table = _table(tmp_path, "A58", "A59", "A60")
    lo, hi = proportion_confint(20, 100, alpha=0.05, method="wilson")  # flux: the least under-represented
    assert table.loc["A58", "this_run"] == pytest.approx(0.20 - 0.55)
    assert table.loc["A58", "high"] == pytest.approx(hi - 0.55) and _cov(table.loc["A58", "covered"]) is True
    lo, hi = proportion_confint(30, 100, alpha=0.05, method="wilson")
    assert table.loc["A59", "this_run"] == pytest.approx(0.30 - 0.08) and table.loc["A59", "low"] == pytest.approx(lo - 0.08)
    assert _cov(table.loc["A59", "covered"]) is True
    assert "not computed" in table.loc["A60", "note"] and "Actors" in table.loc["A60", "note"]


def test_the_most_diverse_faces_and_skin_tones(tmp_path):
    """A67: Flux has the lowest mean face cosine; A68–A70: Imagen the lightest and least diverse skin tones,
    SD 3.5 the most diverse; A71: the model closest to the benchmarks is not the most diverse one."""
    reports = tmp_path / "reports"
    hom = []
    for m in MODELS:
        hom += [{"model": m, "space": "face", "group": g, "wp_gap": 0, "wp_gap_lo": 0, "wp_gap_hi": 0, "gap": gap,
                 "gap_lo": gap - 0.01, "gap_hi": gap + 0.01} for g, gap in (("black", 0.10), ("white", 0.02), ("asian", 0.05))]
    _write(reports, "homogeneity_by_race", pd.DataFrame(hom))
    _write(reports, "homogeneity_overall", pd.DataFrame(
        [{"model": m, "space": "face", "n": 300, "intra": i, "intra_lo": i - 0.02, "intra_hi": i + 0.02}
         for m, i in zip(MODELS, (0.30, 0.20, 0.40))]))
    _write(reports, "skin_summary_by_model", pd.DataFrame(
        [{"model": m, "n": 100, "L_mean": L, "L_mean_lo": L - 1, "L_mean_hi": L + 1, "diversity_de2000": d,
          "diversity_de2000_lo": d - 0.5, "diversity_de2000_hi": d + 0.5}
         for m, L, d in (("sd35-large-turbo", 50, 12), ("flux-schnell", 55, 9), ("imagen-4-fast", 62, 6))]))
    _write(reports, "tvd_summary", pd.DataFrame(
        [{"model": m, "category": "all", "n_prompts": 150, "mean_tvd": t, "mean_tvd_low": t - 0.02,
          "mean_tvd_high": t + 0.02} for m, t in (("sd35-large-turbo", 0.45), ("flux-schnell", 0.31),
                                                   ("imagen-4-fast", 0.38))]))
    table = _table(tmp_path, "A64", "A65", "A66", "A67", "A68", "A69", "A70", "A71")
    # A64: Black's gap 0.10 against Asian's 0.05: margin 0.05, interval [0.09 − 0.06, 0.11 − 0.04]
    assert table.loc["A64", "this_run"] == pytest.approx(0.05) and table.loc["A64", "low"] == pytest.approx(0.03)
    assert all(_cov(v) is True for v in table.loc[["A64", "A65", "A66"], "covered"])
    # A67: flux's mean face cosine 0.20 [0.18, 0.22] below SD 3.5's 0.30 [0.28, 0.32]: margin 0.10 [0.06, 0.14]
    assert table.loc["A67", "this_run"] == pytest.approx(0.10) and table.loc["A67", "low"] == pytest.approx(0.06)
    assert _cov(table.loc["A67", "covered"]) is True
    assert table.loc["A68", "this_run"] == pytest.approx(7) and table.loc["A68", "low"] == pytest.approx(5)
    assert _cov(table.loc["A69", "covered"]) is True and _cov(table.loc["A70", "covered"]) is True
    assert table.loc["A71", "this_run"] == 1 and _cov(table.loc["A71", "covered"]) is True
    # SD 3.5 also the closest: the same model, the claim contradicted
    _write(reports, "tvd_summary", pd.DataFrame(
        [{"model": m, "category": "all", "n_prompts": 150, "mean_tvd": t, "mean_tvd_low": t - 0.02,
          "mean_tvd_high": t + 0.02} for m, t in (("sd35-large-turbo", 0.20), ("flux-schnell", 0.31),
                                                   ("imagen-4-fast", 0.35))]))
    row = _table(tmp_path, "A71").loc["A71"]
    assert row["this_run"] == 0 and _cov(row["covered"]) is False and "contradicts" in row["note"]
    # flux's TVD interval overlaps SD 3.5's: which is closest is not clear, [0, 1], not covered
    _write(reports, "tvd_summary", pd.DataFrame(
        [{"model": m, "category": "all", "n_prompts": 150, "mean_tvd": t, "mean_tvd_low": t - 0.02,
          "mean_tvd_high": t + 0.02} for m, t in (("sd35-large-turbo", 0.33), ("flux-schnell", 0.31),
                                                   ("imagen-4-fast", 0.38))]))
    row = _table(tmp_path, "A71").loc["A71"]
    assert (row["low"], row["high"]) == (0, 1) and _cov(row["covered"]) is False and "straddles" in row["note"]


def test_the_women_share_claim_reads_the_seed_subset(tmp_path):
    reports = tmp_path / "reports"
    base = {"model": "flux-schnell", "slope_unit_pct_women": 10, "intercept": 40, "se": 0.1, "n": 100, "r2": 0.1}
    _write(reports, "skin_women_share_ols", pd.DataFrame([
        {**base, "subset": SEED_SUBSET, "group": "black", "faces": 100, "slope": 0.8, "ci_low": 0.2, "ci_high": 1.4,
         "p_value": 0.01, "n_clusters": 40},
        {**base, "subset": LABEL_ADJUSTED, "group": "all", "faces": 400, "slope": 5.0, "ci_low": 4.0, "ci_high": 6.0,
         "p_value": 0.001, "n_clusters": 50}]))
    row = _table(tmp_path, "A63").loc["A63"]
    assert (row["this_run"], row["low"], row["high"], row["covered"]) == (0.8, 0.2, 1.4, True)
    assert "extension" in row["note"] and "5.000" in row["note"]


def test_the_classifier_labels_white_faces_hispanic_more_often_than_humans(tmp_path):
    from statsmodels.stats.proportion import proportion_confint

    groups = list(C.GROUPS)
    M = pd.DataFrame(0, index=groups, columns=groups)
    M.loc["white", "hispanic"], M.loc["hispanic", "white"] = 30, 10
    _write(tmp_path / "reports", "confusion", M.rename_axis("human").reset_index(), folder="t2i/reliability")
    row = _table(tmp_path, "A73").loc["A73"]
    lo, hi = proportion_confint(30, 40, alpha=0.05, method="wilson")
    assert row["this_run"] == 0.75 and row["low"] == pytest.approx(lo) and row["high"] == pytest.approx(hi)
    assert _cov(row["covered"]) is True


def test_disparities_that_persist_and_vary_across_tasks(tmp_path):
    reports = tmp_path / "reports"
    for vlm, p in (("a", 0.01), ("b", 0.30)):
        _write(reports, f"{vlm}_delta_g", pd.DataFrame(
            [{"dimension": "race", "level": "Black", "measure": "mcq_salary", "delta_pct": -3, "low": -5, "high": -1,
              "p_value": p, "p_adjusted": p}]), folder="vlm/tables")
        _write(reports, f"{vlm}_task_interaction", pd.DataFrame(
            [{"race": "Black", "kind": "joint", "task": "all", "task_b": "", "estimate": 0.2, "low": np.nan,
              "high": np.nan, "p": 0.5, "p_adjusted": 0.5, "n_photos": 48}]), folder="vlm/tables")
    table = _table(tmp_path, "B15", "B16")
    assert table.loc["B15", "this_run"] == 1 and _cov(table.loc["B15", "covered"]) is True
    assert "a 1 of 1" in table.loc["B15", "note"] and "b 0 of 1" in table.loc["B15", "note"]
    assert table.loc["B16", "this_run"] == 0 and _cov(table.loc["B16", "covered"]) is False


def test_the_focus_counts_read_the_counterfactual_arm_and_each_control_its_own_row(tmp_path):
    """The paper's design: 6 occupations × 8 photos × 10 groups = 480 counterfactual edits; the null-edit
    control adds a null edit and an original per photo (48 each), which B01/B03 must not count."""
    rows = []
    for o in range(6):
        for p in range(8):
            for race in ("Asian", "Black", "Latino", "Middle Eastern", "White"):
                for g in ("man", "woman"):
                    rows.append({"occupation": f"o{o}", "base_id": f"p{p}", "race": race, "gender": g,
                                 "group": f"{race}_{g}", "arm": "counterfactual", "status": "ok"})
            for arm in ("null_edit", "original"):
                rows.append({"occupation": f"o{o}", "base_id": f"p{p}", "race": None, "gender": None, "group": arm,
                             "arm": arm, "status": "ok"})
    rows.append({**rows[0], "status": "failed"})
    path = tmp_path / C.FOCUS_MANIFEST
    path.parent.mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(path)
    table = _table(tmp_path, "B01", "B02", "B03", "B06", "B07", "B13", "B14")
    assert table["this_run"].to_dict() == {"B01": 480, "B02": 6, "B03": 10, "B06": 5, "B07": 2, "B13": 48, "B14": 48}
    assert table.loc["B01", "difference"] == 0 and table.loc["B13", "difference"] == 48


def test_the_readings_on_the_assumptions_page_give_both_values(tmp_path):
    """R01 (A06 in points vs relative), R02 (A17–A19 per model vs pooled), R04 (mean of per-prompt TVDs vs the
    pooled TVD), each computed here by hand from two prompts; R03 without VLM tables says why not."""
    from biasaudit.report.assumptions import build_assumptions
    from biasaudit.report.replication import alternative_readings

    reports = tmp_path / "reports"
    groups = C.GROUPS
    # two occupational prompts, 10 images each: white 8/10 and 2/10 against benchmarks 0.5 and 0.3
    rows = []
    for pid, k, b in (("o1", 8, 0.5), ("o2", 2, 0.3)):
        r = {"model": "imagen-4-fast", "prompt_id": pid, "category": "occupation", "instance": pid, "n": 10,
             "tvd": 0.0, **{f"n_{g}": 0 for g in groups}, **{f"bench_{g}": 0.0 for g in groups},
             **{f"share_{g}": 0.0 for g in groups}}
        r.update(n_white=k, n_black=10 - k, bench_white=b, bench_black=1 - b, share_white=k / 10, share_black=1 - k / 10)
        r["tvd"] = 0.5 * (abs(k / 10 - b) + abs((10 - k) / 10 - (1 - b)))
        rows.append(r)
    _write(reports, "tvd_per_prompt", pd.DataFrame(rows))
    _write(reports, "deviation_by_race", pd.DataFrame([{"model": "imagen-4-fast", "category": "occupation",
                                                       "race": "white", "mean_deviation": 0.0, "mean_deviation_low": -0.1,
                                                       "mean_deviation_high": 0.1}]))
    _write(reports, "tvd_summary", pd.DataFrame([{"model": "imagen-4-fast", "category": "all", "n_prompts": 2,
                                                 "mean_tvd": 0.2, "mean_tvd_low": 0.1, "mean_tvd_high": 0.3}]))
    _write(reports, "skin_dark_share", pd.DataFrame(
        [{"model": m, "L_threshold": 40, "group": "black", "n_measured": 100, "n_dark": nd, "share": s,
          "share_low": s - 0.1, "share_high": s + 0.1} for m, nd, s in (("a", 10, 0.9), ("b", 30, 0.4))]))
    out = alternative_readings(Run.load(reports, tmp_path))
    # relative: mean share 0.5 over mean benchmark 0.4, − 1 = 0.25
    assert "0.250" in out["R01"] and "0.000 [-0.100, 0.100]" in out["R01"]
    # pooled: (0.9 × 10 + 0.4 × 30) / 40 = 0.525
    assert "0.525 of 40 faces" in out["R02"]
    # pooled TVD: labels (10 white, 10 black)/20 against the image-weighted benchmark (0.4, 0.6): 0.1
    assert "imagen-4-fast 0.200 → 0.100" in out["R04"]
    assert out["R03"].startswith("not computed")
    table = build_assumptions(reports, {}, "paper", root=ROOT, readings=out).set_index("id")
    assert table.loc["R04", "this_run"] == out["R04"]
    page = (reports / "pages/assumptions.html").read_text()
    assert "0.525 of 40 faces" in page


def test_the_similarity_by_L_bin_rows_have_intervals(tmp_path):
    """A29–A31: each bin's intra with intra_lo/hi; the difference <40 − [40,55) read from intra_minus_next with
    its interval when [40,55) is the next bin of the table, the point difference otherwise."""
    rows = [{"model": "imagen-4-fast", "space": "face", "group": g, "n": n, "intra": i, "gap": 0.0, "intra_lo": i - 0.05,
             "intra_hi": i + 0.05, "intra_minus_next": d, "intra_minus_next_lo": dl, "intra_minus_next_hi": dh}
            for g, n, i, d, dl, dh in (("<40", 40, 0.45, 0.20, 0.13, 0.27), ("[40,55)", 300, 0.25, 0.07, 0.05, 0.09),
                                       ("[55,70)", 900, 0.18, np.nan, np.nan, np.nan))]
    _write(tmp_path / "reports", "homogeneity_by_L_bin", pd.DataFrame(rows))
    table = _table(tmp_path, "A29", "A30", "A31", "A32")
    assert (table.loc["A29", "low"], table.loc["A29", "high"]) == pytest.approx((0.40, 0.50))
    assert _cov(table.loc["A29", "covered"]) is True and _cov(table.loc["A30", "covered"]) is False
    assert (table.loc["A31", "this_run"], table.loc["A31", "low"], table.loc["A31", "high"]) == (0.20, 0.13, 0.27)
    assert _cov(table.loc["A31", "covered"]) is True and table.loc["A32", "this_run"] == 40
    # without the [40,55) bin next to it: the point difference, no interval
    _write(tmp_path / "reports", "homogeneity_by_L_bin", pd.DataFrame([rows[0], rows[2], rows[1]]))
    row = _table(tmp_path, "A31").loc["A31"]
    assert row["this_run"] == pytest.approx(0.45 - 0.25) and math.isnan(row["low"]) and "point only" in row["note"]


def test_the_replication_page_lists_the_seed_elements_without_a_number(tmp_path):
    """The prompt as the homogeneity group and the edits' global SSIM are computed and shown on the page;
    absent outputs say why."""
    from biasaudit.report.replication import build_replication

    reports = tmp_path / "reports"
    _write(reports, "homogeneity_by_prompt", pd.DataFrame(
        [{"model": "m", "space": "face", "group": g, "n": 10, "intra": 0.3 + x, "inter": 0.3, "gap": x}
         for g, x in (("occ_a", 0.01), ("occ_b", 0.05), ("sur_c", 0.20))]))
    build_replication(reports, C.PUBLISHED_DIR, "paper", [], root=ROOT)
    page = (reports / "pages" / C.REPLICATION_PAGE).read_text()
    assert "Seed elements without a published number" in page
    assert "m/face: median prompt gap 0.050 over 3 prompts, largest 0.200 (sur_c)" in page
    assert "validate_edits has not run" in page
    _write(reports, "by_group", pd.DataFrame({"race": ["Black", "White"], "gender": ["man", "man"],
                                              "ssim_global_mean": [0.91, 0.95]}), folder="vlm/edit_checks")
    build_replication(reports, C.PUBLISHED_DIR, "paper", [], root=ROOT)
    assert "0.910–0.950 across 2 groups" in (reports / "pages" / C.REPLICATION_PAGE).read_text()


def test_the_replication_page_shows_the_human_study_or_why_not(tmp_path):
    """The rebuttal's human study (realism and identity ratings, validate_edits): each measure's pooled edits
    with their interval beside its calibration row, or the reason its table gives (no filled sheets yet)."""
    from biasaudit.report.replication import build_replication

    reports = tmp_path / "reports"
    _write(reports, "homogeneity_by_prompt", pd.DataFrame([{"model": "m", "space": "face", "group": "g", "gap": 0.1}]))
    build_replication(reports, C.PUBLISHED_DIR, "paper", [], root=ROOT)
    page = (reports / "pages" / C.REPLICATION_PAGE).read_text()
    assert "identity: not computed: no reports/vlm/edit_checks/identity_by_group.csv" in page
    _write(reports, "identity_by_group", pd.DataFrame([{"group": "", "n_images": 0, "mean": float("nan"),
                                                        "reason": "no identity ratings: 0 of 2 filled sheets"}]),
           folder="vlm/edit_checks")
    _write(reports, "realism_by_group", pd.DataFrame(
        [{"group": g, "mean": m, "low": lo, "high": hi, "reason": ""}
         for g, m, lo, hi in (("BF", 2.5, 2.0, 3.0), ("original", 4.75, 4.5, 5.0), ("all edits", 3.125, 2.5, 3.5))]),
        folder="vlm/edit_checks")
    build_replication(reports, C.PUBLISHED_DIR, "paper", [], root=ROOT)
    page = (reports / "pages" / C.REPLICATION_PAGE).read_text()
    assert "realism: all edits 3.125 [2.500, 3.500], original 4.750" in page
    assert "identity: not computed: no identity ratings: 0 of 2 filled sheets" in page
