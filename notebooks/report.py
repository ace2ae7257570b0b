# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     notebook_metadata_filter: -jupytext.text_representation
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Report: a front page for decisions, images to look at, every notebook as HTML
#
# Reads what the stages wrote under `reports/` and `data/` and writes, with no network and no
# external script:
#
# - `reports/html/<notebook>.html`: every executed notebook, exported once here (offline template;
#   cells keep their `#cell-id=` anchors, which the front page links to);
# - `reports/thumbs/` (small JPEGs, redrawn only when their image changed), `reports/images.html`
#   (generated images per model × prompt with label, L*, face box, skin mask; filters) and
#   `reports/focus.html` (each source photo and its 10 face-only edits with their checks);
# - `reports/index.html`: the banner, at most six findings (each led by its validated estimate and its
#   interval), the key figures, and one line per section linking to its page under `reports/pages/`
#   (model comparison, Method B, validation, instrument bias, calibration, every analysis section,
#   and per stage what it read, wrote and how long it took);
# - `reports/replication.csv` and `reports/pages/replication.html`: each number the papers publish beside this
#   run's, with its interval (report/replication.py);
# - `reports/pages/assumptions.html`: every choice the papers leave open (data/reference/assumptions.csv) with its
#   params key and this run's value (report/assumptions.py);
# - `reports/audit/`: one audit card (HTML + CSV) per audited model and all models side by side;
# - `metrics/headline.json`: about 20 headline numbers, tracked in git for `dvc metrics diff`.
#
# Settings come from the `report:` section of params.yaml.

# %% tags=["parameters"]
# Nothing varies per run: every value comes from params.yaml through stage_params (validated),
# so a run outside DVC reads exactly what `dvc repro` reads.

# %%
import json
from pathlib import Path

from IPython.display import Markdown, display

from biasaudit import contracts as C
from biasaudit import groupsets
from biasaudit.notebook import banner, stage_params
from biasaudit.pipeline.provenance import git_commit_date, run_info
from biasaudit.report import build_index, power
from biasaudit.report.assumptions import ASSUMPTIONS_CSV, build_assumptions
from biasaudit.report.audit_card import Resampling, Validity, build_cards
from biasaudit.report.gallery import build_gallery
from biasaudit.report.headline import count, write_headline
from biasaudit.report.html import replication_summary
from biasaudit.report.replication import Run, alternative_readings, build_replication
from biasaudit.report.trail import export_all
from biasaudit.vlm.declared import answer_values

cfg, params = stage_params("report")
banner(cfg)
reports = C.REPORTS

# %%
failed = export_all(reports / "notebooks", reports / "html")
display(Markdown(f"Exported {len(list((reports / 'html').glob('*.html')))} notebooks to `reports/html/`"
                 + (f"; failed: {failed}" if failed else ".")))

# %%
stand_in = bool(cfg.stand_ins())  # one rule on every page and card: no stand-in, planted or simulated part ran
gallery = build_gallery(Path("."), reports, images_dir=cfg.generate.images_dir, prompts_file=cfg.generate.prompts_file,
                        px=params.thumb_px, per_prompt=params.thumbs_per_prompt, stand_in=stand_in)
display(Markdown(f"images.html: {gallery.images}; focus.html: {gallery.focus}; thumbnails drawn now: {gallery.thumbs_made}"))

# %% [markdown]
# ## Audit cards
# One page and one CSV per audited model under `reports/audit/` (Method A: representation ratios against the
# benchmark, parity and the group set's stated targets, and the TVDs; Method B: LL144-style selection and
# scoring rates with impact ratios), and `reports/audit/index.html`, all models side by side.

# %%
ra = cfg.reflect_analysis
scales = answer_values(cfg.reflect, placebo=False)  # the declared real tasks' answer values (vlm.declared)
gs, _ = groupsets.load(cfg.benchmarks.group_set)  # its stated targets are shown beside the benchmark and parity
info = run_info(cfg.model_dump())  # what every card and CSV row carries to name its run
cards = build_cards(reports, C.RESPONSES_DIR,
                    Resampling(cfg.analyze.n_boot, cfg.analyze.ci_level, cfg.analyze.bootstrap_method, cfg.seed),
                    Resampling(ra.n_boot, ra.confidence, ra.bootstrap_method, ra.seed),
                    scales, stand_in, gs.targets,
                    display=gs.display, validity=Validity(ra.min_clusters, params.card_min_retention),
                    run={"profile": cfg.profile, "params_hash": info["params_hash"], "git_commit": info["git_commit"],
                         "code_date": git_commit_date()}, stand_ins=cfg.stand_ins(), images_dir=cfg.generate.images_dir,
                    labels_dir=C.LABELS_DIR,
                    power_table=power.load())  # each VLM card's power line (benchmarks/power.py's simulation)
display(cards)

# %% [markdown]
# ## Replication
# Every number the two papers publish (`data/reference/published/`, each with its sentence) beside this run's value of
# the same statistic with its interval: `reports/replication.csv` and `reports/pages/replication.html`. Under a
# stand-in run the table claims no comparison.

# %%
replication = build_replication(reports, C.PUBLISHED_DIR, cfg.profile, cfg.stand_ins(), groups=cfg.groups,
                                 design={"faces.detector": cfg.faces.detector, "faces.det_threshold": cfg.faces.det_threshold,
                                         "faces.skin_method": cfg.faces.skin_method},
                                 options={label: v for label, v in scales.items() if v is not None},
                                 level=cfg.analyze.ci_level, title=params.title)
display(Markdown(replication_summary(replication, stand_in)))

# %% [markdown]
# ## Assumptions
# Every choice the two papers leave open that this project makes (`data/reference/assumptions.csv`: value, params
# key, reason, what the paper says) beside this run's value of its key: `reports/pages/assumptions.html`. The rows
# R01–R04 declare how a published sentence is read (A06, A17–A19, B12, the TVD estimator): this run's value under
# the reading taken and under the alternative.

# %%
readings = alternative_readings(Run.load(reports, groups=cfg.groups, level=cfg.analyze.ci_level))
assumptions = build_assumptions(reports, cfg.model_dump(), cfg.profile, cfg.stand_ins(), ASSUMPTIONS_CSV,
                                 title=params.title, readings=readings, skipped=cfg.skipped())
display(Markdown(f"{len(assumptions)} assumptions listed in `reports/pages/assumptions.html`."))

# %%
index = build_index(reports, cfg, title=params.title, max_table_rows=params.max_table_rows,
                    level=cfg.analyze.ci_level, gallery=gallery)
headline = write_headline(reports, C.HEADLINE_METRICS)
metrics = json.loads(headline.read_text())
display(Markdown(f"Wrote `{index}` ({index.stat().st_size / 1024:.0f} KiB) and `{headline}` ({count(metrics)} numbers)."))
metrics
