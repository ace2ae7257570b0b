"""One banner rule under every profile: the report built as the report stage builds it (front page, block and
section pages, replication and assumptions pages, images.html, focus.html, audit cards) and a stage notebook's
banner carry the STAND-IN banner exactly when the profile ran a stand-in, planted or simulated part
(`Params.stand_ins()`), and every audit card and CSV row carries the fields that trace it to its run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from biasaudit.config import apply_profile
from biasaudit.contracts import IMAGES_DIR, PROMPTS_CSV
from biasaudit.report import build_index
from biasaudit.report.assumptions import ASSUMPTIONS_CSV, build_assumptions
from biasaudit.report.audit_card import TRACE_COLUMNS, Resampling, build_cards
from biasaudit.report.gallery import build_gallery
from biasaudit.report.replication import build_replication

from .fixtures_t2i import write_tree
from .test_audit_card import _units
from .test_report import _analysis, _images, _notebook, _vlm

ROOT = Path(__file__).resolve().parents[1]
PROFILES = sorted(p.stem for p in (ROOT / "profiles").glob("*.yaml"))
BANNER = 'class="standin"'
RUN = {"profile": "", "params_hash": "p0", "git_commit": "c0", "code_date": "2026-12-03T00:00:00"}


def _report(root: Path, cfg, stand_ins: list[str]) -> Path:
    stand_in = bool(stand_ins)
    _analysis(root, stand_in=stand_in)
    _vlm(root / "reports")
    _images(root)
    _notebook(root / "reports")
    responses = root / "data" / "vlm" / "responses"
    responses.mkdir(parents=True, exist_ok=True)
    _units(12, seed=3).to_parquet(responses / "vlm-z.parquet")
    reports = root / "reports"
    gallery = build_gallery(root, reports, images_dir=IMAGES_DIR, prompts_file=PROMPTS_CSV, px=64,
                            per_prompt=2, stand_in=stand_in)
    boot = Resampling(n_boot=50, level=0.95, method="percentile", seed=1)
    build_cards(reports, responses, boot, boot, {"salary_salary": None}, stand_in, out_dir=reports / "audit",
                run=RUN | {"profile": cfg.profile}, stand_ins=stand_ins)
    build_replication(reports, ROOT / "data/reference/published", cfg.profile, stand_ins, root=root)
    build_assumptions(reports, cfg.model_dump(), cfg.profile, stand_ins, ROOT / ASSUMPTIONS_CSV, root=root)
    return build_index(reports, cfg, title="synthetic report", max_table_rows=10, root=root, gallery=gallery)


@pytest.mark.slow
@pytest.mark.parametrize("profile", PROFILES)
def test_the_banner_is_on_every_page_exactly_when_a_stand_in_ran(profile, tmp_path, monkeypatch):
    params = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", params)
    cfg = apply_profile(profile, params, ROOT / "profiles")
    stand_ins = cfg.stand_ins()
    root = write_tree(tmp_path / "tree")
    for name in ("dvc.yaml",):
        (root / name).write_text((ROOT / name).read_text())
    (root / "params.yaml").write_text(params.read_text())
    index = _report(root, cfg, stand_ins)
    reports = index.parent
    pages = [index, *sorted((reports / "pages").glob("*.html")), reports / "images.html", reports / "focus.html",
             *sorted((reports / "audit").glob("*.html"))]
    assert len(pages) > 20
    wrong = [p.relative_to(reports).as_posix() for p in pages if (BANNER in p.read_text()) != bool(stand_ins)]
    assert not wrong, (profile, stand_ins, wrong)
    skipped = cfg.skipped()  # the measurements the profile switches off: on the front page's banner, each of them
    front = index.read_text()
    assert ("Skipped measurements" in front) == bool(skipped) and all(s.split(":")[0] in front for s in skipped)
    # a stage notebook's banner follows the same rule
    import IPython.display

    from biasaudit.notebook import banner

    shown: list[str] = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, *a, **k: shown.append(getattr(obj, "data", str(obj))))
    banner(cfg)
    assert ("STAND-IN RUN" in " ".join(shown)) == bool(stand_ins)
    assert ("Skipped measurements" in " ".join(shown)) == bool(skipped)
    # every card and CSV row names its run
    for csv in sorted((reports / "audit").glob("*.csv")):
        table = pd.read_csv(csv, keep_default_na=False)
        if csv.name == "all_models.csv":
            continue
        for k in TRACE_COLUMNS:
            assert k in table, (csv.name, k)
        for k in ("profile", "params_hash", "git_commit", "code_date"):
            assert (table[k].astype(str) != "").all(), (csv.name, k)
        assert (table["profile"] == profile).all() and (table["stand_in"].astype(str) == str(bool(stand_ins))).all()
    for card in sorted((reports / "audit").glob("*.html")):
        if card.name == "index.html":
            continue
        text = card.read_text()
        for field in ("code commit", "code commit date", "profile", "params hash"):
            assert field in text, (card.name, field)


def test_the_profiles_cover_both_sides_of_the_rule():
    """The test above means something only if some profile is real and some is not."""
    import tempfile

    kinds = set()
    for profile in PROFILES:
        with tempfile.TemporaryDirectory() as tmp:
            params = Path(tmp) / "params.yaml"
            shutil.copy(ROOT / "params.yaml", params)
            kinds.add(bool(apply_profile(profile, params, ROOT / "profiles").stand_ins()))
    assert kinds == {True, False}


@pytest.mark.parametrize("profile", PROFILES)
def test_the_offline_demo_skips_what_measures_nothing_and_the_paper_keeps_it(profile, tmp_path):
    """Params.skipped lists exactly the measurement switches a profile turns off (profiles/<name>.yaml over
    params.yaml): the offline demo (and profiles built on it) skip the second face detector and LPIPS; the paper
    and current profiles, which set both, skip nothing."""
    import yaml

    params = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", params)
    cfg = apply_profile(profile, params, ROOT / "profiles")
    declared = yaml.safe_load((ROOT / "params.yaml").read_text())
    overlay = yaml.safe_load((ROOT / "profiles" / f"{profile}.yaml").read_text()) or {}
    cross = overlay.get("faces.cross_detector", declared["faces"]["cross_detector"])
    lpips = overlay.get("validate_edits.lpips_weights", declared["validate_edits"]["lpips_weights"])
    expected = {k for k, off in (("faces.cross_detector", cross == "none"),
                                 ("validate_edits.lpips_weights", lpips == "none")) if off}
    assert {line.split(":")[0] for line in cfg.skipped()} == expected
    if profile in ("paper", "current"):
        assert not cfg.skipped() and cfg.faces.cross_detector != "none" and cfg.validate_edits.lpips_weights == ""
    if profile == "offline":
        assert expected == {"faces.cross_detector", "validate_edits.lpips_weights"}
